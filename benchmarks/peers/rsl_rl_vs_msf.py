"""msf's device-side path beside rsl_rl's PPO on the same torch CartPole, in one invocation, alternating.

Each round runs, one after the other (the order swaps every round), with the round's seed:

* ``msf``: ``msf-train`` with the torch CartPole and the flags of ``benchmarks/device_cartpole.py``
  (``docs/device_envs.md``) at ``--envs`` instances on the CPU device, ``--learner_threads=--threads`` (its flags have
  ``--experiment_summaries_interval=1``, so that the return target is checked every second (rsl_rl checks it after
  every iteration; with msf's default of 10 s it would overshoot by up to 10 s));
* ``rsl_rl``: ``benchmarks/peers/rsl_rl_cartpole.py`` in rsl_rl's venv (``setup_rsl_rl.sh``) with the same number
  of envs, torch threads and comparable PPO settings (its docstring lists them);

each until the mean return of the last 100 episodes reaches 475 (or ``--steps`` env steps). CartPole has no
frameskip: msf's frames are env steps.

Prints a row per run and then the medians over the rounds per system, the ratios msf / rsl_rl of the medians, and
the ratios within each round (its two runs back to back, nearer in load than any other pair) of: env steps/s (env
steps over the training loop's seconds, its first rollout included: msf's ``wall_seconds`` of summary.json, rsl_rl's
``runner.learn``), seconds to 475 from the command's start, env steps to 475. Start-up is the command's seconds
outside the training loop (interpreter, imports, env, model, the exit). msf checks the target at each summary (every
second here), rsl_rl after each iteration (16,384 env steps with 1,024 envs), so msf's env steps to 475 may
overshoot by up to a second of steps. ``--json`` prints the runs as one JSON line too.

Usage: python benchmarks/peers/rsl_rl_vs_msf.py [--rounds 3] [--envs 1024] [--threads 1] [--json]
    [--msf_flags=--actor_critic_share_weights=False ...]
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
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from device_cartpole import DEVICE_FLAGS, run  # noqa: E402

RSL_PYTHON = os.path.join(HERE, ".venv-rsl", "bin", "python")
TARGET = 475.0


def run_msf(envs: int, threads: int, seed: int, steps: int, train_dir: str, extra: list[str]) -> dict:
    """One msf-train run of the device-side torch CartPole (``extra``: more flags); the row's figures from its
    summary.json."""
    flags = [
        *DEVICE_FLAGS,
        f"--num_envs_per_worker={envs}",
        f"--batch_size={4 * envs}",
        f"--learner_threads={threads}",
        f"--seed={seed}",
        f"--train_for_env_steps={steps}",
        *extra,
    ]
    s = run(flags, train_dir, f"msf_{envs}_{seed}")
    return {
        "system": "msf",
        "seed": seed,
        "steps_per_s": s["env_steps"] / s["wall_seconds"],
        "seconds_to_475": s["command_s"] if s["return_target_reached_at"] else None,
        "env_steps_to_475": s["return_target_reached_at"],
        "startup_s": s["command_s"] - s["wall_seconds"],
        "return_mean": s["episode_return_mean"],
    }


def run_rsl_rl(envs: int, threads: int, seed: int, steps: int) -> dict:
    """One run of rsl_rl_cartpole.py in rsl_rl's venv; the row's figures from its JSON line."""
    script = os.path.join(HERE, "rsl_rl_cartpole.py")
    cmd = [RSL_PYTHON, script, f"--envs={envs}", f"--threads={threads}", f"--seed={seed}", f"--max_steps={steps}"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    t0 = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    command_s = time.monotonic() - t0
    r = json.loads(out.strip().splitlines()[-1])
    return {
        "system": "rsl_rl",
        "seed": seed,
        "steps_per_s": r["steps_per_s"],
        "seconds_to_475": command_s if r["reached_at_steps"] else None,
        "env_steps_to_475": r["reached_at_steps"],
        "startup_s": command_s - r["train_s"],
        "return_mean": r["return_mean"],
        "env_s": r["env_s"],
        "update_s": r["update_s"],
        "train_s": r["train_s"],
        "versions": r["versions"],
    }


COLUMNS = ("steps_per_s", "seconds_to_475", "env_steps_to_475")


def median(rows: list[dict], system: str, key: str) -> float | None:
    """The median of ``key`` over ``system``'s runs that have it (None: none has)."""
    values = [r[key] for r in rows if r["system"] == system and r[key] is not None]
    return statistics.median(values) if values else None


def paired_ratios(rows: list[dict], seed: int, key: str) -> float | None:
    """msf / rsl_rl of ``key`` within one round (the two runs back to back, under the same load); None: missing."""
    pair = {r["system"]: r[key] for r in rows if r["seed"] == seed}
    return round(pair["msf"] / pair["rsl_rl"], 2) if pair.get("msf") and pair.get("rsl_rl") else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--envs", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3_000_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--msf_flags", nargs="*", default=[], help="more msf-train flags, e.g. --actor_critic_share_weights=False"
    )
    a = parser.parse_args()
    if not os.path.exists(RSL_PYTHON):
        sys.exit(f"no rsl_rl venv at {RSL_PYTHON}: run bash benchmarks/peers/setup_rsl_rl.sh first")
    rows = []
    print(f"{'system':8} {'seed':>4} {'env steps/s':>12} {'s to 475':>9} {'steps to 475':>13} {'start-up s':>10}")
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.rounds):
            order = ("msf", "rsl_rl") if i % 2 == 0 else ("rsl_rl", "msf")
            for system in order:
                if system == "msf":
                    r = run_msf(a.envs, a.threads, i, a.steps, d, a.msf_flags)
                else:
                    r = run_rsl_rl(a.envs, a.threads, i, a.steps)
                rows.append(r)
                cells = [f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in (*COLUMNS, "startup_s")]
                print(
                    f"{r['system']:8} {r['seed']:4d} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, (12, 9, 13, 10))),
                    flush=True,
                )
    print(f"medians of {a.rounds} rounds, {a.envs} envs, {a.threads} torch thread(s):")
    for key in COLUMNS:
        ours, theirs = median(rows, "msf", key), median(rows, "rsl_rl", key)
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        print(f"  {key:18} msf {ours}  rsl_rl {theirs}  msf/rsl_rl {ratio}")
    paired = [paired_ratios(rows, i, key) for i in range(a.rounds) for key in COLUMNS]
    for key in COLUMNS:
        ratios = sorted(r for r, k in zip(paired, COLUMNS * a.rounds) if k == key and r is not None)
        if ratios:
            print(f"  {key:18} msf/rsl_rl within each round: median {statistics.median(ratios):.2f}, {ratios}")
    upd = [r["update_s"] / r["train_s"] for r in rows if r["system"] == "rsl_rl"]
    env = [r["env_s"] / r["train_s"] for r in rows if r["system"] == "rsl_rl"]
    print(f"  rsl_rl's time: PPO update {statistics.median(upd):.0%}, env step {statistics.median(env):.0%}")
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
