"""An experiment's life as a user lives it: stop and resume, a resumed run on another replica count,
changed flags on resume, the best checkpoint, evaluation with ``msf-enjoy`` and its video, ``msf-plot``."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from msf.cfg.config import Config
from msf.plot import read_curves

from .conftest import SMALL_ENV_FLAGS, SMALL_ITERATION, msf_env, popen_msf, read_summary, run_msf, wait_until_training


def run_tool(module: str, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, env=msf_env()
    )


def test_interrupted_and_resumed_run_ends_within_one_batch_of_the_budget_with_continuous_curves(train_dir):
    # The first run's budget is out of reach, so that the SIGINT always finds it training however fast the
    # machine (a fast CI machine once finished an 80k budget before the signal landed); the resumed run is given
    # a budget 40k past where the first stopped, a changed flag that a resume accepts.
    args = [
        "--env=CartPole-v1",
        "--experiment=life",
        f"--train_dir={train_dir}",
        "--save_every_sec=1000",
        *SMALL_ENV_FLAGS,
        "--encoder_mlp_layers",
        "64",
        "64",
    ]
    p = popen_msf([*args, "--train_for_env_steps=100000000"])
    try:
        wait_until_training(train_dir / "life")
        time.sleep(2.0)
        assert p.poll() is None, "the run ended before the signal"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    s1 = read_summary(train_dir, "life")
    assert s1["status"] == "stopped" and s1["env_steps"] > 0
    stopped_at = s1["env_steps"]

    budget = stopped_at + 40_000
    r = run_msf([*args, f"--train_for_env_steps={budget}", "--experiment_summaries_interval=1"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s2 = read_summary(train_dir, "life")
    assert s2["status"] == "done"
    # like an uninterrupted run: less than one global iteration (batch_size x num_batches_per_epoch) past
    assert budget <= s2["env_steps"] < budget + SMALL_ITERATION
    assert s2["train_steps"] > s1["train_steps"] and s2["episodes"] > s1["episodes"]
    assert s2["resumed_from_env_steps"] == stopped_at

    # the curves: one point per summary, no overlap, and the resumed run continues where the first stopped
    curves = read_curves(str(train_dir / "life"))
    steps = curves["perf/fps"].steps
    assert np.all(np.diff(steps) > 0), steps
    assert stopped_at in steps  # the stopped run's last point is kept
    i = int(np.searchsorted(steps, stopped_at))
    before, after = np.diff(steps[: i + 1]), steps[i + 1] - stopped_at
    assert after <= 2 * before.max() + SMALL_ITERATION, (steps, stopped_at)  # no gap larger than a summary interval's
    assert steps[-1] == s2["env_steps"]
    versions = curves["train/policy_version"]
    assert np.all(np.diff(versions.values) >= 0)  # the policy version continues too


@pytest.mark.slow  # default-suite time (CI's slow suite runs it)
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
    assert (exp / "log.txt").read_text().count("--learning_rate: 0.0003 -> 0.001") == 1  # the log has it once
    cfg = json.loads((exp / "config.json").read_text())
    assert cfg["learning_rate"] == 1e-3 and cfg["batch_size"] == 512  # overridden, and kept from the saved config
    # a changed lr is applied to a resumed run too, not the checkpoint's
    before = read_summary(train_dir, "ov")["env_steps"]
    r = run_msf(
        ["--experiment=ov", f"--train_dir={train_dir}", "--learning_rate=2e-3", "--train_for_env_steps=4000"],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(train_dir, "ov")["resumed_from_env_steps"] == before
    assert read_curves(str(exp))["train/lr"].values[-1] == pytest.approx(2e-3)


def _experiment_with_a_checkpoint(train_dir, name: str, env_steps: int, **flags):
    """An experiment folder as a run of ``flags`` leaves it: config.json and one readable checkpoint at
    ``env_steps`` (made here, without training). Returns (folder, checkpoint path, command line)."""
    from msf.cfg.config import Derived
    from msf.envs.registry import env_config_of, env_spaces
    from msf.learning.learner import Learner
    from msf.persistence.checkpoint import save_checkpoint
    from msf.persistence.train_state import TrainState

    cfg = Config(env="CartPole-v1", experiment=name, train_dir=str(train_dir), **flags)
    exp = train_dir / name
    exp.mkdir(parents=True)
    (exp / "config.json").write_text(json.dumps(cfg.to_dict()))
    learner = Learner(cfg, Derived.of(cfg), env_spaces(cfg.env, env_config_of(cfg)), "cpu")
    state = TrainState.fresh(1, cfg.stats_avg)
    state.env_steps = env_steps
    path = save_checkpoint(state.capture(0, learner, cfg.to_dict(), 1), str(exp), keep=cfg.keep_checkpoints)
    args = [f"--experiment={name}", f"--train_dir={train_dir}"]
    return exp, Path(path), args


def _cut_short(path: Path, newer_by: int = 0) -> Path:
    """A copy of the checkpoint at ``path``, cut in half, ``newer_by`` train steps newer (0: in its place)."""
    st = torch.load(path, weights_only=True)
    out = path.with_name(f"checkpoint_{st['train_step'] + newer_by:09d}_{st['env_steps'] + newer_by}.pth")
    data = path.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    return out


def test_a_resume_whose_only_checkpoint_is_unreadable_is_refused_and_changes_nothing(train_dir):
    exp, ckpt, args = _experiment_with_a_checkpoint(train_dir, "only", 50_000, num_workers=1, num_envs_per_worker=2)
    _cut_short(ckpt)
    before = _files(exp)
    r = run_msf(args, timeout=60)
    assert r.returncode == 2, r.stderr[-3000:]  # not a silent start from step 0
    (line,) = r.stderr.strip().splitlines()  # one line: the file and why it cannot be read
    assert line.startswith("msf-train: error: --restart_behavior=resume: no checkpoint of 'only' is readable")
    assert re.search(re.escape(f"{ckpt} (") + r"\w+: \S", line), line  # with the reason, never an empty one
    assert "--restart_behavior=restart starts it anew" in line
    assert _files(exp) == before  # nothing renamed, nothing written (no log.txt, no config.json rewritten)


def test_a_resume_sets_an_unreadable_newest_checkpoint_aside_says_why_once_and_continues(train_dir):
    """Two ranks, one log line: msf-train reads the checkpoints before it spawns them."""
    flags = dict(num_workers=2, num_envs_per_worker=4, batch_size=256, encoder_mlp_layers=[32])
    exp, good, args = _experiment_with_a_checkpoint(train_dir, "aside", 1000, **flags)
    bad = _cut_short(good, newer_by=1)
    r = run_msf([*args, "--nproc_per_node=2", "--train_for_env_steps=3000"], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "aside")
    assert s["status"] == "done" and s["world_size"] == 2 and s["resumed_from_env_steps"] == 1000
    assert not bad.exists() and bad.with_name(bad.name + ".bad").exists()
    # the good checkpoint survives the rotation (--keep_checkpoints=2), which the broken, newer file would have won
    assert good.exists()
    log = (exp / "log.txt").read_text()
    expected = re.escape(f"checkpoint {bad} is unreadable (") + r"\w+: \S"  # with the reason
    assert len(re.findall(expected, log)) == 1 and len(re.findall(expected, r.stderr)) == 1, log
    assert f"set aside as {bad.name}.bad; resuming from {good}" in log


def test_the_summary_gives_the_current_lr_of_an_adaptive_schedule_beside_the_configured_one(trained_cartpole):
    """The run's kl_adaptive_epoch schedule (the small-env flags) moved the lr from --learning_rate=3e-4."""
    s = json.loads((trained_cartpole / "summary.json").read_text())["policies"]["0"]
    final = sorted((trained_cartpole / "checkpoint_p0").glob("checkpoint_*.pth"))[-1]
    lr = torch.load(final, weights_only=True)["lr"]
    assert s["hyperparameters"]["learning_rate"] == 3e-4  # as configured
    assert s["learning_rate_current"] == lr != 3e-4  # the optimiser's, as the final checkpoint holds it


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


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_enjoy_falls_back_from_a_truncated_checkpoint_leaves_it_in_place_and_loads_the_best(trained_cartpole, tmp_path):
    exp = tmp_path / "copy" / trained_cartpole.name
    shutil.copytree(trained_cartpole, exp)
    (older,) = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))[-1:]
    st = torch.load(older, weights_only=True)
    newer = exp / "checkpoint_p0" / f"checkpoint_{st['train_step'] + 1:09d}_{st['env_steps'] + 1}.pth"
    data = older.read_bytes()
    newer.write_bytes(data[: len(data) // 2])  # a checkpoint cut short
    (exp / "eval.json").unlink(missing_ok=True)
    before = _files(exp)
    base = ["--env=CartPole-v1", f"--experiment={exp.name}", f"--train_dir={exp.parent}", "--max_num_episodes=1"]
    r = run_tool("msf.enjoy", base)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((exp / "eval.json").read_text())["checkpoint"] == str(older)
    warning = f"checkpoint {newer} is unreadable ("
    assert warning in r.stderr and r.stderr.split(warning, 1)[1][0] != ")"  # with its reason
    # an evaluation reads: the user's files stay as they were (only msf-train sets a broken one aside)
    after = _files(exp)
    assert after.pop("eval.json") and after == before
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
    for flag, value, valid in (
        ("max_num_episodes", 0, "a positive integer"),
        ("max_num_frames", -2, "a positive integer"),
        ("video_frames", 0, "a positive integer, or -1 for the first episode"),
    ):
        r = run_tool("msf.enjoy", ["--experiment=empty", f"--train_dir={tmp_path}", f"--{flag}={value}"])
        assert r.returncode == 2 and r.stderr.strip() == (
            f"msf-enjoy: error: --{flag}: must be {valid}, got {value}"
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
