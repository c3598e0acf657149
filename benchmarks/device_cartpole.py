"""The device-side path's frames/s beside today's CartPole training, in one invocation on one machine.

Runs, one after the other, as a user would (``msf-train`` subprocesses, start-up included):

* ``baseline``: the README's CartPole-v1 command (``scripts/train.sh``: the small-env preset, 300,000 env steps);
* ``device``: the torch CartPole (``--env=torch_cartpole --env_gpu_actions=True``) with the recommended flags of
  ``docs/device_envs.md``, ``--envs`` instances on the CPU device, until the mean return of the last 100 episodes
  reaches 475 (or ``--steps`` frames);

and prints, per run, the run's frames/s (``fps`` of summary.json), frames, wall seconds and final mean return, then
the ratio device / baseline. Also the raw env loop: the torch CartPole stepped alone with random actions.

Usage: python benchmarks/device_cartpole.py [--envs 1024 4096] [--steps 3000000] [--skip_baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from msf.cfg.presets import SMALL_ENV_FLAGS
from msf.envs.torch_cartpole import TorchCartPole

# docs/device_envs.md's recommended command line for the torch CartPole (with --num_envs_per_worker added)
DEVICE_FLAGS = [
    "--env=torch_cartpole",
    "--env_gpu_actions=True",
    "--env_gpu_observations=True",
    "--encoder_mlp_layers",
    "64",
    "64",
    "--rollout=16",
    "--num_batches_per_epoch=4",
    "--num_epochs=4",
    "--learning_rate=1e-3",
    "--value_bootstrap=True",
    "--reward_scale=0.1",
    "--num_batches_to_accumulate=0",
    "--stop_at_return_mean=475",
    # the target is checked at each summary: every second, so that frames and seconds to 475 are not overshoot
    "--experiment_summaries_interval=1",
]


def run(args: list[str], train_dir: str, name: str) -> dict:
    """One msf-train run; its summary.json with the command's wall seconds added (``command_s``)."""
    cmd = [sys.executable, "-m", "msf.train", "--device=cpu", "--with_progress_bar=False", *args]
    t0 = time.monotonic()
    subprocess.run([*cmd, f"--train_dir={train_dir}", f"--experiment={name}"], check=True, capture_output=True)
    with open(os.path.join(train_dir, name, "summary.json")) as f:
        summary = json.load(f)
    summary["command_s"] = time.monotonic() - t0
    return summary


def raw_env_steps_per_s(n: int, seconds: float = 2.0) -> float:
    """Instance steps per second of the torch CartPole alone (``n`` at a time, random actions, one CPU thread)."""
    env, steps = TorchCartPole(n, "cpu", 0), 0
    env.reset()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        env.step(torch.randint(0, 2, (n,)))
        steps += n
    return steps / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--steps", type=int, default=3_000_000)
    parser.add_argument("--skip_baseline", action="store_true")
    a = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        if not a.skip_baseline:
            base = run(["--env=CartPole-v1", "--train_for_env_steps=300000", *SMALL_ENV_FLAGS], d, "baseline")
            rows.append(("baseline CartPole-v1 (README)", base))
        for n in a.envs:
            flags = [*DEVICE_FLAGS, f"--num_envs_per_worker={n}", f"--batch_size={4 * n}"]
            rows.append((f"torch_cartpole x {n}", run([*flags, f"--train_for_env_steps={a.steps}"], d, f"dev{n}")))
    print(f"{'run':34} {'frames/s':>10} {'frames':>10} {'wall s':>7} {'return':>7} {'reached 475 at':>15}")
    for name, s in rows:
        reached = s.get("return_target_reached_at")
        print(
            f"{name:34} {s['fps']:10.0f} {s['env_frames']:10d} {s['command_s']:7.1f} {s['episode_return_mean']:7.1f} "
            f"{str(reached):>15}"
        )
    if not a.skip_baseline:
        for name, s in rows[1:]:
            print(f"{name}: {s['fps'] / rows[0][1]['fps']:.1f}x the baseline's frames/s")
    for n in a.envs:
        print(f"raw torch CartPole, {n} at a time: {raw_env_steps_per_s(n) / 1e6:.1f}M steps/s")


if __name__ == "__main__":
    main()
