"""Other paths end to end: continuous actions (Gaussian head), V-trace, policy-lag dropping."""

from __future__ import annotations

import math

import pytest

from .conftest import SMALL_ENV_FLAGS, read_summary, run_msf


def test_continuous_actions_pendulum(train_dir):
    """Pendulum-v1: 1-D Box actions through the Gaussian head; episodes are 200 steps, returns in [-1700, 0]."""
    r = run_msf(
        [
            "--env=Pendulum-v1",
            "--experiment=pend",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=256",
            "--encoder_mlp_layers",
            "64",
            "64",
            "--train_for_env_steps=20000",
            # every episode whole: no random steps before the first (they would shorten it)
            "--decorrelate_envs_on_one_worker=False",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "pend")
    assert s["status"] == "done"
    assert s["episode_length_mean"] == 200
    assert -1700 <= s["episode_return_mean"] <= 0
    # 100 episodes' worth of steps; episode stats travel every 0.25 s, so the last few may be unreported
    assert 0.8 * 20000 / 200 <= s["episodes"] <= 20000 / 200 + 8  # + envs that ran past the budget


def test_policy_lag_limit_drops_old_trajectories(train_dir):
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=lag",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_envs_per_worker=8",
            "--batch_size=128",
            "--max_policy_lag=1",
            "--encoder_mlp_layers",
            "32",
            "--train_for_env_steps=30000",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "lag")
    assert s["dropped_trajectories"] > 0
    assert s["policy_lag_max"] <= 1  # what was trained on respected the limit
    assert s["train_steps"] > 0


@pytest.mark.slow
def test_cartpole_learns_with_vtrace(train_dir):
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=vt",
            f"--train_dir={train_dir}",
            "--seed=0",
            "--with_vtrace=True",
            "--train_for_env_steps=300000",
            "--stop_at_return_mean=450",
            "--experiment_summaries_interval=1",
            *SMALL_ENV_FLAGS,
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "vt")
    assert s["episode_return_mean"] >= 450 and s["return_target_reached_at"] == s["env_steps"] <= 300_000, s
    assert math.isfinite(s["fps"])
