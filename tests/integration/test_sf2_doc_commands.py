"""Command lines from Sample Factory 2's documentation (basic usage, Atari, VizDoom, MuJoCo pages), with only the
budget shortened, run unchanged on msf-train, end with status done, and msf-enjoy with the same flags plays the
result. The family pages' lines are slow (8 to 16 rollout workers on 2 cores, 160 ViZDoom games): the slow suite."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from .conftest import msf_env, read_summary

# (the documentation's training line, the flags its evaluation line adds, the extra module it needs)
DOC_LINES = {
    "cartpole": (["--algo=APPO", "--env=CartPole-v1", "--experiment=CartPole"], ["--no_render"], None),
    "atari": (
        ["--algo=APPO", "--env=atari_breakout", "--experiment=Breakout"],
        ["--save_video", "--no_render", "--max_num_frames=400", "--video_frames=100"],
        "ale_py",
    ),
    "doom": (
        ["--env=doom_basic", "--experiment=DoomBasic", "--num_workers=16", "--num_envs_per_worker=10"],
        ["--save_video", "--no_render", "--max_num_frames=400", "--video_frames=100"],
        "vizdoom",
    ),
    "mujoco": (["--env=mujoco_ant", "--experiment=Ant"], ["--no_render", "--max_num_frames=2000"], "mujoco"),
}
BUDGET = {"cartpole": 20_000, "atari": 8192, "doom": 20_000, "mujoco": 8192}


def _run(module: str, args: list[str], cwd, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=msf_env()
    )


def _doc_line(name: str, tmp_path):
    train, enjoy, module = DOC_LINES[name]
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"no {module} here")
    td = tmp_path / "train_dir"
    budget = [f"--train_for_env_steps={BUDGET[name]}", f"--train_dir={td}", "--with_progress_bar=False"]
    r = _run("msf.train", [*train, *budget], tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    experiment = train[[a.startswith("--experiment=") for a in train].index(True)].split("=", 1)[1]
    s = read_summary(td, experiment)
    assert s["status"] == "done" and s["env_frames"] >= BUDGET[name]
    r = _run("msf.enjoy", [*train, *enjoy, f"--train_dir={td}", "--max_num_episodes=1"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((td / experiment / "eval.json").read_text())
    assert ev["env_frames"] > 0 and ev["checkpoint"]
    if "--save_video" in enjoy:
        # one frame at the reset and one per frame played after it, up to --video_frames; an episode that ends
        # first (a trained doom_basic agent can shoot the monster within 40 frames) ends the video with it
        assert ev["video_frames"] == min(100, ev["env_frames"]), ev
    return json.loads((td / experiment / "config.json").read_text())


def test_sample_factorys_basic_usage_line_trains_and_plays(tmp_path):
    cfg = _doc_line("cartpole", tmp_path)
    assert cfg["algo"] == "APPO"


@pytest.mark.slow
def test_sample_factorys_atari_line_trains_with_its_atari_settings(tmp_path):
    cfg = _doc_line("atari", tmp_path)
    sf_atari = {"encoder_conv_architecture": "convnet_atari", "num_workers": 8, "batch_size": 256, "rollout": 128}
    assert {k: cfg[k] for k in sf_atari} == sf_atari and cfg["async_rl"] is False and cfg["env_framestack"] == 4


@pytest.mark.slow
def test_sample_factorys_vizdoom_line_trains_with_its_doom_settings(tmp_path):
    cfg = _doc_line("doom", tmp_path)
    assert cfg["use_rnn"] is True and cfg["exploration_loss"] == "symmetric_kl" and cfg["num_workers"] == 16


@pytest.mark.slow
def test_sample_factorys_mujoco_line_trains_with_its_mujoco_settings(tmp_path):
    cfg = _doc_line("mujoco", tmp_path)
    assert cfg["encoder_mlp_layers"] == [64, 64] and cfg["kl_loss_coeff"] == 0.1 and cfg["adaptive_stddev"] is False
