"""An experiment's life as a user lives it: stop and resume, a resumed run on another replica count,
changed flags on resume, the best checkpoint, evaluation with ``msf-enjoy`` and its video, ``msf-plot``."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from msf.cfg.config import Config
from msf.plot import read_curves

from .conftest import SMALL_ENV_FLAGS, msf_env, popen_msf, read_summary, run_msf, wait_until_training

SMALL_BATCH = next(int(f.split("=")[1]) for f in SMALL_ENV_FLAGS if f.startswith("--batch_size="))


def run_tool(module: str, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, env=msf_env()
    )


def test_interrupted_and_resumed_run_ends_within_one_batch_of_the_budget_with_continuous_curves(train_dir):
    budget = 150_000
    args = [
        "--env=CartPole-v1",
        "--experiment=life",
        f"--train_dir={train_dir}",
        f"--train_for_env_steps={budget}",
        "--save_every_sec=1000",
        *SMALL_ENV_FLAGS,
        "--encoder_mlp_layers",
        "64",
        "64",
    ]
    p = popen_msf(args)
    try:
        wait_until_training(train_dir / "life")
        import time

        time.sleep(2.0)
        assert p.poll() is None, "the run ended before the signal"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    s1 = read_summary(train_dir, "life")
    assert s1["status"] == "stopped" and 0 < s1["env_steps"] < budget
    stopped_at = s1["env_steps"]

    r = run_msf([*args, "--experiment_summaries_interval=1"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s2 = read_summary(train_dir, "life")
    assert s2["status"] == "done"
    assert budget <= s2["env_steps"] < budget + SMALL_BATCH  # like an uninterrupted run: < one global batch past
    assert s2["train_steps"] > s1["train_steps"] and s2["episodes"] > s1["episodes"]
    assert "resumed from" in (train_dir / "life" / "log.txt").read_text()

    # the curves: one point per summary, no overlap, and the resumed run continues where the first stopped
    curves = read_curves(str(train_dir / "life"))
    steps = curves["perf/fps"].steps
    assert np.all(np.diff(steps) > 0), steps
    assert stopped_at in steps  # the stopped run's last point is kept
    i = int(np.searchsorted(steps, stopped_at))
    before, after = np.diff(steps[: i + 1]), steps[i + 1] - stopped_at
    assert after <= 2 * before.max() + SMALL_BATCH, (steps, stopped_at)  # no gap larger than a summary interval's
    assert steps[-1] == s2["env_steps"]
    versions = curves["train/policy_version"]
    assert np.all(np.diff(versions.values) >= 0)  # the policy version continues too


def test_resume_on_another_replica_count_trains_on(train_dir):
    common = [
        "--env=CartPole-v1",
        "--experiment=rc",
        f"--train_dir={train_dir}",
        "--num_workers=2",
        "--num_envs_per_worker=4",
        "--batch_size=256",
        "--encoder_mlp_layers",
        "32",
    ]
    r = run_msf([*common, "--train_for_env_steps=20000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    s1 = read_summary(train_dir, "rc")
    assert s1["world_size"] == 1
    r = run_msf([*common, "--train_for_env_steps=40000", "--nproc_per_node=2"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s2 = read_summary(train_dir, "rc")
    assert s2["status"] == "done" and s2["world_size"] == 2
    assert 40000 <= s2["env_steps"] < 40000 + 2 * 256
    assert s2["train_steps"] > s1["train_steps"]
    log = (train_dir / "rc" / "log.txt").read_text()
    assert "[rank 1]" in log and log.count("resumed from") == 2  # both replicas loaded the global state


def test_flags_on_resume_override_with_a_warning_and_fixed_flags_are_refused(train_dir):
    exp = train_dir / "ov"
    exp.mkdir(parents=True)
    saved = Config(env="CartPole-v1", experiment="ov", train_dir=str(train_dir), learning_rate=3e-4, batch_size=512)
    (exp / "config.json").write_text(json.dumps(saved.to_dict()))
    r = run_msf(["--env=Pendulum-v1", "--experiment=ov", f"--train_dir={train_dir}"], timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("msf-train: error: --env: cannot change for the existing")
    r = run_msf(
        [
            "--experiment=ov",
            f"--train_dir={train_dir}",
            "--learning_rate=1e-3",
            "--num_workers=1",
            "--num_envs_per_worker=2",
            "--train_for_env_steps=2000",
            "--encoder_mlp_layers",
            "512",
            "512",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--learning_rate: 0.0003 -> 0.001" in r.stderr
    cfg = json.loads((exp / "config.json").read_text())
    assert cfg["learning_rate"] == 1e-3 and cfg["batch_size"] == 512  # overridden, and kept from the saved config
    # a changed lr is applied to a resumed run too, not the checkpoint's
    r = run_msf(
        ["--experiment=ov", f"--train_dir={train_dir}", "--learning_rate=2e-3", "--train_for_env_steps=4000"],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in (exp / "log.txt").read_text()
    assert read_curves(str(exp))["train/lr"].values[-1] == pytest.approx(2e-3)


def test_best_checkpoint_holds_the_best_mean_return(trained_cartpole):
    best = list((trained_cartpole / "checkpoint_p0").glob("best_*.pth"))
    assert len(best) == 1
    state = torch.load(best[0], weights_only=True)
    returns = read_curves(str(trained_cartpole))["episode/return_mean"].values
    assert state["best_metric"] == pytest.approx(float(returns.max()), rel=1e-6)  # TensorBoard keeps float32
    assert best[0].name.endswith(f"_reward_{state['best_metric']:.3f}.pth")


def test_enjoy_a_trained_agent_with_a_video(trained_cartpole):
    import imageio.v2 as imageio
    import imageio_ffmpeg

    exp = trained_cartpole
    r = run_tool(
        "msf.enjoy",
        [
            "--env=CartPole-v1",
            f"--experiment={exp.name}",
            f"--train_dir={exp.parent}",
            "--max_num_episodes=10",
            "--eval_deterministic=True",
            "--save_video=True",
            "--video_frames=120",
            "--video_name=ten.mp4",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((exp / "eval.json").read_text())
    assert ev["num_episodes"] == 10 and len(ev["episodes"]) == 10
    assert ev["return_mean"] == pytest.approx(np.mean([e["return"] for e in ev["episodes"]]))
    assert ev["return_mean"] >= 450, ev
    assert r.stdout.count("episode ") == 10 and f"return mean {ev['return_mean']:.2f}" in r.stdout
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(exp / "ten.mp4"))
    assert frames == ev["video_frames"] == 120
    first = imageio.get_reader(str(exp / "ten.mp4")).get_data(0)
    assert first.shape == (400, 600, 3) and first.std() > 10  # CartPole's 600x400 picture, not a blank frame


def test_enjoy_falls_back_from_a_truncated_checkpoint_and_loads_the_best(trained_cartpole, tmp_path):
    exp = tmp_path / "copy" / trained_cartpole.name
    shutil.copytree(trained_cartpole, exp)
    (older,) = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))[-1:]
    st = torch.load(older, weights_only=True)
    newer = exp / "checkpoint_p0" / f"checkpoint_{st['train_step'] + 1:09d}_{st['env_steps'] + 1}.pth"
    data = older.read_bytes()
    newer.write_bytes(data[: len(data) // 2])  # a checkpoint cut short
    base = ["--env=CartPole-v1", f"--experiment={exp.name}", f"--train_dir={exp.parent}", "--max_num_episodes=1"]
    r = run_tool("msf.enjoy", base)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((exp / "eval.json").read_text())["checkpoint"] == str(older)
    assert f"checkpoint {newer} is unreadable" in r.stderr
    # the broken file is kept aside, out of the rotation that would otherwise delete the good one
    assert not newer.exists() and newer.with_name(newer.name + ".bad").exists()
    r = run_tool("msf.enjoy", [*base, "--load_checkpoint_kind=best"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "/best_" in json.loads((exp / "eval.json").read_text())["checkpoint"]


def test_enjoy_bad_input_one_line_exit_2(tmp_path):
    r = run_tool("msf.enjoy", ["--experiment=nope", f"--train_dir={tmp_path}"])
    assert r.returncode == 2 and r.stderr.strip().startswith("msf-enjoy: error: --experiment: no experiment 'nope'")
    (tmp_path / "empty").mkdir()
    r = run_tool("msf.enjoy", ["--experiment=empty", f"--train_dir={tmp_path}"])
    assert r.returncode == 2 and "no readable latest checkpoint" in r.stderr
    (tmp_path / "empty" / "config.json").write_text(json.dumps(Config(env="CartPole-v1").to_dict()))
    r = run_tool("msf.enjoy", ["--experiment=empty", f"--train_dir={tmp_path}", "--env=Acrobot-v1"])
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "msf-enjoy: error: --env: the experiment 'empty' was trained with"
    )
    # counts that would play nothing are refused before anything is loaded, and eval.json is not touched
    for flag, value in (("max_num_episodes", 0), ("max_num_frames", -2), ("video_frames", 0)):
        r = run_tool("msf.enjoy", ["--experiment=empty", f"--train_dir={tmp_path}", f"--{flag}={value}"])
        assert r.returncode == 2 and r.stderr.strip() == (
            f"msf-enjoy: error: --{flag}: must be a positive integer, got {value}"
        ), r.stderr
    assert not (tmp_path / "empty" / "eval.json").exists()


def test_plot_of_a_real_run(trained_cartpole, tmp_path):
    from PIL import Image

    out = tmp_path / "curves.png"
    r = run_tool(
        "msf.plot",
        [f"--experiment={trained_cartpole.name}", f"--train_dir={trained_cartpole.parent}", f"--output={out}"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    img = Image.open(out)
    assert img.size == (1200, 800) and len(img.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 10


def test_wandb_offline_logs_the_summaries(train_dir, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'multi-sample-factory[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=wb",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--num_envs_per_worker=4",
            "--batch_size=256",
            "--train_for_env_steps=10000",
            "--with_wandb=True",
            "--wandb_tags",
            "a",
            "b",
            "--experiment_summaries_interval=1",
            "--encoder_mlp_layers",
            "32",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    exp = train_dir / "wb"
    run_id = (exp / "wandb_id.txt").read_text().strip()
    (run_file,) = (exp / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    data = run_file.read_bytes()
    # the run's records hold every scalar name and, as the last global_step, the final frame count
    for tag in (b"episode/return_mean", b"perf/fps", b"policy_lag/mean", b"global_step"):
        assert tag in data, tag
    assert str(read_summary(train_dir, "wb")["env_frames"]).encode() in data
