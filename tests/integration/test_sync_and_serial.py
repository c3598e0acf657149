"""``--async_rl=False`` and ``--serial_mode=True`` as a user runs them: ``msf-train`` on CartPole-v1."""

from __future__ import annotations

import json
import os

import pytest

from .conftest import SLACK_S, SMALL_ENV_FLAGS, msf_env, read_summary, run_msf

SHORT = [
    "--env=CartPole-v1",
    "--num_workers=2",
    "--num_envs_per_worker=4",
    "--rollout=32",
    "--batch_size=256",
    "--encoder_mlp_layers",
    "32",
    "--train_for_env_steps=6000",
]


def test_sync_mode_trains_every_sample_with_zero_policy_lag(train_dir):
    """2 workers x 4 envs x rollout 32 = one batch of 256 per round: with --async_rl=False the largest policy lag
    of any sample at its first SGD step, over the whole run, is 0; the same run asynchronous has a lag (which
    shows that the figure can see one)."""
    r = run_msf([*SHORT, "--experiment=sync", f"--train_dir={train_dir}", "--async_rl=False"], timeout=180 + SLACK_S)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "sync")
    assert s["status"] == "done" and s["async_rl"] is False and s["env_steps"] >= 6000
    assert s["policy_lag_max_run"] == 0.0 and s["policies"]["0"]["policy_lag_max_run"] == 0.0
    assert s["env_steps"] % 256 == 0 and s["dropped_trajectories"] == 0  # whole rounds, none dropped
    r = run_msf([*SHORT, "--experiment=async", f"--train_dir={train_dir}"], timeout=180 + SLACK_S)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "async")
    assert s["async_rl"] is True and s["policy_lag_max_run"] >= 1.0, s


def test_sync_mode_with_an_iteration_that_is_not_whole_rounds_is_refused(train_dir):
    r = run_msf([*SHORT, "--experiment=bad", f"--train_dir={train_dir}", "--async_rl=False", "--batch_size=96"], 60)
    assert r.returncode == 2
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("msf-train: error:")]
    assert line.startswith("msf-train: error: --async_rl: ") and "--batch_size=256" in line
    assert not (train_dir / "bad").exists()


def test_serial_mode_makes_every_env_in_the_device_groups_own_process(train_dir, tmp_path):
    """Two device groups, each serial: the 12 envs get the parallel run's job-wide indices (worker_index 0..3,
    env_index 0..11) and device groups, and none is made in a rollout worker process."""
    records = tmp_path / "env_configs"
    records.mkdir()
    env = msf_env()
    env["MSF_TEST_RECORD_DIR"] = str(records)
    r = run_msf(
        [
            "--env=msf_test_envs:MsfRecordingCartPole",
            "--experiment=serial2",
            f"--train_dir={train_dir}",
            "--serial_mode=True",
            "--nproc_per_node=2",
            "--num_workers=4",
            "--num_envs_per_worker=3",
            "--worker_num_splits=1",
            "--batch_size=96",
            "--encoder_mlp_layers",
            "16",
            "--train_for_env_steps=3000",
        ],
        timeout=180 + SLACK_S,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "serial2")
    assert s["status"] == "done" and s["serial_mode"] is True and s["world_size"] == 2
    seen = [json.loads((records / f).read_text()) for f in os.listdir(records)]
    made = [x for x in seen if "worker_index" in x and x.get("env_index") is not None and "device_group" in x]
    assert not [x for x in seen if "rollout_worker" in x["process"]]
    pairs = sorted((x["worker_index"], x["env_index"]) for x in made)
    assert pairs[-12:] == [(e // 3, e) for e in range(12)], pairs
    assert {x["worker_index"]: x["device_group"] for x in made} == {0: 0, 1: 0, 2: 1, 3: 1}


@pytest.mark.parametrize(
    "extra",
    [["--num_policies=2"], ["--use_rnn=True", "--rnn_size=16"], ["--async_rl=False", "--policy_workers_per_policy=2"]],
    ids=["two-policies", "gru", "sync-two-inference-workers"],
)
def test_serial_mode_combines_with_policies_models_and_sync(train_dir, extra):
    r = run_msf([*SHORT, "--experiment=comb", f"--train_dir={train_dir}", "--serial_mode=True", *extra], 180 + SLACK_S)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "comb")
    assert s["status"] == "done" and s["serial_mode"] is True and s["env_steps"] >= 6000
    assert s["num_policies"] == (2 if "--num_policies=2" in extra else 1)
    assert all(p["train_steps"] > 0 for p in s["policies"].values())
    if "--async_rl=False" in extra:
        assert s["policy_lag_max_run"] == 0.0


@pytest.mark.slow  # a learning run: the default suite keeps the shorter checks
def test_serial_mode_reaches_450_on_cartpole_within_300k_steps(train_dir):
    """The README's small-env settings in one process. With a fixed thread count a serial run repeats on one
    machine; over seeds 0-3 it first reached 475 at 77,824 / 95,232 / 74,752 / 149,504 env steps and ended at 500
    each (2026-12-02; before the settings took 4 SGD steps per iteration, seeds 1-4 ended at 390, 500, 468 and
    464): seed 2 is the one tested."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=serial_cartpole",
            f"--train_dir={train_dir}",
            "--serial_mode=True",
            *SMALL_ENV_FLAGS,
            "--train_for_env_steps=300000",
            "--stop_at_return_mean=450",
            "--experiment_summaries_interval=1",
            "--seed=2",
            "--learner_threads=1",
        ],
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "serial_cartpole")
    assert s["status"] == "done" and s["serial_mode"] is True
    assert s["episode_return_mean"] >= 450 and s["return_target_reached_at"] == s["env_steps"] <= 300_000, s


def test_a_failing_env_in_serial_mode_ends_the_run_with_its_traceback(train_dir):
    """An env that raises 2 s in: exit 1, status failed, and the log holds the env's own frame (the serial mode is
    for debugging: the failure happened in this process)."""
    env = msf_env()
    env["MSF_TEST_FAIL_AFTER_S"] = "2"
    r = run_msf(
        [
            *SHORT[1:],
            "--env=msf_test_envs:MsfFailingCartPole-v0",
            "--experiment=serial_fail",
            f"--train_dir={train_dir}",
            "--serial_mode=True",
            "--train_for_env_steps=10000000",
        ],
        timeout=120 + SLACK_S,
        env=env,
    )
    assert r.returncode == 1
    assert read_summary(train_dir, "serial_fail")["status"] == "failed"
    log = (train_dir / "serial_fail" / "log.txt").read_text()
    assert "Traceback" in log and "in step" in log and "msf_test_envs.py" in log
