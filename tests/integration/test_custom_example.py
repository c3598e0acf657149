"""The example of a custom environment with a custom encoder (docs/getting-started.md) runs and learns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import read_summary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env_and_model.py"


def test_custom_env_and_model_example(train_dir):
    r = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--experiment=custom",
            f"--train_dir={train_dir}",
            "--train_for_env_steps=60000",
            "--with_progress_bar=False",
            "--seed=0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "custom")
    # the optimum is 1 - 5 x 0.01 = 0.95 (6 steps right). A uniformly random policy reaches the goal within
    # 50 steps 71% of the time, for a mean return of 0.40 (simulated, 20,000 episodes).
    assert s["episode_return_mean"] >= 0.85, s
    # the most likely action is "right" in every cell: msf-enjoy's greedy episodes are all optimal
    env = dict(os.environ, PYTHONPATH=str(EXAMPLE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            "--experiment=custom",
            f"--train_dir={train_dir}",
            "--eval_deterministic=True",
            "--max_num_episodes=3",
            "--no_render",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "custom" / "eval.json").read_text())
    assert [(e["return"], e["length"]) for e in ev["episodes"]] == [(pytest.approx(0.95), 6)] * 3, ev
    (ckpt,) = sorted((train_dir / "custom" / "checkpoint_p0").glob("checkpoint_*.pth"))[-1:]
    keys = torch.load(ckpt, weights_only=True)["model"].keys()
    assert "actor_encoder.skip.weight" in keys  # the custom encoder was trained, not the default MLP
