"""Runs that went on, or ended, without saying what happened (issue 39): a run that never trained, frames dropped
in silence, a second Ctrl-C that left no summary.json."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from msf.train import UNTRAINED_EXIT

from .conftest import SLACK_S, SMALL_ENV_FLAGS, popen_msf, read_summary, run_msf, wait_until_training


def test_a_run_whose_batch_never_fills_ends_untrained_with_its_own_exit_code(train_dir):
    """A batch of a million samples cannot fill in 8 s: the run used to end with status done, exit 0."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=untrained",
            f"--train_dir={train_dir}",
            *SMALL_ENV_FLAGS,
            "--batch_size=1048576",
            "--num_batches_to_accumulate=0",
            "--train_for_seconds=8",
        ],
        timeout=60 + SLACK_S,
    )
    assert r.returncode == UNTRAINED_EXIT, (r.returncode, r.stderr[-3000:])
    s = read_summary(train_dir, "untrained")
    assert (s["status"], s["train_steps"], s["last_checkpoint"]) == ("untrained", 0, None), s
    assert s["policies"]["0"]["batch_seconds"] > 8, s["policies"]["0"]
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("msf-train: untrained")]
    assert "untrained: the run ended before any batch filled" in (train_dir / "untrained" / "log.txt").read_text()
    assert "--batch_size=1048576" in line and "--num_workers" in line, line


def test_a_high_dropped_share_is_warned_about_and_kept_in_the_summary(train_dir):
    """Sixteen epochs move the policy 32 versions an iteration: with --max_policy_lag=1 nearly every trajectory is
    dropped as too old. It was counted, and nothing said so."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=dropped",
            f"--train_dir={train_dir}",
            *SMALL_ENV_FLAGS,
            "--num_envs_per_worker=64",  # 128 trajectories sampled for every 32 an iteration trains on
            "--num_epochs=16",
            "--max_policy_lag=1",
            "--train_for_env_steps=40000",
        ],
        timeout=120 + SLACK_S,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "dropped")
    assert s["status"] == "done" and s["dropped_trajectories"] > 0, s
    assert s["policies"]["0"]["dropped_share_warned"] > 0.5, s["policies"]["0"]
    log = (train_dir / "dropped" / "log.txt").read_text()
    (warning,) = [ln for ln in log.splitlines() if "were dropped as older than --max_policy_lag" in ln]
    for flag in ("--num_epochs=16", "--num_batches_per_epoch", "--num_batches_to_accumulate"):
        assert flag in warning, warning


def test_a_second_ctrl_c_leaves_a_summary_that_says_interrupted(train_dir):
    """The second Ctrl-C exits at once (130), as documented; before, it left no summary.json at all."""
    exp: Path = train_dir / "sig2"
    p = popen_msf(
        [
            "--env=msf_test_envs:MsfSlowCloseCartPole-v0",
            "--experiment=sig2",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--save_every_sec=1",
            "--train_for_env_steps=100000000",
            "--encoder_mlp_layers",
            "32",
        ]
    )
    try:
        wait_until_training(exp)
        deadline = time.monotonic() + 30 + SLACK_S
        while not list(exp.glob("checkpoint_p0/checkpoint_*.pth")) and time.monotonic() < deadline:
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        time.sleep(0.2)  # two signals in the same instant are delivered as one
        p.send_signal(signal.SIGINT)
        p.wait(timeout=5)  # the clean stop would take 5 s or more (the stop's grace: the envs' close takes 8 s)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, p.returncode
    s = read_summary(train_dir, "sig2")
    assert s["status"] == "interrupted", s["status"]
    assert s["last_checkpoint"] is not None and Path(s["last_checkpoint"]).exists(), s["last_checkpoint"]
    assert s["last_checkpoint"] == s["policies"]["0"]["last_checkpoint"]
