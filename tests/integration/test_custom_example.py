"""The README's example of a custom environment with a custom encoder runs and learns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from .conftest import read_summary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env_and_model.py"


def test_custom_env_and_model_example(train_dir):
    r = subprocess.run([sys.executable, str(EXAMPLE), "--experiment=custom", f"--train_dir={train_dir}",
                        "--train_for_env_steps=60000", "--with_progress_bar=False", "--seed=0"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "custom")
    # the optimum is 1 - 5 x 0.01 = 0.95 (6 steps right); a random walk rarely reaches the goal in 50 steps
    assert s["episode_return_mean"] >= 0.7, s
    (ckpt,) = sorted((train_dir / "custom" / "checkpoint_p0").glob("checkpoint_*.pth"))[-1:]
    keys = torch.load(ckpt, weights_only=True)["model"].keys()
    assert "actor_encoder.skip.weight" in keys  # the custom encoder was trained, not the default MLP
