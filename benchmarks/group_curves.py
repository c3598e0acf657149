"""Learning curves of one device group at N x B against N device groups at B, on a pixel env, in both modes.

Issue 16's last table: does the number of device groups change what a run learns, on a real task? For
atari_pong (``families.py``'s flags: Sample Factory's Atari defaults as msf flags, 2 workers x 4 envs, rollout
128, 4 minibatches x 4 epochs per 1,024-sample iteration), runs to ``--frames`` (default 2M) each of:

- ``async_1x256``: one device group, ``--batch_size=256``, ``--async_rl=True`` (msf's default mode; the atari
  family's defaults are Sample Factory's Atari ones, which set ``--async_rl=False``);
- ``async_2x128``: ``--nproc_per_node=2 --batch_size=128`` (the same global batch and the same 8 envs: each group
  has one worker of 4 envs, whose rollout is 512 = 4 x 128 samples);
- ``det_1x256`` / ``det_2x128``: the same pair with ``--deterministic=True``.

The learners share the cores: 2 threads for one group's learner, 1 for each of two (``--learner_threads``).

Each run keeps its train dir under ``--out`` (a run already finished there is not run again, so the
configurations can be run one at a time, in separate invocations, and reported together), and the script prints
one table: the mean return of the job's last 100 episodes (TensorBoard ``episode/return_mean``, the point nearest
each mark), the mean policy lag, the frames per second over the run and the wall time.

Usage: python benchmarks/group_curves.py [--configs async_1x256 async_2x128 det_1x256 det_2x128]
       [--frames 2000000] [--out /tmp/group_curves] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from families import WORKLOADS  # noqa: E402

CONFIGS = {
    "async_1x256": ["--batch_size=256", "--async_rl=True", "--learner_threads=2"],
    "async_2x128": ["--batch_size=128", "--nproc_per_node=2", "--async_rl=True", "--learner_threads=1"],
    "det_1x256": ["--batch_size=256", "--deterministic=True", "--learner_threads=2"],
    "det_2x128": ["--batch_size=128", "--nproc_per_node=2", "--deterministic=True", "--learner_threads=1"],
}
MARKS = (400_000, 800_000, 1_200_000, 1_600_000, 2_000_000)


def _flags(workload: str) -> list[str]:
    return [f for f in WORKLOADS[workload] if not f.startswith("--batch_size")]


def run(name: str, workload: str, frames: int, out: str) -> None:
    """Train configuration ``name`` to ``frames`` in ``out/name`` (skipped when its summary says done)."""
    summary = os.path.join(out, name, "summary.json")
    if os.path.exists(summary):
        with open(summary) as f:
            if json.load(f).get("status") == "done":
                print(f"{name}: already done in {out}", flush=True)
                return
    cmd = [
        sys.executable,
        "-m",
        "msf.train",
        *_flags(workload),
        *CONFIGS[name],
        f"--experiment={name}",
        f"--train_dir={out}",
        "--restart_behavior=overwrite",
        "--device=cpu",
        f"--train_for_env_steps={frames}",
        "--experiment_summaries_interval=10",
        "--with_progress_bar=False",
    ]
    print(" ".join(cmd), flush=True)
    with open(os.path.join(out, f"{name}.out"), "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)


def curve(out: str, name: str, marks: tuple[int, ...] = MARKS) -> dict:
    """The run's TensorBoard points: return at each mark, mean policy lag, frames, wall seconds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(out, name, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    ret = acc.Scalars("episode/return_mean") if "episode/return_mean" in tags else []
    lag = acc.Scalars("policy_lag/mean") if "policy_lag/mean" in tags else []
    # the point nearest each mark, where the run got that far (within one 10-s summary of it)
    at = {
        m: (min(ret, key=lambda e: abs(e.step - m)).value if ret and ret[-1].step >= m - 20_000 else None)
        for m in marks
    }
    summary = os.path.join(out, name, "summary.json")
    wall = json.load(open(summary))["wall_seconds"] if os.path.exists(summary) else None
    frames = acc.Scalars("perf/fps")[-1].step if "perf/fps" in tags else 0
    return {
        "at": at,
        "lag": statistics.mean(e.value for e in lag) if lag else None,
        "frames": frames,
        "wall": wall,
        "best": max((e.value for e in ret), default=None),
    }


def report(out: str, names: list[str], marks: tuple[int, ...] = MARKS) -> None:
    """The table: return at each of ``marks`` (frames), the best, the mean lag, frames/s and wall time of a
    finished run, and the frames a run had reached (an unfinished one's last TensorBoard point)."""
    print()
    cols = " | ".join(f"{m / 1e6:.1f}M" for m in marks)
    print(f"| run | {cols} | best | mean policy lag | frames reached | frames/s | wall (s) |")
    print("|---|" + "---|" * (len(marks) + 5))
    for name in names:
        if not os.path.isdir(os.path.join(out, name, "tensorboard")):
            continue
        c = curve(out, name, marks)
        cells = ["n/a" if v is None else f"{v:.1f}" for v in c["at"].values()]
        fps = "n/a" if not c["wall"] else f"{c['frames'] / c['wall']:.0f}"
        lag = "n/a" if c["lag"] is None else f"{c['lag']:.2f}"
        best = "n/a" if c["best"] is None else f"{c['best']:.1f}"
        wall = "n/a" if c["wall"] is None else f"{c['wall']:.0f}"
        print(f"| {name} | {' | '.join(cells)} | {best} | {lag} | {c['frames']:,} | {fps} | {wall} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--workload", default="atari_pong", choices=sorted(WORKLOADS))
    ap.add_argument("--frames", type=int, default=2_000_000, help="env frames per run")
    ap.add_argument("--out", default=os.path.join("/tmp", "group_curves"), help="train dir kept across invocations")
    ap.add_argument("--report", action="store_true", help="print the table of the runs in --out; run nothing")
    ap.add_argument("--marks", type=int, nargs="+", default=list(MARKS), help="frames at which the table reads")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if not a.report:
        for name in a.configs:
            run(name, a.workload, a.frames, a.out)
    report(a.out, a.configs, tuple(a.marks))


if __name__ == "__main__":
    main()
