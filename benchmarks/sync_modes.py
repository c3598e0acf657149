"""What synchronous, serial and deterministic runs cost: training frames/s of each mode against the default
(asynchronous, worker processes), in one run, modes alternating round by round.

Modes: ``async`` (the default), ``sync`` (``--async_rl=False``), ``deterministic`` (``--deterministic=True``:
sync, one split per inference batch, an action generator per env, 1 learner thread), ``serial``
(``--serial_mode=True``, asynchronous). Workloads: the Sample Factory CartPole line of ``throughput.py`` with
its batch raised to one rollout of every env (2 x 20 x 32 = 1280, which the sync mode needs; the same batch in
every mode), and ``families.py``'s atari_pong and doom_basic (whose iterations already are whole rollouts).
Each figure is steady-state frames/s (``families.steady_fps``), the table gives each mode's median and its
ratio to ``async``'s, measured in the same run.

Usage: python benchmarks/sync_modes.py [--rounds 1] [--seconds 40] [--warmup 15]
       [--only cartpole atari_pong doom_basic] [--modes async sync deterministic serial]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from before_after import training  # noqa: E402
from families import WORKLOADS  # noqa: E402
from throughput import SF_CARTPOLE  # noqa: E402

FLAGS = {
    "cartpole": [*[f for f in SF_CARTPOLE if not f.startswith("--batch_size=")], "--batch_size=1280"],
    **{k: [*v, "--device=cpu"] for k, v in WORKLOADS.items()},
}
MODES = {
    "async": [],
    "sync": ["--async_rl=False"],
    "deterministic": ["--deterministic=True"],
    "serial": ["--serial_mode=True"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--only", nargs="*", default=list(FLAGS), choices=list(FLAGS))
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    a = ap.parse_args()
    tree = os.path.dirname(HERE)
    results: dict[str, dict[str, list[float]]] = {}
    for name in a.only:
        for r in range(a.rounds):
            order = a.modes if r % 2 == 0 else a.modes[::-1]
            for mode in order:
                v = training(tree, [*FLAGS[name], *MODES[mode]], a.seconds, a.warmup)
                print(f"{name:10s} round {r} {mode:13s} {v if v is None else round(v)}", flush=True)
                if v is not None:
                    results.setdefault(name, {}).setdefault(mode, []).append(v)
    print("\n| workload | " + " | ".join(f"{m} (frames/s)" for m in a.modes) + " | ratios to async |")
    print("|---" * (len(a.modes) + 2) + "|")
    for name, by in results.items():
        med = {m: statistics.median(by[m]) for m in a.modes if by.get(m)}
        base = med.get("async")
        cells = " | ".join(f"{med[m]:,.0f}" if m in med else "n/a" for m in a.modes)
        ratios = ", ".join(f"{m} {med[m] / base:.2f}" for m in a.modes if m != "async" and m in med and base)
        print(f"| {name} | {cells} | {ratios} |")


if __name__ == "__main__":
    main()
