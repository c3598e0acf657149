"""Does a flag change how many env steps CartPole-v1 needs to a mean return? An interleaved A/B over many seeds.

For each seed (and repetition), runs arm A (the common flags) and arm B (the common flags plus ``--b``), one
after the other, alternating which goes first, so that the machine's drift falls on both alike. Each run is
``solve_cartpole.run_seed``: the env steps at which ``episode/return_mean`` (the job's last 100 episodes) first
reached the threshold, read from TensorBoard. Prints every run, then per arm the median, mean and standard
deviation, and the ratio of the medians B / A with a 95% bootstrap interval (resampling each arm's runs, 5,000
draws).

Asynchronous runs do not repeat (the same seed gives different steps on every run), so two arms need many runs
to be told apart: with a per-run spread of ~13% (2 groups x 256), 20 runs per arm bound the ratio of medians to
about +-6%.

Usage: python benchmarks/ab_cartpole.py --seeds 0 1 2 --reps 1 --common "--batch_size=256 --nproc_per_node=2"
       --b "--stop_at_return_mean=475"
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from solve_cartpole import run_seed  # noqa: E402

from msf.cfg.presets import SMALL_ENV_FLAGS  # noqa: E402


def ratio_interval(a: list[float], b: list[float], draws: int = 5000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of ``median(b) / median(a)``, resampling each list with replacement."""
    rng = random.Random(seed)
    rs = sorted(
        statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(a, k=len(a))) for _ in range(draws)
    )
    return rs[int(0.025 * draws)], rs[int(0.975 * draws) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--reps", type=int, default=1, help="runs per seed and arm")
    ap.add_argument("--threshold", type=float, default=475.0)
    ap.add_argument("--cap", type=float, default=150.0, help="seconds per run at most")
    ap.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    ap.add_argument("--common", default="", help="msf-train flags of both arms, after the small-env settings")
    ap.add_argument("--b", required=True, help="the flags arm B adds")
    a = ap.parse_args()
    common = SMALL_ENV_FLAGS + shlex.split(a.common)
    arms = {"A": common, "B": common + shlex.split(a.b)}
    steps: dict[str, list[float]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as td:
        k = 0
        for seed in a.seeds:
            for rep in range(a.reps):
                order = ("A", "B") if k % 2 == 0 else ("B", "A")
                k += 1
                for arm in order:
                    r = run_seed(seed, a.threshold, a.cap, a.steps, arms[arm], os.path.join(td, f"{arm}{seed}_{rep}"))
                    print(f"seed {seed} rep {rep} arm {arm}: env steps to {a.threshold:g} {r['env_steps']}", flush=True)
                    steps[arm].append(float("inf") if r["env_steps"] is None else float(r["env_steps"]))
    print(f"\nA: {' '.join(common)}\nB: A + {a.b}\n")
    print("| arm | runs | median | mean | sd |\n|---|---|---|---|---|")
    for arm, v in steps.items():
        finite = [x for x in v if x != float("inf")]
        sd = statistics.stdev(finite) if len(finite) > 1 else float("nan")
        print(f"| {arm} | {len(v)} | {statistics.median(v):,.0f} | {statistics.mean(finite):,.0f} | {sd:,.0f} |")
    lo, hi = ratio_interval(steps["A"], steps["B"])
    print(
        f"\nmedian B / median A: {statistics.median(steps['B']) / statistics.median(steps['A']):.3f} "
        f"(95% bootstrap interval {lo:.3f} to {hi:.3f})"
    )


if __name__ == "__main__":
    main()
