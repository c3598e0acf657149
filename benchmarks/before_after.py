"""Throughput of two source trees of msf side by side, in one run: did a change slow the pipeline down?

For each workload (the Sample Factory CartPole command line of ``throughput.py``, the same with the vector backend
at 2,048 envs per worker, and ``families.py``'s atari_pong and doom_basic), it measures each tree's

* sampler: the real rollout and inference workers with the real policy, no learning
  (``throughput.sampler_fps`` of that tree), env steps/s;
* training: ``python -m msf.train`` for ``--seconds``, steady-state frames/s (``families.steady_fps``: frames
  gained from the first to the last status line after ``--warmup``),

alternating the trees round by round (A B A B ...), so that a change of the machine's load hits both. The
table gives every round's figures and the ratio of the medians (new / baseline).

A tree is a checkout's root; its ``src/`` is put first on ``PYTHONPATH`` of every process it runs (the
children of a spawned process inherit it), so one virtual environment serves both.

Usage: python benchmarks/before_after.py --baseline /tmp/baseline [--new .] [--rounds 2] [--seconds 45]
       [--warmup 20] [--only cartpole cartpole_vector_2048 atari_pong doom_basic] [--no_sampler]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from families import MSF_STATUS, WORKLOADS, _run, steady_fps  # noqa: E402
from throughput import SF_CARTPOLE  # noqa: E402

FLAGS = {
    "cartpole": SF_CARTPOLE,
    # the vector backend with thousands of envs: each split finishes its trajectories at once
    "cartpole_vector_2048": [*SF_CARTPOLE, "--env_backend=vector", "--num_envs_per_worker=2048"],
    **{k: [*v, "--device=cpu"] for k, v in WORKLOADS.items()},
}


def _env_for(tree: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(tree, "src"), os.path.join(tree, "benchmarks")])
    return env


def sampler(tree: str, flags: list[str], seconds: float, warmup: float) -> float:
    """Env steps/s of ``tree``'s sampler (its own ``throughput.sampler_fps``), in a fresh interpreter."""
    code = (
        "import json, sys; from throughput import sampler_fps; "
        f"print(json.dumps(sampler_fps({flags!r}, {seconds!r}, {warmup!r})))"
    )
    with tempfile.TemporaryDirectory() as td:
        out = subprocess.run(
            [sys.executable, "-c", code], env=_env_for(tree), cwd=td, capture_output=True, text=True, check=True
        )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def training(tree: str, flags: list[str], seconds: float, warmup: float) -> float | None:
    """Steady-state training frames/s of ``tree``'s ``msf.train`` with ``flags``."""

    def parse(line: str, t: float):
        m = MSF_STATUS.search(line)
        return (t, int(m.group(1))) if m else None

    with tempfile.TemporaryDirectory() as td:
        cmd = [
            sys.executable,
            "-m",
            "msf.train",
            *flags,
            "--experiment=bench",
            f"--train_dir={td}",
            f"--train_for_seconds={int(seconds)}",
            "--experiment_summaries_interval=5",
            "--with_progress_bar=False",
            "--restart_behavior=overwrite",
        ]
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = _env_for(tree)["PYTHONPATH"]  # _run's child inherits this process's env
        try:
            rows, _ = _run(cmd, parse, seconds + 30, td)
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old
    return steady_fps(rows, warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="root of the baseline checkout")
    ap.add_argument("--new", default=os.path.dirname(HERE), help="root of the new checkout (default: this one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--sampler_seconds", type=float, default=15.0)
    ap.add_argument("--only", nargs="*", default=list(FLAGS), choices=list(FLAGS))
    ap.add_argument("--no_sampler", action="store_true")
    a = ap.parse_args()
    trees = {"baseline": os.path.abspath(a.baseline), "new": os.path.abspath(a.new)}
    results: dict = {}
    for name in a.only:
        for stage in ("sampler", "training") if not a.no_sampler else ("training",):
            for r in range(a.rounds):
                for label in ("baseline", "new") if r % 2 == 0 else ("new", "baseline"):
                    v: float | None
                    if stage == "sampler":
                        v = sampler(trees[label], FLAGS[name], a.sampler_seconds, 5.0)
                    else:
                        v = training(trees[label], FLAGS[name], a.seconds, a.warmup)
                    results.setdefault((name, stage), {}).setdefault(label, []).append(v)
                    print(f"{name:10s} {stage:8s} round {r} {label:8s} {v if v is None else round(v)}", flush=True)
    unit = {"sampler": "env steps/s", "training": "frames/s"}
    print("\n| workload | stage | baseline | new | new / baseline (medians) |\n|---|---|---|---|---|")
    for (name, stage), by in results.items():
        b = [x for x in by["baseline"] if x is not None]
        n = [x for x in by["new"] if x is not None]
        ratio = statistics.median(n) / statistics.median(b) if b and n else float("nan")
        fmt = ", ".join
        print(
            f"| {name} | {stage} ({unit[stage]}) | {fmt(f'{x:,.0f}' for x in b)} | {fmt(f'{x:,.0f}' for x in n)} "
            f"| {ratio:.3f} |"
        )


if __name__ == "__main__":
    main()
