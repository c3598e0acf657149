"""A slow environment's start-up is reported while it happens, and measured."""

from __future__ import annotations

import re

from .conftest import msf_env, read_summary, run_msf


def test_a_slow_env_start_is_reported_and_measured(train_dir):
    """Each env takes 5.5 s to make: the launcher's one (for the spaces) is said to on stderr, the rollout worker's
    two are reported in log.txt as they come, and summary.json says when all of them had started. Before, nothing
    was printed until the first status line (160 Doom games: 5 minutes of silence)."""
    env = msf_env()
    env["MSF_TEST_SLOW_START_S"] = "5.5"
    r = run_msf(
        [
            "--env=msf_test_envs:MsfSlowStartCartPole-v0",
            "--experiment=slow",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--num_envs_per_worker=2",
            "--batch_size=64",
            "--encoder_mlp_layers",
            "16",
            "--train_for_env_steps=2000",
        ],
        timeout=150,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "slow")
    assert s["envs_started_after_s"] >= 2 * 5.5, s["envs_started_after_s"]  # one after the other, in the worker
    assert "making one msf_test_envs:MsfSlowStartCartPole-v0 env to read its observation and action spaces" in r.stderr
    log = (train_dir / "slow" / "log.txt").read_text()
    assert re.search(r"starting the environments: [01] of 2 made, 0 started; 0 of 1 rollout worker\(s\) ready", log)
    assert "all 2 environments of 1 rollout worker(s) started" in log
