"""Sample Factory 2's Python API on msf (msf.sf2): the example launch script, written in Sample Factory's style
with its registrations in main(), trains its own env with its own encoder and flags, and enjoy(cfg) plays it; a
launch script's env that fails in the workers is named with its exception."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import msf_env, read_summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sf2_launch_script.py"


def _script(*args: str, cwd: Path, script: Path = EXAMPLE, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=msf_env()
    )


def test_the_launch_script_trains_its_env_and_enjoy_plays_it(tmp_path):
    train_dir = tmp_path / "train_dir"
    common = ["--env=beacon", "--experiment=beacon", f"--train_dir={train_dir}", "--with_progress_bar=False"]
    r = _script(*common, "--train_for_env_steps=60000", "--seed=0", "--beacon_episode_len=16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "beacon")
    # a random policy earns half of an episode's steps; the example's docstring promises nearly all after 60,000
    # steps (the mean of the last 100 training episodes, with sampled actions: 17.6 of 20 measured, 88%)
    assert s["status"] == "done" and s["episode_return_mean"] >= 12.0, s["episode_return_mean"]
    cfg = json.loads((train_dir / "beacon" / "config.json").read_text())
    # the script's set_defaults, its own flag and its encoder reached the run
    assert (cfg["batch_size"], cfg["learning_rate"], cfg["encoder_custom"]) == (256, 1e-3, "sf2_encoder")
    assert cfg["env_args"] == {"beacon_episode_len": 16}
    # enjoy(cfg) without the script's flag: the saved 16, as Sample Factory restores a saved config
    r = _script(*common, "--enjoy", "--max_num_episodes=2", "--eval_deterministic", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "beacon" / "eval.json").read_text())
    assert [e["length"] for e in ev["episodes"]] == [16, 16]
    # with the flag given: the env made in msf-enjoy sees the new value (cfg.beacon_episode_len)
    enjoy = ["--enjoy", "--max_num_episodes=4", "--eval_deterministic", "--beacon_episode_len=12"]
    r = _script(*common, *enjoy, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "beacon" / "eval.json").read_text())
    assert ev["num_episodes"] == 4 and all(e["length"] == 12 for e in ev["episodes"])
    assert ev["return_mean"] >= 11.0  # of 12: the trained policy reads the beacon
    # enjoy(cfg) returns (status, mean return) as Sample Factory's does; the script prints the mean
    assert f"mean return {ev['return_mean']}" in r.stdout.splitlines()
    # a resume without the flag keeps the saved value too
    r = _script(*common, "--train_for_env_steps=64000", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((train_dir / "beacon" / "config.json").read_text())["env_args"] == {"beacon_episode_len": 16}


FAILING = """
import multiprocessing, sys
import gymnasium as gym
from msf.sf2 import parse_full_cfg, parse_sf_args, register_env, run_rl

def make(full_env_name, cfg, env_config, render_mode=None):
    if multiprocessing.current_process().name != "MainProcess":  # the launcher reads the spaces; workers fail
        raise RuntimeError("the license server is unreachable")
    return gym.make("CartPole-v1")

def main():
    register_env("licensed", make)
    parser, _ = parse_sf_args()
    return run_rl(parse_full_cfg(parser))

if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.mark.parametrize("groups", [1, pytest.param(2, marks=pytest.mark.slow)])  # 9 s; one group in the default suite
def test_an_env_failing_in_the_workers_is_named_with_its_exception(tmp_path, groups):
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    args = ["--env=licensed", "--experiment=f", f"--train_dir={tmp_path / 'td'}", "--device=cpu"]
    r = _script(
        *args, f"--num_workers={groups}", f"--nproc_per_node={groups}", cwd=tmp_path, script=script, timeout=180
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("msf-train: a device group failed: ")
    assert "rollout_worker_0" in last and "RuntimeError: the license server is unreachable" in last


LAMBDA = """
import sys
import gymnasium as gym
from msf.sf2 import parse_full_cfg, parse_sf_args, register_env, run_rl

def main():
    register_env("lam", lambda full_env_name, cfg, env_config, render_mode=None: gym.make("CartPole-v1"))
    parser, _ = parse_sf_args()
    return run_rl(parse_full_cfg(parser))

if __name__ == "__main__":
    sys.exit(main())
"""


def test_a_maker_that_cannot_reach_the_workers_is_named_at_registration_and_in_the_failure(tmp_path):
    """A lambda registered in main() does not pickle, so the workers never get it (Sample Factory's scripts have
    the same limit): register_env warns at once, and the run's last line names that cause, not "unknown
    environment"."""
    script = tmp_path / "lam.py"
    script.write_text(LAMBDA)
    args = ["--env=lam", "--experiment=l", f"--train_dir={tmp_path / 'td'}", "--device=cpu", "--num_workers=1"]
    r = _script(*args, cwd=tmp_path, script=script, timeout=180)
    assert r.returncode == 1
    assert "register_env('lam', ...): main.<locals>.<lambda> does not pickle" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "environment 'lam' is not registered in this process" in last and "could not be sent" in last, last


def test_the_api_parses_like_sample_factory(tmp_path, monkeypatch):
    from msf import sf2

    monkeypatch.chdir(tmp_path)
    parser, partial = sf2.parse_sf_args(["--env=beacon", "--batch_size=512", "--own=3"])
    assert partial.batch_size == 512  # the flags known so far; --own comes with the script's own arguments
    parser.add_argument("--own", type=int, default=1)
    parser.set_defaults(rnn_size=128)
    cfg = sf2.parse_full_cfg(parser, ["--env=beacon", "--batch_size=512", "--own=3"])
    assert (cfg.env, cfg.batch_size, cfg.own, cfg.rnn_size, cfg.algo) == ("beacon", 512, 3, 128, "APPO")
    ours, extra, given = sf2._split(cfg, set())
    assert extra == {"own": 3}
    # a flag on the command line and a script's changed default count as given: a family's defaults yield to both
    assert {"env", "batch_size", "rnn_size", "env_args:own"} <= given and "gamma" not in given
    with pytest.raises(SystemExit) as e:
        sf2.parse_full_cfg(parser, ["--env=beacon", "--num_worker=2"])
    assert e.value.code == 2
    assert os.listdir(tmp_path) == []  # nothing written
