"""``--env_backend=envpool``: one EnvPool per split of a rollout worker, with gymnasium's reset semantics.

Skipped, with the reason, where EnvPool is not installed (the README's setup installs it with [all];
EnvPool publishes wheels for x86-64 Linux only)."""

from __future__ import annotations

import importlib.util
import json
import sys

import gymnasium
import numpy as np
import pytest

from msf.cfg.config import Config
from msf.cfg.validation import ENVPOOL_CLASSIC, ConfigError

from .conftest import SMALL_ENV_FLAGS, read_summary, run_msf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None or importlib.util.find_spec("mujoco") is None,
    reason="envpool (extra [envpool]) or mujoco is not installed here: no wheel for this machine?",
)

from msf.envs.vector import check_backend, envpool_task, make_envpool, make_split  # noqa: E402


def test_task_names():
    assert envpool_task("atari_pong") == "Pong-v5"
    assert envpool_task("atari_space_invaders") == "SpaceInvaders-v5"
    assert envpool_task("mujoco_halfcheetah") == "HalfCheetah-v5"
    assert envpool_task("CartPole-v1") == "CartPole-v1"
    with pytest.raises(
        ConfigError,
        match=r"^--env_backend=envpool: serves atari_\* and mujoco_\* envs and CartPole-v0, .*, "
        r"Pendulum-v1 only, not 'FrozenLake-v1'",
    ):
        envpool_task("FrozenLake-v1")
    with pytest.raises(ConfigError, match="EnvPool has no Atari game 'atari_nosuch'"):
        envpool_task("atari_nosuch")


def test_missing_envpool_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'multi-sample-factory\[envpool\]'"):
        envpool_task("atari_pong")


def _hopper_reset_like(obs: np.ndarray) -> bool:
    """Hopper-v5's reset: qpos = init + U(-0.005, 0.005) (height 1.25, angles 0), qvel = U(-0.005, 0.005)."""
    return (
        abs(obs[0] - 1.25) <= 0.0051
        and bool(np.all(np.abs(obs[1:5]) <= 0.0051))
        and bool(np.all(np.abs(obs[5:]) <= 0.0051))
    )


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_the_observation_returned_with_an_episode_end_is_the_next_episodes_first(backend):
    """Hopper falls within tens of steps under random actions; a fallen hopper's observation is far from
    the reset distribution, so each end must come with a fresh first observation, from both backends."""
    # (no decorrelation steps: each first observation must be a reset one)
    cfg = Config(env="mujoco_hopper", env_backend=backend, decorrelate_envs_on_one_worker=False)
    split = make_split(cfg, 0, [0, 1, 2], seed=3)
    rng = np.random.default_rng(0)
    first = np.asarray(split.reset())
    assert first.shape == (3, 11) and all(_hopper_reset_like(o) for o in first)
    ends, lengths, t = 0, np.zeros(3, dtype=int), 0
    while ends < 6:
        obs, rew, term, trunc = split.step(rng.uniform(-1, 1, size=(3, 3)).astype(np.float32))
        obs = np.asarray(obs)
        assert obs.shape == (3, 11) and rew.dtype == np.float32 and rew.shape == term.shape == trunc.shape == (3,)
        lengths += 1
        for i in range(3):
            if term[i] or trunc[i]:
                assert _hopper_reset_like(obs[i]), (i, lengths[i], obs[i])
                assert lengths[i] > 1
                ends, lengths[i] = ends + 1, 0
            else:
                assert not _hopper_reset_like(obs[i]) or lengths[i] < 3  # it moved away from the start
        t += 1
        assert t < 2000
    split.close()


@pytest.mark.parametrize("size", [84, 64])
def test_atari_pool_matches_the_gymnasium_preprocessing(size):
    from msf.envs.registry import env_config_of, env_spaces

    cfg = Config(env="atari_pong", env_backend="envpool", atari_screen_size=size)
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    check_backend(cfg, spaces)  # same shapes and actions, or a ConfigError
    split = make_split(cfg, 0, [0, 1], seed=0)
    obs = split.reset()
    assert obs.shape == (2, 4, size, size) and obs.dtype == np.uint8 and obs.std() > 1
    rewards = []
    for _ in range(300):
        obs, rew, term, trunc = split.step(np.random.default_rng(0).integers(0, 6, size=2))
        rewards.extend(rew.tolist())
    assert set(rewards) <= {-1.0, 0.0, 1.0} and -1.0 in rewards  # clipped; random play concedes points
    split.close()


@pytest.mark.parametrize(
    "env, frameskip", [("atari_pong", 4), pytest.param("mujoco_hopper", 1, marks=pytest.mark.slow)]
)
def test_training_with_envpool_end_to_end(train_dir, env, frameskip):
    r = run_msf(
        [
            f"--env={env}",
            "--env_backend=envpool",
            "--experiment=ep",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--rollout=16",
            "--encoder_conv_mlp_layers",
            "64",
            "--encoder_mlp_layers",
            "64",
            "--train_for_env_steps=6000",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "ep")
    assert s["status"] == "done" and s["env_frames"] == frameskip * s["env_steps"]
    # the run ends within the iteration that spends the budget (the families' defaults: 4 minibatches of 128)
    batches = json.loads((train_dir / "ep" / "config.json").read_text())["num_batches_per_epoch"]
    assert 6000 <= s["env_frames"] < 6000 + 128 * batches * frameskip
    if env == "mujoco_hopper":
        assert s["episodes"] > 20 and s["episode_return_mean"] is not None  # short episodes were counted


def test_envpool_for_another_family_is_one_line_exit_2(tmp_path):
    r = run_msf(
        ["--env=MiniGrid-Empty-5x5-v0", "--env_backend=envpool", "--experiment=x", f"--train_dir={tmp_path}"],
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "msf-train: error: --env_backend=envpool: serves atari_* and mujoco_* envs and "
        + ", ".join(ENVPOOL_CLASSIC)
        + " only, not 'MiniGrid-Empty-5x5-v0'; use --env_backend=gymnasium"
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("env", ENVPOOL_CLASSIC)
def test_classic_control_pools_have_gymnasiums_spaces_and_episode_limits(env):
    from msf.envs.registry import env_config_of, env_spaces

    cfg = Config(env=env, env_backend="envpool")
    check_backend(cfg, env_spaces(env, env_config_of(cfg)))  # a ConfigError names what differs
    pool = make_envpool(cfg, 1, 0)
    assert pool.spec.config.max_episode_steps == gymnasium.spec(env).max_episode_steps
    pool.close()


def test_a_balanced_cartpole_is_truncated_at_500_and_a_fallen_one_terminated():
    """Gymnasium's CartPole-v1 ends a balanced episode at step 500 as a truncation (bootstrapped with
    ``--value_bootstrap``) and a fallen pole (|angle| > 12 degrees) as a termination; EnvPool's must do the same,
    each end coming with the next episode's first observation (gymnasium's reset: every component in
    [-0.05, 0.05])."""
    split = make_split(Config(env="CartPole-v1", env_backend="envpool"), 0, [0, 1], seed=5)
    obs = split.reset()
    lengths, ends = np.zeros(2, dtype=int), []
    for _ in range(1200):
        # env 0: a linear controller that balances the pole; env 1: always push right (falls in ~10 steps)
        balance = int(obs[0, 2] + 0.5 * obs[0, 3] + 0.05 * obs[0, 0] + 0.1 * obs[0, 1] > 0)
        obs, rew, term, trunc = split.step(np.array([balance, 1], dtype=np.int32))
        assert rew.tolist() == [1.0, 1.0]  # every step of CartPole-v1 earns 1, the ending one too
        lengths += 1
        for i in np.nonzero(term | trunc)[0]:
            assert np.all(np.abs(obs[i]) <= 0.05), obs[i]
            ends.append((int(i), int(lengths[i]), bool(term[i]), bool(trunc[i])))
            lengths[i] = 0
    assert [e for e in ends if e[0] == 0] == [(0, 500, False, True), (0, 500, False, True)]
    fallen = [e for e in ends if e[0] == 1]
    assert len(fallen) > 50 and all(term and not trunc and 5 <= n <= 20 for _, n, term, trunc in fallen)
    split.close()


@pytest.mark.slow
def test_batched_sampling_solves_cartpole_with_envpool(train_dir):
    """Sample Factory's ``--batched_sampling=True`` on CartPole-v1 steps each split as one EnvPool, and the
    README's small-env settings still reach a mean return of 475 (gymnasium's threshold for solved) within
    300k env steps (with the gymnasium backend they reach it at ~80k: benchmarks/HISTORY.md)."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--batched_sampling=True",
            "--experiment=cp",
            f"--train_dir={train_dir}",
            *SMALL_ENV_FLAGS,
            "--stop_at_return_mean=475",
            "--train_for_env_steps=300000",
            "--experiment_summaries_interval=1",
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((train_dir / "cp" / "config.json").read_text())["env_backend"] == "envpool"
    s = read_summary(train_dir, "cp")
    assert s["status"] == "done" and s["return_target_reached_at"] is not None, s
    assert s["episode_return_mean"] >= 475 and s["env_steps"] <= 300_000 + 1024
