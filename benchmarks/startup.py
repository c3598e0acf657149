"""Start-up cost of two source trees side by side: seconds from the command to the end of a short run, and from
spawning the workers until every env has started, for several numbers of rollout workers, in one run, the trees
alternating round by round (made for the fork server: workers forked from a process that imported torch once,
against each started by ``spawn``, which imports torch anew).

Each run is ``msf-train --env=CartPole-v1 --train_for_env_steps=2048`` (2 SGD steps: the run is nearly all
start-up and shutdown) with ``--num_workers=N``, started as a user would (a subprocess). Reported per tree and
worker count: the median over ``--rounds`` of the command's wall time and of ``envs_started_after_s`` from the
run's ``summary.json`` (spawning the workers until every env has made its first reset). A tree's ``src/`` goes
first on ``PYTHONPATH`` (as in ``before_after.py``), so one virtual environment serves both.

Usage: python benchmarks/startup.py --baseline /tmp/baseline [--new .] [--workers 2 8] [--rounds 3]
(``git worktree add /tmp/baseline <commit>`` makes a baseline tree.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TREES = ("new", "baseline")


def one_run(workers: int, tree: str, train_dir: str, name: str) -> tuple[float, float | None]:
    """(Wall seconds of the command, its ``envs_started_after_s``) of one 2,048-step CartPole run of ``tree``."""
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "src"))
    cmd = [
        sys.executable,
        "-m",
        "msf.train",
        "--env=CartPole-v1",
        f"--experiment={name}",
        f"--train_dir={train_dir}",
        "--train_for_env_steps=2048",
        f"--num_workers={workers}",
        "--device=cpu",
        "--with_progress_bar=False",
    ]
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{tree} x {workers} workers failed:\n{r.stderr[-2000:]}")
    with open(os.path.join(train_dir, name, "summary.json")) as f:
        return wall, json.load(f).get("envs_started_after_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the root of the baseline tree")
    ap.add_argument("--new", default=".", help="the root of the new tree")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    walls: dict[tuple[int, str], list[float]] = {}
    starts: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as td:
        for r in range(a.rounds):
            for w in a.workers:
                for which in TREES if r % 2 == 0 else TREES[::-1]:
                    tree = a.new if which == "new" else a.baseline
                    wall, started = one_run(w, tree, td, f"{which}_{w}_{r}")
                    walls.setdefault((w, which), []).append(wall)
                    if started is not None:
                        starts.setdefault((w, which), []).append(started)
                    after = "-" if started is None else f"{started:.2f}"
                    print(f"round {r} workers {w} {which:8s} wall {wall:5.1f} s, envs started after {after} s")
    print(
        "\n| rollout workers | command, new (s) | command, baseline (s) | new / baseline | "
        "envs started after, new (s) | envs started after, baseline (s) |"
    )
    print("|---|---|---|---|---|---|")
    med = statistics.median
    for w in a.workers:
        f, s = med(walls[(w, "new")]), med(walls[(w, "baseline")])
        sf = med(starts.get((w, "new"), [float("nan")]))
        ss = med(starts.get((w, "baseline"), [float("nan")]))
        print(f"| {w} | {f:.1f} | {s:.1f} | {f / s:.2f} | {sf:.1f} | {ss:.1f} |")


if __name__ == "__main__":
    main()
