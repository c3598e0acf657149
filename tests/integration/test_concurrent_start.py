"""Invariant 2 of DESIGN.md: replicas join their process group concurrently; a missing one is named."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import msf_env

JOIN = re.compile(r"\[rank (\d+)\].*joined the process group: entered ([\d.]+) left ([\d.]+)")
# msf-train, with one rank started late when MSF_TEST_LATE_RANK=RANK:SECONDS is set
LATE_RANK_TRAIN = Path(__file__).resolve().parents[1] / "helpers" / "late_rank_train.py"


def _run(train_dir, name: str, n: int, extra: list[str], late: str | None = None, timeout: float = 180):
    env = msf_env()
    env.pop("MSF_TEST_LATE_RANK", None)
    if late:
        env["MSF_TEST_LATE_RANK"] = late
    return subprocess.run(
        [
            sys.executable,
            str(LATE_RANK_TRAIN),
            "--device=cpu",
            "--with_progress_bar=False",
            "--env=CartPole-v1",
            f"--experiment={name}",
            f"--train_dir={train_dir}",
            f"--nproc_per_node={n}",
            f"--num_workers={n}",
            "--num_envs_per_worker=2",
            "--batch_size=64",
            "--encoder_mlp_layers",
            "16",
            "--train_for_env_steps=2000",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _joins(train_dir, name: str) -> dict[int, tuple[float, float]]:
    text = (train_dir / name / "log.txt").read_text()
    return {int(r): (float(a), float(b)) for r, a, b in JOIN.findall(text)}


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_all_replicas_enter_before_any_leaves(train_dir, n):
    r = _run(train_dir, f"start{n}", n, [])
    assert r.returncode == 0, r.stderr[-3000:]
    joins = _joins(train_dir, f"start{n}")
    assert sorted(joins) == list(range(n))
    assert max(a for a, _ in joins.values()) <= min(b for _, b in joins.values())


@pytest.mark.slow  # 16 s on 2 cores
def test_a_late_replica_is_waited_for_and_released_at_once(train_dir):
    r = _run(train_dir, "late", 2, ["--dist_timeout=60"], late="1:5")
    assert r.returncode == 0, r.stderr[-3000:]
    joins = _joins(train_dir, "late")
    late_enter = joins[1][0]
    assert late_enter - joins[0][0] >= 4.5  # rank 1 really was late
    assert joins[0][1] - late_enter <= 1.0  # and rank 0 left initialisation within 1 s of its arrival


def test_a_replica_that_never_joins_is_named(train_dir):
    """The error names the missing rank, the rendezvous (host:port) and the flag, in one line; the traceback
    behind it goes to log.txt only (it was printed to the terminal too)."""
    r = _run(train_dir, "missing", 2, ["--dist_timeout=3"], late="1:30", timeout=60)
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert re.search(
        r"rank\(s\) \[1\] did not join the rendezvous at 127\.0\.0\.1:\d+ within --dist_timeout=3 s", line
    ), line
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "Traceback" in (train_dir / "missing" / "log.txt").read_text()
