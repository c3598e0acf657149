"""``--env_backend=vector``: whole training runs on vector envs, and ale-py's ``AtariVectorEnv`` against the gymnasium
Atari path."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from msf.cfg.config import Config

from .conftest import SMALL_ENV_FLAGS, read_summary, run_msf, run_msf_together, write_untrained_checkpoint


def _flags(env: str, train_dir, experiment: str, *extra: str) -> list[str]:
    return [
        f"--env=msf_test_envs:{env}" if env.startswith("Msf") else f"--env={env}",
        "--env_backend=vector",
        f"--experiment={experiment}",
        f"--train_dir={train_dir}",
        *extra,
    ]


def test_five_step_episodes_train_exactly_in_every_autoreset_mode(train_dir):
    """A VectorEnv of 5-step episodes (the k-th step earns k) in each autoreset mode: every episode reported
    returns 15 in 5 steps (a reset step of next-step autoreset counted as a step would make 6), and the frames
    counted are the samples the learner took (its books close)."""
    modes = {"next": "MsfFiveStepNext", "same": "MsfFiveStepSame", "disabled": "MsfFiveStepDisabled"}
    common = ["--num_workers=1", "--num_envs_per_worker=8", "--worker_num_splits=2", "--rollout=8"]
    common += ["--batch_size=64", "--train_for_env_steps=2000", "--encoder_mlp_layers", "16", "--device=cpu"]
    runs = run_msf_together([_flags(env, train_dir, mode, *common) for mode, env in modes.items()], timeout=240)
    for mode, r in zip(modes, runs):
        assert r.returncode == 0, (mode, r.stderr[-3000:])
        s = read_summary(train_dir, mode)
        assert s["status"] == "done", (mode, s)
        assert s["episode_return_mean"] == 15.0 and s["episode_length_mean"] == 5.0, (mode, s)
        assert s["env_frames"] == s["env_steps"] >= 2000
        assert s["env_steps"] == s["env_steps_trained"] + s["env_steps_dropped"] + s["env_steps_discarded"], s


def test_synchronous_training_completes_its_iterations_when_autoresets_put_rows_out_of_step(train_dir):
    """``--async_rl=False`` on CartPole-v1's vector env (next-step autoreset, episodes of different lengths): every
    iteration completes (the rows that finished their trajectories wait without writing for the others), the learner
    trains on every frame with policy lag 0, and the budget is reached."""
    r = run_msf(
        _flags(
            "CartPole-v1",
            train_dir,
            "sync",
            "--async_rl=False",
            "--num_workers=1",
            "--num_envs_per_worker=16",
            "--worker_num_splits=2",
            "--rollout=16",
            "--batch_size=256",
            "--train_for_env_steps=8192",
            "--device=cpu",
        ),
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "sync")
    assert s["status"] == "done", s
    assert s["env_steps"] == s["env_steps_trained"] == 8192 and s["policy_lag_max"] == 0.0, s
    # the reset steps and the waiting rows' steps are env steps the learner did not train on
    assert s["env_step_calls"] > s["env_steps"], s


@pytest.mark.slow  # a learning run: the default suite keeps the shorter checks
def test_cartpoles_native_vector_env_trains(train_dir):
    """CartPole-v1's ``CartPoleVectorEnv`` (next-step autoreset, one numpy call for a split's envs) with the README's
    small-env settings: within 100k steps the mean return passes 150 (random play: ~22)."""
    r = run_msf(
        _flags(
            "CartPole-v1",
            train_dir,
            "cp",
            *SMALL_ENV_FLAGS,
            "--stop_at_return_mean=150",
            "--train_for_env_steps=100000",
            "--experiment_summaries_interval=1",
        ),
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "cp")
    assert s["status"] == "done" and s["return_target_reached_at"] is not None, s
    assert s["episode_return_mean"] >= 150


ALE_VECTOR = importlib.util.find_spec("ale_py") is not None and importlib.util.find_spec("ale_py.vector_env")


@pytest.mark.skipif(not ALE_VECTOR, reason="ale-py with its AtariVectorEnv (ale-py >= 0.10, extra [atari]) is missing")
@pytest.mark.parametrize("game, steps", [("atari_pong", 300), ("atari_breakout", 300)])
def test_ale_vector_observations_equal_the_gymnasium_paths(monkeypatch, game, steps):
    """The same seed and actions give the same observations, rewards and ends on ale-py's vector env as on the
    gymnasium path (AtariPreprocessing, frame stack), from the first step on, the frame stack of a new episode
    included: the emulator, the max-pooling and the resize are the same. Two differences remain and are left
    out here: the no-op starts (``ATARI_NOOP_MAX``, set to 0 here) draw their counts from different generators
    (the wrapper's numpy one, ALE's C++ one), and after a life loss (training's episodic life, not Pong's: no lives)
    msf's ``EpisodicLife`` takes a no-op step where ALE's vector env goes on from the frame of the loss: the games
    part there (checked on Breakout: equal up to the first life loss, different after)."""
    from msf.envs import families
    from msf.envs.vector import make_split

    monkeypatch.setattr(families, "ATARI_NOOP_MAX", 0)
    cfg = Config(env=game, decorrelate_envs_on_one_worker=False)
    gym_split = make_split(cfg, 0, [4], seed=3)
    vec_split = make_split(Config(env=game, env_backend="vector"), 0, [4], seed=3)
    try:
        np.testing.assert_array_equal(np.asarray(gym_split.reset()), vec_split.reset())
        rng = np.random.default_rng(0)
        for step in range(steps):
            a = rng.integers(int(gym_split.action_space.n), size=1)
            g_obs, g_rew, g_term, g_trunc = gym_split.step(a)
            v_obs, v_rew, v_term, v_trunc = vec_split.step(a)
            ended = bool(g_term[0] or g_trunc[0])
            assert (v_rew.tolist(), v_term.tolist(), v_trunc.tolist()) == (
                g_rew.tolist(),
                g_term.tolist(),
                g_trunc.tolist(),
            )
            if ended and game == "atari_breakout":  # a life lost: the last step both paths agree on
                assert step > 20
                g_obs, _, _, _ = gym_split.step(a)
                v_obs, _, _, _ = vec_split.step(a)
                assert not np.array_equal(np.asarray(g_obs), v_obs)
                return
            np.testing.assert_array_equal(np.asarray(g_obs), v_obs, err_msg=f"step {step}")
        assert game == "atari_pong", "no life was lost"
    finally:
        gym_split.close()
        vec_split.close()


@pytest.mark.slow
@pytest.mark.skipif(not ALE_VECTOR, reason="ale-py with its AtariVectorEnv (ale-py >= 0.10, extra [atari]) is missing")
def test_atari_trains_on_ales_vector_env(train_dir):
    r = run_msf(
        _flags(
            "atari_pong",
            train_dir,
            "pong",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--rollout=16",
            "--encoder_conv_mlp_layers",
            "64",
            "--train_for_env_steps=4000",
        ),
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "pong")
    assert s["status"] == "done" and s["env_frames"] == 4 * s["env_steps"] >= 4000


@pytest.mark.parametrize("env", ["MsfFiveStepNext", "MsfFiveStepSame", "MsfFiveStepDisabled"])
def test_enjoy_plays_a_name_registered_only_as_a_vector_env(env, tmp_path, capsys):
    """msf-enjoy on an experiment of a vector-only name (no register_env): it plays a vector env of one env, and
    each episode is the env's 5 steps earning 1 + 2 + 3 + 4 + 5, whatever the autoreset mode; a video is refused
    in one line."""
    import json

    from msf.enjoy import main as enjoy
    from msf.envs.registry import env_spaces

    cfg = Config(env=f"msf_test_envs:{env}", env_backend="vector", experiment="v", train_dir=str(tmp_path))
    write_untrained_checkpoint(cfg, env_spaces(cfg.env))
    args = ["--experiment=v", f"--train_dir={tmp_path}"]
    assert enjoy([*args, "--max_num_episodes=3", "--no_render"]) == 0
    assert json.load(open(tmp_path / "v" / "eval.json"))["episodes"] == [{"return": 15.0, "length": 5}] * 3
    capsys.readouterr()
    assert enjoy([*args, "--save_video=True"]) == 2
    assert capsys.readouterr().err == (
        f"msf-enjoy: error: --save_video: msf_test_envs:{env} is registered only as a vector env, which msf-enjoy does "
        "not render; leave it out\n"
    )
