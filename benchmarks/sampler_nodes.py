"""The transport's cost (issue 37, number 7): training frames/s of the all-local run against a learner at
``--num_workers=0`` fed by one sampler node with the same workers, on the same cores, arms alternating round by
round; and what crosses the socket: bytes per env frame and MB/s, from the node's own count of bytes sent.

    python benchmarks/sampler_nodes.py [--envs cartpole atari_pong] [--rounds 2] [--json OUT]

Frames/s is ``summary.json``'s run figure (frames over the wall time from the learner's start, start-up included:
the remote arm's includes the node's join, which the all-local arm does not pay). Over loopback only; the veth
pair of the node tests is not measured here.
"""

from __future__ import annotations

import argparse
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
ENVS = {
    # (the job's flags without its workers, the workers (the local arm's, and the node's), frameskip)
    "cartpole": (
        ["--env=CartPole-v1", *[f for f in SMALL_ENV_FLAGS if not f.startswith(("--num_workers", "--num_envs"))]],
        (2, 16),
        1,
        200_000,
    ),
    "atari_pong": (
        ["--env=atari_pong", *[f for f in SF_ATARI_FLAGS if not f.startswith(("--num_workers", "--num_envs"))]],
        (2, 4),
        4,
        200_000,
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def train(args: list[str], train_dir: str, exp: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "msf.train", "--device=cpu", "--with_progress_bar=False", "--seed=0"]
    cmd += [f"--train_dir={train_dir}", f"--experiment={exp}", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())


def arm(name: str, remote: bool, frames: int, train_dir: str) -> dict:
    flags, (workers, envs), frameskip, _ = ENVS[name]
    exp = f"{name}_{'remote' if remote else 'local'}_{time.monotonic_ns()}"
    budget = f"--train_for_env_steps={frames}"
    if not remote:
        job = train([*flags, budget, f"--num_workers={workers}", f"--num_envs_per_worker={envs}"], train_dir, exp)
        _, err = job.communicate()
        node_bytes = node_trajectories = 0
    else:
        port = free_port()
        job = train([*flags, budget, "--num_workers=0", f"--sampler_port={port}"], train_dir, exp)
        key = Path(train_dir) / exp / "sampler.key"
        while not key.exists() and job.poll() is None:
            time.sleep(0.2)
        node = subprocess.Popen(
            [sys.executable, "-m", "msf.sampler", f"--connect=127.0.0.1:{port}", f"--num_workers={workers}",
             f"--num_envs_per_worker={envs}", f"--sampler_key_file={key}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(),
        )  # fmt: skip
        _, err = job.communicate()
        _, nerr = node.communicate(timeout=60)
        m = re.search(r"(\d+) trajectories sent \((\d+) bytes\)", nerr)
        node_trajectories, node_bytes = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if job.returncode != 0:
        raise SystemExit(f"{exp} failed: {err[-2000:]}")
    s = json.loads((Path(train_dir) / exp / "summary.json").read_text())
    rollout = int(next((f.split("=")[1] for f in flags if f.startswith("--rollout=")), 32))  # 32: the default
    sent_frames = node_trajectories * rollout * frameskip
    return {
        "env": name,
        "arm": "sampler node (loopback)" if remote else "all-local",
        "frames": s["env_steps"],
        "wall_s": round(s["wall_seconds"], 1),
        "fps": round(s["fps"]),
        "bytes_per_frame": round(node_bytes / sent_frames, 1) if sent_frames else None,
        "mb_per_s": round(node_bytes / 1e6 / s["wall_seconds"], 2) if node_bytes else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["cartpole"], choices=list(ENVS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames", type=int, default=None, help="frames per run (default: the env's)")
    p.add_argument("--json", default=None, help="write the rows here too")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in a.envs:
            frames = a.frames or ENVS[name][3]
            for r in range(a.rounds):
                for remote in (False, True) if r % 2 == 0 else (True, False):  # alternating order
                    rows.append(arm(name, remote, frames, d))
                    print(json.dumps(rows[-1]), flush=True)
    print(f"{'env':<11} {'arm':<24} {'frames':>8} {'fps':>7} {'ratio':>6} {'B/frame':>8} {'MB/s':>6}")
    for name in a.envs:
        local = sorted(r["fps"] for r in rows if r["env"] == name and r["arm"] == "all-local")
        base = local[len(local) // 2]
        for r in (r for r in rows if r["env"] == name):
            r["ratio"] = round(r["fps"] / base, 2)
            print(f"{name:<11} {r['arm']:<24} {r['frames']:>8} {r['fps']:>7} {r['ratio']:>6} "
                  f"{r['bytes_per_frame'] or '':>8} {r['mb_per_s'] or '':>6}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
