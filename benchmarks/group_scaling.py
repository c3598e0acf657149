"""Sample efficiency of N device groups against one: env steps to a mean return on CartPole-v1.

For each seed, runs (interleaved, so that the machine's drift falls on every configuration alike):

- ``async 1x512``: the README's small-env settings, one device group, ``--batch_size=512``;
- ``async 2x256``: the same on ``--nproc_per_node=2`` at ``--batch_size=256`` (the same global batch and the
  same 32 envs);
- ``det 1x512`` / ``det 2x256``: the same pair with ``--deterministic=True`` (a synchronous iteration is the whole
  rollout of each group's envs: 32 envs x 32 steps = 1,024 = 512 x 2 minibatches; per group of two, 16 x 32 =
  256 x 2).

and prints, per configuration, the env steps at which ``episode/return_mean`` (the job's last
``--stats_avg`` episodes) first reached the threshold, the median over the seeds, its ratio to the
one-group run of the same mode, the median seconds from launch to the threshold, and the mean policy lag over the
run (TensorBoard ``policy_lag/mean``). Extra msf-train flags after ``--`` apply to every configuration: with
``--stop_at_return_mean=475`` each run stops where it is measured.

Usage: python benchmarks/group_scaling.py [--seeds 0 1 2 3 4] [--threshold 475] [--modes async det]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from solve_cartpole import run_seed  # noqa: E402

from msf.cfg.presets import SMALL_ENV_FLAGS  # noqa: E402

CONFIGS = {
    "async": {
        "1x512": ["--batch_size=512"],
        "2x256": ["--batch_size=256", "--nproc_per_node=2"],
    },
    "det": {
        "1x512": ["--batch_size=512", "--deterministic=True"],
        "2x256": ["--batch_size=256", "--nproc_per_node=2", "--deterministic=True"],
    },
}


def mean_policy_lag(tb_dir: str) -> float | None:
    """Mean of the ``policy_lag/mean`` points of a run (None when it wrote none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    if "policy_lag/mean" not in acc.Tags()["scalars"]:
        return None
    return statistics.mean(e.value for e in acc.Scalars("policy_lag/mean"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--threshold", type=float, default=475.0)
    ap.add_argument("--cap", type=float, default=90.0, help="seconds per run at most")
    ap.add_argument("--steps", type=int, default=300_000, help="env steps per run")
    ap.add_argument("--modes", nargs="+", default=["async", "det"], choices=sorted(CONFIGS))
    ap.add_argument("extra", nargs="*", help="more msf-train flags for every configuration (after --)")
    a = ap.parse_args()
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as td:
        for seed in a.seeds:
            for mode in a.modes:
                for name, flags in CONFIGS[mode].items():
                    sub = os.path.join(td, f"{mode}_{name}")
                    r = run_seed(seed, a.threshold, a.cap, a.steps, SMALL_ENV_FLAGS + flags + a.extra, sub)
                    r["lag"] = mean_policy_lag(os.path.join(sub, f"solve_s{seed}", "tensorboard"))
                    results.setdefault((mode, name), []).append(r)
                    print(
                        f"seed {seed} {mode} {name}: steps to {a.threshold:g} {r['env_steps']}, "
                        f"final {r['final']}, mean policy lag {r['lag']}",
                        flush=True,
                    )
    print()
    print(
        f"| mode | groups x batch | env steps to {a.threshold:g} (seeds {', '.join(map(str, a.seeds))}) "
        "| median | ratio to 1 group | median s from launch | mean policy lag | final return (median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in a.modes:
        base = None
        for name in CONFIGS[mode]:
            rows = results[(mode, name)]
            steps = [r["env_steps"] for r in rows]
            # a run that never reached the threshold counts as infinitely many steps (the median stays defined
            # while fewer than half fail)
            med = statistics.median(math.inf if s is None else s for s in steps)
            base = med if base is None else base
            ratio = "-" if math.isinf(med) or math.isinf(base) else f"{med / base:.3f}"
            lags = [r["lag"] for r in rows if r["lag"] is not None]
            finals = [r["final"] for r in rows if r["final"] is not None]
            lag = f"{statistics.mean(lags):.2f}" if lags else "n/a"
            final = f"{statistics.median(finals):.1f}" if finals else "n/a"
            secs = statistics.median(math.inf if r["seconds"] is None else r["seconds"] for r in rows)
            print(
                f"| {mode} | {name} | {' / '.join('never' if s is None else f'{s:,}' for s in steps)} "
                f"| {'never' if math.isinf(med) else f'{med:,.0f}'} | {ratio} "
                f"| {'never' if math.isinf(secs) else f'{secs:.1f}'} | {lag} | {final} |"
            )


if __name__ == "__main__":
    main()
