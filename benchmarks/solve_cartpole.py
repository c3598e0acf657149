"""Time and env steps for msf-train to reach a mean return on CartPole-v1, over several seeds.

Each run trains for ``--steps`` env steps (at most ``--cap`` seconds); the mean return at the
end is reported too.

Runs ``msf-train`` as a user would (a subprocess, start-up included) with summaries every
second, then reads the TensorBoard curve ``episode/return_mean`` (mean of the last 100
episodes) and reports, per seed, the first env step and the wall time since the command's
start at which it reached the threshold.

Usage: python benchmarks/solve_cartpole.py [--seeds 0 1 2] [--threshold 475] [--cap 120] [-- extra msf-train flags]
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

from msf.cfg.presets import SMALL_ENV_FLAGS


def first_crossing(tb_dir: str, threshold: float) -> tuple[int | None, float | None, float | None, float | None]:
    """(env step, wall time of the event, best value, lowest value after it) of the first
    ``episode/return_mean`` >= threshold; the last is None when it never reached it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    if "episode/return_mean" not in acc.Tags()["scalars"]:
        return None, None, None, None
    events = acc.Scalars("episode/return_mean")
    best = max(e.value for e in events)
    for i, e in enumerate(events):
        if e.value >= threshold:
            return e.step, e.wall_time, best, min(x.value for x in events[i:])
    return None, None, best, None


def run_seed(seed: int, threshold: float, cap: float, steps: int, flags: list[str], train_dir: str) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "msf-train")
    cmd = [
        exe,
        "--env=CartPole-v1",
        f"--experiment=solve_s{seed}",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
        f"--seed={seed}",
        "--device=cpu",
        f"--train_for_seconds={int(cap)}",
        f"--train_for_env_steps={steps}",
        "--experiment_summaries_interval=1",
        "--with_progress_bar=False",
        *flags,
    ]
    t0 = time.time()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    step, wall, best, low_after = first_crossing(os.path.join(train_dir, f"solve_s{seed}", "tensorboard"), threshold)
    with open(os.path.join(train_dir, f"solve_s{seed}", "summary.json")) as f:
        final = json.load(f)["episode_return_mean"]
    return {
        "seed": seed,
        "env_steps": step,
        "seconds": None if wall is None else wall - t0,
        "best": best,
        "low_after": low_after,
        "final": final,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threshold", type=float, default=475.0)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds per run at most")
    ap.add_argument("--steps", type=int, default=300_000, help="env steps per run")
    ap.add_argument("--defaults", action="store_true", help="msf-train defaults instead of the small-env settings")
    ap.add_argument("extra", nargs="*", help="more msf-train flags (after --)")
    a = ap.parse_args()
    flags = ([] if a.defaults else SMALL_ENV_FLAGS) + a.extra
    print("flags:", " ".join(flags))
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for s in a.seeds:
            r = run_seed(s, a.threshold, a.cap, a.steps, flags, td)
            rows.append(r)
            fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            print(
                f"seed {s}: reached {a.threshold:g} at env step {fmt(r['env_steps'], 'd')}, "
                f"{fmt(r['seconds'], '.1f')} s from launch; mean return at the end ({a.steps} steps) "
                f"{fmt(r['final'], '.1f')}, lowest after reaching it {fmt(r['low_after'], '.1f')}",
                flush=True,
            )
    finals = [r["final"] for r in rows]
    print(f"final mean return: median {statistics.median(finals):.1f}, min {min(finals):.1f}")
    solved = [r for r in rows if r["env_steps"] is not None]
    if len(solved) == len(rows):
        print(
            f"median: {statistics.median(r['seconds'] for r in rows):.1f} s, "
            f"{statistics.median(r['env_steps'] for r in rows):.0f} env steps"
        )
    else:
        print(f"{len(rows) - len(solved)} of {len(rows)} seeds did not reach {a.threshold:g}")


if __name__ == "__main__":
    main()
