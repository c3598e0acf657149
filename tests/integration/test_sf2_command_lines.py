"""Sample Factory 2.1.1's command lines that msf-train refuses, run as a process: exit code 2 and one line, which
names the flag meant for a near miss."""

from __future__ import annotations

import subprocess
import sys


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "msf.train", *args], capture_output=True, text=True, timeout=120)


def test_a_near_miss_names_the_flag_meant():
    r = _train("--num_worker=2")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert "--num_worker: did you mean --num_workers?" in r.stderr
    r = _train("--no_such_flag_at_all=1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "did you mean" not in r.stderr


def test_only_appo_is_an_algorithm():
    r = _train("--algo=PPO")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--algo" in r.stderr and "APPO" in r.stderr


def test_abbreviations_are_refused_and_a_near_miss_is_named():
    """Sample Factory's argparse takes unique prefixes; msf does not (a prefix changes meaning when a flag is added):
    the near miss is named instead."""
    r = _train("--learning_r=0.1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unrecognized arguments: --learning_r=0.1" in r.stderr
