"""The transport's cost (issue 37, number 7): training frames/s of the all-local run against a learner at
``--num_workers=0`` fed by one sampler node with the same workers, on the same cores, arms alternating round by
round; and what crosses the link: bytes per env frame and MB/s.

    python benchmarks/sampler_nodes.py [--envs cartpole atari_pong] [--arms local loopback veth] [--rounds 2]
                                       [--frames N] [--json OUT]

Arms: ``local`` (the job's own rollout workers), ``loopback`` (the node on this host, over 127.0.0.1) and ``veth``
(the job and the node in two network namespaces joined by a veth pair, as the node tests' "machines"; the job binds
its veth address with ``--sampler_bind``; needs root).

Per run: frames/s from start-up (``summary.json``'s run figure: the wall time from the learner's start, so the
remote arms pay the node's start and join, which the all-local arm does not) and in steady state (the frames the
learner counted over the second half of the span of its TensorBoard points, one a second: no start-up); bytes per
env frame (the node's own count of the bytes it sent, over the frames of the trajectories it sent) and MB/s (that,
times the steady frames/s); over veth also what the interfaces carried each way (TCP/IP included, the weights
going to the node too), per env frame.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from msf.cfg.presets import SF_ATARI_FLAGS, SMALL_ENV_FLAGS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
from netns import VethPair, veth_pair  # noqa: E402

ENVS = {
    # (the job's flags without its workers, the workers (the local arm's, and the node's), frameskip, frames)
    "cartpole": (
        ["--env=CartPole-v1", *[f for f in SMALL_ENV_FLAGS if not f.startswith(("--num_workers", "--num_envs"))]],
        (2, 16),
        1,
        200_000,
    ),
    "atari_pong": (  # Sample Factory's Atari flags, asynchronous (sampler nodes need --async_rl=True)
        [
            "--env=atari_pong",
            "--async_rl=True",
            *[f for f in SF_ATARI_FLAGS if not f.startswith(("--num_workers", "--num_envs"))],
        ],
        (2, 4),
        4,
        60_000,
    ),
}
ARMS = {"local": "all-local", "loopback": "sampler node (loopback)", "veth": "sampler node (veth)"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def train(args: list[str], train_dir: str, exp: str, prefix: list[str]) -> subprocess.Popen:
    cmd = [*prefix, sys.executable, "-m", "msf.train", "--device=cpu", "--with_progress_bar=False", "--seed=0"]
    cmd += [f"--train_dir={train_dir}", f"--experiment={exp}", "--experiment_summaries_interval=1", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())


def steady_fps(tb_dir: Path) -> float | None:
    """Frames/s over the second half of the span of the run's TensorBoard points (``perf/fps``'s steps are
    frames), or None with fewer than 3 points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    points = [(e.wall_time, e.step) for e in acc.Scalars("perf/fps")]
    if len(points) < 3:
        return None
    half = (points[0][0] + points[-1][0]) / 2
    (t0, s0), (t1, s1) = next(p for p in points if p[0] >= half), points[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def link_bytes(pair: VethPair, i: int) -> tuple[int, int]:
    """(sent, received) bytes of interface ``i`` of ``pair`` so far."""
    stats = Path(f"/sys/class/net/{pair.veth[i]}/statistics")
    cmd = [*pair.prefix(i), "cat", str(stats / "tx_bytes"), str(stats / "rx_bytes")]
    tx, rx = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
    return int(tx), int(rx)


def remote(flags: list[str], workers: tuple[int, int], train_dir: str, exp: str, pair: VethPair | None) -> dict:
    """Run the job at ``--num_workers=0`` and one node with ``workers``; the node's counts (and the link's)."""
    port = free_port()
    host = pair.addrs[0] if pair else "127.0.0.1"
    bind = [f"--sampler_bind={host}"] if pair else []
    job = train([*flags, "--num_workers=0", f"--sampler_port={port}", *bind], train_dir, exp,
                pair.prefix(0) if pair else [])  # fmt: skip
    key = Path(train_dir) / exp / "sampler.key"
    while not key.exists() and job.poll() is None:
        time.sleep(0.2)
    link0 = link_bytes(pair, 1) if pair else (0, 0)
    node = subprocess.Popen(
        [*(pair.prefix(1) if pair else []), sys.executable, "-m", "msf.sampler", f"--connect={host}:{port}",
         f"--num_workers={workers[0]}", f"--num_envs_per_worker={workers[1]}", f"--sampler_key_file={key}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    _, err = job.communicate()
    _, nerr = node.communicate(timeout=120)
    link1 = link_bytes(pair, 1) if pair else (0, 0)
    m = re.search(r"(\d+) trajectories sent \((\d+) bytes\)", nerr)
    trajectories, sent = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return {"err": err, "rc": job.returncode, "trajectories": trajectories, "bytes": sent,
            "link_up": link1[0] - link0[0], "link_down": link1[1] - link0[1]}  # fmt: skip


def arm(name: str, which: str, frames: int, train_dir: str) -> dict:
    flags, workers, frameskip, _ = ENVS[name]
    exp = f"{name}_{which}_{time.monotonic_ns()}"
    flags = [*flags, f"--train_for_env_steps={frames}"]
    if which == "local":
        job = train([*flags, f"--num_workers={workers[0]}", f"--num_envs_per_worker={workers[1]}"], train_dir, exp, [])
        _, err = job.communicate()
        r = {"err": err, "rc": job.returncode, "trajectories": 0, "bytes": 0, "link_up": 0, "link_down": 0}
    else:
        with veth_pair("msfsn", "10.231.11") if which == "veth" else contextlib.nullcontext() as pair:
            r = remote(flags, workers, train_dir, exp, pair)
    if r["rc"] != 0:
        raise SystemExit(f"{exp} failed: {r['err'][-2000:]}")
    s = json.loads((Path(train_dir) / exp / "summary.json").read_text())
    steady = steady_fps(Path(train_dir) / exp / "tensorboard")
    rollout = int(next((f.split("=")[1] for f in flags if f.startswith("--rollout=")), 32))  # 32: the default
    sent_frames = r["trajectories"] * rollout * frameskip
    per_frame = r["bytes"] / sent_frames if sent_frames else None
    row = {
        "env": name,
        "arm": ARMS[which],
        "frames": s["env_steps"] * frameskip,
        "wall_s": round(s["wall_seconds"], 1),
        "frames_per_s": round(s["fps"]),
        "steady_frames_per_s": round(steady) if steady else None,
        "bytes_per_frame": round(per_frame, 1) if per_frame else None,
        "mb_per_s": round(per_frame * steady / 1e6, 2) if per_frame and steady else None,
    }
    if which == "veth":
        row["link_up_bytes_per_frame"] = round(r["link_up"] / sent_frames, 1) if sent_frames else None
        row["link_down_bytes_per_frame"] = round(r["link_down"] / sent_frames, 1) if sent_frames else None
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["cartpole"], choices=list(ENVS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames", type=int, default=None, help="frames per run (default: the env's)")
    p.add_argument("--json", default=None, help="write the rows here too")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in a.envs:
            frames = a.frames or ENVS[name][3]
            for rnd in range(a.rounds):
                for which in a.arms if rnd % 2 == 0 else a.arms[::-1]:  # alternating order
                    rows.append({"round": rnd + 1, **arm(name, which, frames, d)})
                    print(json.dumps(rows[-1]), flush=True)
    print(f"{'env':<11} {'arm':<24} {'frames':>8} {'fps':>7} {'ratio':>6} {'steady':>7} {'ratio':>6} "
          f"{'B/frame':>8} {'MB/s':>6}")  # fmt: skip
    for name in a.envs:
        local = [r for r in rows if r["env"] == name and r["arm"] == ARMS["local"]]
        base: dict[str, float] = {k: sorted(r[k] or 0 for r in local)[len(local) // 2] if local else 0
                for k in ("frames_per_s", "steady_frames_per_s")}  # fmt: skip
        for r in (r for r in rows if r["env"] == name):
            r["ratio"] = round(r["frames_per_s"] / base["frames_per_s"], 2) if base["frames_per_s"] else None
            st = r["steady_frames_per_s"]
            r["steady_ratio"] = (
                round(st / base["steady_frames_per_s"], 2) if st and base["steady_frames_per_s"] else None
            )
            print(f"{name:<11} {r['arm']:<24} {r['frames']:>8} {r['frames_per_s']:>7} {r['ratio'] or '':>6} "
                  f"{st or '':>7} {r['steady_ratio'] or '':>6} {r['bytes_per_frame'] or '':>8} "
                  f"{r['mb_per_s'] or '':>6}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
