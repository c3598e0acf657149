"""A slow environment's start-up is reported while it happens, and measured."""

from __future__ import annotations

import re

import pytest

from .conftest import msf_env, read_summary, run_msf


@pytest.mark.slow  # default-suite time (CI's slow suite runs it)
def test_a_slow_env_start_is_reported_and_measured(train_dir, tmp_path):
    """Each env takes 5.5 s to make: the launcher's one (for the spaces) is said to on stderr, with how to save it,
    the rollout worker's two are reported in log.txt as they come, and summary.json says when all of them had
    started. Before, nothing was printed until the first status line (160 Doom games: 5 minutes of silence)."""
    env = msf_env()
    env["MSF_TEST_SLOW_START_S"] = "5.5"
    env["MSF_TEST_CONSTRUCTIONS"] = str(tmp_path / "made.txt")
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
    assert "msf.envs.declare_spaces, where the env is registered, saves this" in r.stderr
    # its spaces undeclared, the env is made once more than the run uses: in the launcher, before the workers
    assert sorted((tmp_path / "made.txt").read_text().split()) == [
        "MainProcess",
        "rollout_worker_0",
        "rollout_worker_0",
    ]
    log = (train_dir / "slow" / "log.txt").read_text()
    assert re.search(r"starting the environments: [01] of 2 made, 0 started; 0 of 1 rollout worker\(s\) ready", log)
    assert "all 2 environments of 1 rollout worker(s) started" in log


def test_declared_spaces_spare_the_launcher_its_env(train_dir, tmp_path):
    """The same slow env (2.5 s to make) with its spaces declared (msf.envs.declare_spaces): msf-train reads them
    without making one, so the run makes its 2 envs and no third. Before, the launcher always made one more in its
    own process: one constructor's time more before the workers were even spawned."""
    env = msf_env()
    env["MSF_TEST_SLOW_START_S"] = "2.5"
    made = tmp_path / "made.txt"
    env["MSF_TEST_CONSTRUCTIONS"] = str(made)
    r = run_msf(
        [
            "--env=msf_test_envs:MsfDeclaredSlowStartCartPole-v0",
            "--experiment=declared",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--num_envs_per_worker=2",
            "--batch_size=64",
            "--encoder_mlp_layers",
            "16",
            "--train_for_env_steps=1000",
        ],
        timeout=150,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(train_dir, "declared")["status"] == "done"
    assert made.read_text().split() == ["rollout_worker_0", "rollout_worker_0"]  # the run's own 2, nothing else
    assert "to read its observation and action spaces" not in r.stderr


@pytest.mark.slow  # 15 s on 2 cores
def test_a_temp_folder_too_long_for_the_fork_servers_socket_still_trains(train_dir, tmp_path):
    """A TMPDIR of ~100 characters (a cluster job's folder): the fork server's Unix socket path would be too long
    (every child failed to start: "AF_UNIX path too long"), so the workers are spawned instead."""
    long_tmp = tmp_path / ("t" * max(1, 100 - len(str(tmp_path))))
    long_tmp.mkdir()
    assert len(str(long_tmp)) >= 100
    env = msf_env()
    env["TMPDIR"] = str(long_tmp)
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=longtmp",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--train_for_env_steps=2000",
        ],
        timeout=180,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "longtmp")
    assert s["status"] == "done" and s["env_steps"] >= 2000


@pytest.mark.slow  # 10 s on 2 cores
def test_the_start_up_of_many_envs_on_one_worker_is_measured(train_dir):
    """64 envs on one worker (rollout 32), decorrelated: summary.json says how long the start-up took, from spawning
    the workers to the first training step (``startup_s``), which comes after every env had started. Before, only
    the envs' start was measured, not their decorrelation steps (with Sample Factory's j x rollout: 64,512 random
    steps here, now 16,128)."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=many",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--num_envs_per_worker=64",
            "--rollout=32",
            "--batch_size=2048",
            "--encoder_mlp_layers",
            "16",
            "--train_for_env_steps=4000",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "many")
    assert s["train_steps"] >= 1
    assert 0 < s["envs_started_after_s"] <= s["startup_s"] <= s["wall_seconds"], s
