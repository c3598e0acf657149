"""``--env_backend=envpool``: one EnvPool per split of a rollout worker, with gymnasium's reset semantics.

Skipped, with the reason, where EnvPool is not installed (the README's setup installs it with [all];
EnvPool publishes wheels for x86-64 Linux only)."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError

from .conftest import read_summary, run_msf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None or importlib.util.find_spec("mujoco") is None,
    reason="envpool (extra [envpool]) or mujoco is not installed here: no wheel for this machine?",
)

from msf.envs.vector import EnvPoolSplit, GymSplit, check_envpool, envpool_task  # noqa: E402


def test_task_names():
    assert envpool_task("atari_pong") == "Pong-v5"
    assert envpool_task("atari_space_invaders") == "SpaceInvaders-v5"
    assert envpool_task("mujoco_halfcheetah") == "HalfCheetah-v5"
    with pytest.raises(
        ConfigError, match=r"^--env_backend=envpool: serves atari_\* and mujoco_\* envs only, not 'CartPole-v1'"
    ):
        envpool_task("CartPole-v1")
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


@pytest.mark.parametrize("backend", [EnvPoolSplit, GymSplit], ids=["envpool", "gymnasium"])
def test_the_observation_returned_with_an_episode_end_is_the_next_episodes_first(backend):
    """Hopper falls within tens of steps under random actions; a fallen hopper's observation is far from
    the reset distribution, so each end must come with a fresh first observation, from both backends."""
    # (no decorrelation steps: each first observation must be a reset one)
    cfg = Config(
        env="mujoco_hopper",
        env_backend="envpool" if backend is EnvPoolSplit else "gymnasium",
        decorrelate_envs_on_one_worker=False,
    )
    split = backend(cfg, 0, [0, 1, 2], seed=3)
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


def test_atari_pool_matches_the_gymnasium_preprocessing():
    from msf.envs.registry import env_config_of, env_spaces

    cfg = Config(env="atari_pong", env_backend="envpool")
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    check_envpool(cfg, spaces)  # same shapes and actions, or a ConfigError
    split = EnvPoolSplit(cfg, 0, [0, 1], seed=0)
    obs = split.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and obs.std() > 1
    rewards = []
    for _ in range(300):
        obs, rew, term, trunc = split.step(np.random.default_rng(0).integers(0, 6, size=2))
        rewards.extend(rew.tolist())
    assert set(rewards) <= {-1.0, 0.0, 1.0} and -1.0 in rewards  # clipped; random play concedes points
    split.close()


@pytest.mark.parametrize("env, frameskip", [("atari_pong", 4), ("mujoco_hopper", 1)])
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
    r = run_msf(["--env=CartPole-v1", "--env_backend=envpool", "--experiment=x", f"--train_dir={tmp_path}"], timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "msf-train: error: --env_backend=envpool: serves atari_* and mujoco_* envs only, "
        "not 'CartPole-v1'; use --env_backend=gymnasium"
    )
    assert not (tmp_path / "x").exists()
