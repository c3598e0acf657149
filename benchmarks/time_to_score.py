"""Wall time from the command's start to a score, over several seeds: msf-train as a user runs it.

Each run is ``msf-train --env=ENV [flags] --seed=S --stop_at_return_mean=SCORE --train_for_seconds=CAP``, one at a
time, nothing else started by this script beside it. Per run: the frames at which the mean return of the last 100
episodes first reached the score (``summary.json``'s ``return_target_reached_at``, in env frames: steps x 4 for
the pixel families), the wall time from launching the command until it exited (start-up and the final checkpoint
included: what a user waits for), the frames/s over the run, and the mean policy lag of the last summary. Then
the median over the seeds. A preset changes the work per sample, so presets are compared on this wall time,
never on frames/s.

``--preset atari_small`` runs ``msf.cfg.presets.ATARI_SMALL_MACHINE_FLAGS``; ``--preset families`` runs
``msf.cfg.presets.SF_ATARI_FLAGS`` (families.py's atari_pong flags: Sample Factory's Atari arguments as msf flags);
more msf-train flags after ``--`` are added to either and win.

Usage: python benchmarks/time_to_score.py [--env atari_pong] [--score 15] [--preset atari_small] [--seeds 0 1 2]
       [--cap 1500] [-- extra msf-train flags]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from msf.cfg.presets import ATARI_SMALL_MACHINE_FLAGS, SF_ATARI_FLAGS  # noqa: E402

PRESETS = {
    "atari_small": ATARI_SMALL_MACHINE_FLAGS,
    "families": SF_ATARI_FLAGS,
}


def run_to_score(env: str, flags: list[str], seed: int, score: float, cap: float, train_dir: str) -> dict:
    """One msf-train run to ``score`` or ``cap`` seconds of training; its figures (see the module docstring)."""
    exe = os.path.join(os.path.dirname(sys.executable), "msf-train")
    cmd = [
        exe,
        f"--env={env}",
        *flags,
        f"--seed={seed}",
        f"--experiment=s{seed}",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
        f"--stop_at_return_mean={score}",
        f"--train_for_seconds={int(cap)}",
        "--with_progress_bar=False",
        "--device=cpu",
    ]
    t0 = time.time()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.time() - t0
    with open(os.path.join(train_dir, f"s{seed}", "summary.json")) as f:
        s = json.load(f)
    return {
        "seed": seed,
        "reached_at": s.get("return_target_reached_at"),
        "wall_s": wall,
        "frames": s["env_frames"],
        "fps": s["fps"],
        "final": s.get("episode_return_mean"),
        "lag": s.get("policy_lag_mean"),
        "status": s.get("status"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="atari_pong")
    ap.add_argument("--score", type=float, default=15.0)
    ap.add_argument("--preset", default="atari_small", choices=sorted(PRESETS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cap", type=float, default=1500.0, help="seconds of training per run at most")
    ap.add_argument("--keep", default=None, help="keep the runs in this folder (default: a temporary one)")
    ap.add_argument("extra", nargs="*", help="more msf-train flags (after --)")
    a = ap.parse_args()
    flags = PRESETS[a.preset] + a.extra
    print("flags:", " ".join(flags), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as td:
        root = a.keep or td
        for seed in a.seeds:
            r = run_to_score(a.env, flags, seed, a.score, a.cap, root)
            rows.append(r)
            print(
                f"seed {seed}: {r['status']}, {a.score:g} reached at {r['reached_at']} frames, "
                f"{r['wall_s']:.0f} s from launch to exit, {r['fps']:.0f} frames/s, "
                f"final mean return {r['final']:.1f}, policy lag {r['lag']:.1f}",
                flush=True,
            )
    print(f"\n| seed | frames to {a.score:g} | wall s (launch to exit) | frames/s | mean return at the end |")
    print("|---|---|---|---|---|")
    for r in rows:
        reached = "not reached" if r["reached_at"] is None else f"{r['reached_at']:,}"
        print(f"| {r['seed']} | {reached} | {r['wall_s']:.0f} | {r['fps']:.0f} | {r['final']:.1f} |")
    if all(r["reached_at"] is not None for r in rows):
        print(
            f"| median | {statistics.median(r['reached_at'] for r in rows):,.0f} | "
            f"{statistics.median(r['wall_s'] for r in rows):.0f} | | |"
        )


if __name__ == "__main__":
    main()
