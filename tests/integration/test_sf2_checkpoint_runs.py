"""A Sample Factory 2.1.1 experiment folder of ``tests/data/sf2`` under msf-enjoy and msf-train, run as processes:
msf-enjoy plays it, msf-train resumes it and writes its own files beside Sample Factory's, which stay byte for byte
(the conversion itself: tests/unit/test_sf2_checkpoint.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from unit.test_sf2_checkpoint import _copy, _files  # tests/ is on sys.path (rootdir)

from msf.persistence.checkpoint import list_checkpoints

CONVERTED = "converted the Sample Factory 2.1.1 checkpoint"


def test_msf_enjoy_plays_a_sample_factory_experiment(tmp_path):
    folder = _copy("mlp", tmp_path)
    before = _files(folder)
    argv = ["--experiment=mlp", f"--train_dir={tmp_path}", "--max_num_episodes=1", "--device=cpu"]
    r = subprocess.run([sys.executable, "-m", "msf.enjoy", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if CONVERTED in x]
    assert "checkpoint_000000010_1280.pth" in line
    assert json.loads((folder / "eval.json").read_text())["num_episodes"] == 1
    after = _files(folder)
    assert {k: after[k] for k in before} == before and set(after) - set(before) == {"eval.json"}


def test_msf_train_resumes_a_sample_factory_experiment_beside_its_files(tmp_path):
    folder = _copy("mlp", tmp_path)
    before = _files(folder)
    argv = [
        "--experiment=mlp",
        f"--train_dir={tmp_path}",
        "--device=cpu",
        "--serial_mode=True",
        "--num_workers=1",
        "--num_envs_per_worker=2",
        "--worker_num_splits=1",
        "--batch_size=64",
        "--train_for_env_steps=1600",
        "--keep_checkpoints=1",
        "--with_progress_bar=False",
    ]
    r = subprocess.run([sys.executable, "-m", "msf.train", *argv], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if CONVERTED in x]
    assert "Adam's moments of 8 tensors carried over" in line
    after = _files(folder)
    assert {k: after[k] for k in before} == before  # Sample Factory's files, config.json among them, as they were
    assert json.loads((folder / "msf_config.json").read_text())["batch_size"] == 64
    newest = list_checkpoints(str(folder))[-1]
    state = torch.load(newest, weights_only=True)
    assert state["msf_version"] and state["policy_version"] > 10 and state["env_steps"] >= 1600
    assert state["optimizer"]["state"], "Adam's moments went on from Sample Factory's"
    # resumed again: from msf's own checkpoint and msf_config.json (batch_size 64 kept), Sample Factory's files spared
    # by the keep-1 rotation, which removes msf's older one
    argv = [a for a in argv if not a.startswith(("--batch_size", "--train_for_env_steps"))]
    r = subprocess.run(
        [sys.executable, "-m", "msf.train", *argv, "--train_for_env_steps=2000"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert CONVERTED not in r.stderr and "--batch_size" not in r.stderr
    again = _files(folder)
    assert {k: again[k] for k in before} == before
    mine = [Path(p).name for p in list_checkpoints(str(folder)) if Path(p).name != "checkpoint_000000010_1280.pth"]
    assert len(mine) == 1 and mine[0] != Path(newest).name
