"""msf-train end to end on CartPole-v1: learning, what a run leaves, frame counting, resume."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import (
    SLACK_S,
    SMALL_ENV_FLAGS,
    SMALL_ITERATION,
    SMALL_SGD_STEPS,
    first_step_reaching,
    read_summary,
    run_msf,
)

SUMMARY_KEYS = {
    "env_steps",
    "env_frames",
    "wall_seconds",
    "fps",
    "train_steps",
    "episodes",
    "episode_return_mean",
    "policy_lag_mean",
    "world_size",
    "status",
}


def _train_cartpole(train_dir, seed: int, steps: int = 300_000) -> dict:
    exp = f"cartpole_s{seed}"
    r = run_msf(
        [
            "--env=CartPole-v1",
            f"--experiment={exp}",
            f"--train_dir={train_dir}",
            f"--seed={seed}",
            f"--train_for_env_steps={steps}",
            *SMALL_ENV_FLAGS,
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return read_summary(train_dir, exp)


def test_cartpole_reaches_450_within_300k_steps(trained_cartpole):
    exp = trained_cartpole
    s = json.loads((exp / "summary.json").read_text())
    assert SUMMARY_KEYS <= s.keys()
    assert s["status"] == "done"
    # stops less than one training iteration (batch_size x num_batches_per_epoch samples) past the budget
    assert 300_000 <= s["env_steps"] < 300_000 + SMALL_ITERATION
    assert s["env_frames"] == s["env_steps"]
    assert s["episode_return_mean"] >= 450, s
    assert s["train_steps"] == s["policy_version"] > 0
    # every counted sample was trained on: env steps are counted per iteration taken, and each took its SGD steps
    assert s["env_steps"] % SMALL_ITERATION == 0
    assert s["train_steps"] == s["env_steps"] // SMALL_ITERATION * SMALL_SGD_STEPS
    assert s["world_size"] == 1
    assert json.loads((exp / "config.json").read_text())["env"] == "CartPole-v1"
    ckpts = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert 1 <= len(ckpts) <= 2
    state = torch.load(ckpts[-1], weights_only=True)
    assert state["env_steps"] == s["env_steps"] and state["train_step"] == s["train_steps"]
    assert list((exp / "tensorboard").glob("events.out.tfevents.*"))
    assert "frames" in (exp / "log.txt").read_text()


def test_frameskip_counts_frames_and_resume_continues(train_dir):
    common = [
        "--env=CartPole-v1",
        "--experiment=fs",
        f"--train_dir={train_dir}",
        "--num_workers=1",
        "--num_envs_per_worker=2",
        "--batch_size=128",
        "--env_frameskip=4",
        "--encoder_mlp_layers",
        "32",
    ]
    r = run_msf([*common, "--train_for_env_steps=20000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    s1 = read_summary(train_dir, "fs")
    # the budget counts frames: 20000 frames are 5000 agent steps
    assert s1["env_frames"] == 4 * s1["env_steps"]
    assert 5000 <= s1["env_steps"] < 5000 + 128 + 2 * 32  # stops at the first iteration past the budget
    r = run_msf([*common, "--train_for_env_steps=40000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    s2 = read_summary(train_dir, "fs")
    assert s2["resumed_from_env_steps"] == s1["env_steps"] and s1["resumed_from_env_steps"] is None
    assert 10000 <= s2["env_steps"] < 10000 + 128 + 2 * 32
    assert s2["train_steps"] > s1["train_steps"]
    assert s2["episodes"] > s1["episodes"]
    # the same command again: the budget is spent, nothing runs, the finished run's summary is kept
    r = run_msf([*common, "--train_for_env_steps=40000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(train_dir, "fs") == s2
    assert "already spent: nothing to do" in (train_dir / "fs" / "log.txt").read_text()


def test_a_budget_below_one_iteration_trains_that_iteration_and_saves_it(train_dir):
    """A budget smaller than one iteration (here 1,000 env steps against 2 x 4 envs x 128 = 1,024): the run takes
    that iteration, trains on it (1 epoch x 2 minibatches: 2 SGD steps) and saves it. It used to stop before
    training, with 0 SGD steps and no checkpoint, so msf-enjoy then found nothing to play."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=tiny",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--rollout=128",
            "--batch_size=512",
            "--num_batches_per_epoch=2",
            "--train_for_env_steps=1000",
            "--encoder_mlp_layers",
            "16",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "tiny")
    assert (s["status"], s["env_steps"], s["train_steps"]) == ("done", 1024, 2), s
    (ckpt,) = (train_dir / "tiny" / "checkpoint_p0").glob("checkpoint_*.pth")
    state = torch.load(ckpt, weights_only=True)
    assert (state["env_steps"], state["train_step"]) == (1024, 2)


@pytest.mark.parametrize(
    "extra",
    # two groups' agreed stop (17 s) runs with -m slow; test_data_parallel's Ctrl-C test stops two groups at one
    # iteration in the default suite
    [[], pytest.param(["--nproc_per_node=2", "--batch_size=256"], marks=pytest.mark.slow)],
    ids=["one-group", "two-groups"],
)
def test_stop_at_return_mean_ends_the_run_at_the_first_summary_that_reaches_it(train_dir, extra):
    """--stop_at_return_mean=150 with a budget of 300k steps (CartPole reaches 150 in ~30-60k with these settings):
    the run ends "done" at the first summary whose mean return is >= 150 (TensorBoard's first such point is its
    last step, every earlier point is below), every rank at the same iteration, with a checkpoint of that step."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=target",
            f"--train_dir={train_dir}",
            "--seed=1",
            "--train_for_env_steps=300000",
            "--experiment_summaries_interval=1",
            "--stop_at_return_mean=150",
            *SMALL_ENV_FLAGS,
            *extra,
        ],
        timeout=180 + SLACK_S,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "target")
    assert s["status"] == "done" and s["world_size"] == (2 if extra else 1)
    assert s["episode_return_mean"] >= 150 and s["env_steps"] < 300_000
    assert s["return_target_reached_at"] == s["env_steps"] == first_step_reaching(train_dir / "target", 150.0)
    assert s["train_steps"] == s["env_steps"] // SMALL_ITERATION * SMALL_SGD_STEPS  # its last iteration trained
    ckpt = sorted((train_dir / "target" / "checkpoint_p0").glob("checkpoint_*.pth"))[-1]
    assert torch.load(ckpt, weights_only=True)["env_steps"] == s["env_steps"]
