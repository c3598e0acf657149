"""Environment families side by side with Sample Factory 2: atari_pong and doom_basic (both modes), and
mujoco_halfcheetah and mujoco_hopper (``--mode curves --only NAME``; frames are env steps there).

Two modes:

* ``--mode throughput`` (default): for each workload, in env frames per second (env steps x 4), all
  measured in this run: the raw env loop (2 processes, random actions), msf's sampler (rollout and
  inference workers, no learning) and msf's training (steady state: frames gained from the first to the
  last status line after ``--warmup``, over the seconds between them), each with the gymnasium backend
  and, where EnvPool serves the family, with ``--env_backend=envpool``; msf training with
  ``--learner_threads`` = all cores; Sample Factory 2.1.1's training with the same arguments (``--sf2_python``,
  measured the same way from its reports);
  the model's own limit (``throughput.model_limit_sps``: the inference and learner work per sample in
  a tight loop, no envs); and the CPU ceiling (``throughput.cpu_costs``: the core-time per env step of the
  envs, the inference and the learner, each measured alone on one core; cores / their sum bounds what any
  framework can train at doing this work here). Then msf / SF2, msf / the model's limit, and each
  framework's share of the CPU ceiling.
* ``--mode curves --frames 2000000``: each trains to that many frames; the table gives the mean
  return (last 100 episodes) at every 20% of the budget, the wall time and the FPS, and the return of
  a random policy beside them. ``--msf_arm="FLAGS"`` (repeatable; the ``=`` is needed) adds a msf row
  trained with those flags added: an A/B of a flag's effect on the curve, in the same run. ``--score X``
  adds, per row, the wall time from the command's start and the frames at the first status line whose
  mean return reached X (game units: Sample Factory 2's doom_basic returns, which its env scales by 0.01,
  are multiplied back by 100).

The arguments are Sample Factory's own defaults for these families (``atari_override_defaults``, and for
Doom its global defaults with the Doom overrides), spelled as msf flags; Sample Factory gets the same
command line. msf applies the same family defaults itself when the env is chosen
(``msf.envs.families.SF_FAMILY_DEFAULTS``), so the flags spelled out here change nothing on either side except
the worker counts for this machine; both normalise images per pixel (``--normalize_input``, on by default in
both).

Usage: python benchmarks/families.py [--mode throughput|curves] [--seconds 120] [--frames 2000000]
       [--sf2_python /tmp/anchors-venv/bin/python] [--only atari_pong] [--short] [--msf_arm="FLAGS"] [--score X]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from msf.cfg.presets import SF_ATARI_FLAGS

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers")

WORKLOADS = {
    "atari_pong": ["--env=atari_pong", *SF_ATARI_FLAGS, "--seed=0"],
    "doom_basic": [
        "--env=doom_basic",
        "--num_workers=2",
        "--num_envs_per_worker=8",
        "--use_rnn=True",
        "--rnn_size=512",
        "--batch_size=1024",
        "--rollout=32",
        "--ppo_clip_value=0.2",
        "--exploration_loss_coeff=0.001",
        "--exploration_loss=symmetric_kl",
        "--seed=0",
    ],
    # Sample Factory's MuJoCo defaults (mujoco_override_defaults: 8 workers x 8 envs, batch 1024, 2 epochs,
    # tanh MLP 64-64) unchanged on both sides; msf applies them itself for a mujoco_ env. SF2 2.1.1 makes the
    # gymnasium 0.29 tasks (v4), msf gymnasium 1.x's (v5): the same bodies, rewards and episode length (1,000).
    "mujoco_halfcheetah": ["--env=mujoco_halfcheetah", "--seed=0"],
    "mujoco_hopper": ["--env=mujoco_hopper", "--seed=0"],
}
PIXEL = ("atari_pong", "doom_basic")
SF2_ENTRY = {
    "atari_pong": [os.path.join(PEERS, "sf_atari_ale.py")],
    "doom_basic": ["-m", "sf_examples.vizdoom.train_vizdoom"],
    "mujoco_halfcheetah": ["-m", "sf_examples.mujoco.train_mujoco"],
    "mujoco_hopper": ["-m", "sf_examples.mujoco.train_mujoco"],
}
MSF_STATUS = re.compile(r"frames (\d+) \| fps (\d+) \(10 s\).*? return_mean (n/a|-?[\d.]+)")
SF2_STATUS = re.compile(r"Fps is \(10 sec: ([\d.na]+),.*Total num frames: (\d+)")
SF2_REWARD = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")
# Sample Factory 2's doom_basic multiplies every reward by 0.01 in its env (its DoomSpec); its printed returns
# are divided back into game units here, so that both rows (and --score) read in the same units
SF2_RETURN_UNITS = {"doom_basic": 100.0}


def _run(cmd: list[str], parse, seconds: float, cwd: str) -> tuple[list[tuple], float]:
    """Run ``cmd`` (its own session) until it exits or ``seconds`` pass; ``parse(line, t)`` collects rows."""
    rows: list[tuple] = []
    t0 = time.time()
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, start_new_session=True
    )
    assert p.stdout is not None, "a pipe was asked for"
    try:
        for line in p.stdout:
            row = parse(line, time.time() - t0)
            if row is not None:
                rows.append(row)
            if time.time() - t0 >= seconds:
                break
    finally:
        try:
            os.killpg(p.pid, signal.SIGINT)
            p.wait(timeout=30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return rows, time.time() - t0


def run_msf(
    name: str, seconds: float, frames: int | None, extra: tuple[str, ...] | list[str] = ()
) -> tuple[list[tuple], float]:
    """Rows ``(t, frames, fps10, return_mean or None)`` of msf's status lines (``extra``: more flags)."""

    def parse(line: str, t: float):
        m = MSF_STATUS.search(line)
        if m:
            return t, int(m.group(1)), float(m.group(2)), None if m.group(3) == "n/a" else float(m.group(3))
        return None

    with tempfile.TemporaryDirectory() as td:
        budget = [f"--train_for_env_steps={frames}"] if frames else [f"--train_for_seconds={int(seconds)}"]
        cmd = [
            sys.executable,
            "-m",
            "msf.train",
            *WORKLOADS[name],
            "--device=cpu",
            *extra,
            "--experiment=bench",
            f"--train_dir={td}",
            *budget,
            "--experiment_summaries_interval=5",
            "--with_progress_bar=False",
            "--restart_behavior=overwrite",
        ]
        return _run(cmd, parse, seconds if not frames else 10**9, td)


def run_sf2(python: str, name: str, seconds: float, frames: int | None) -> tuple[list[tuple], float]:
    """Rows ``(t, frames, fps10, return_mean or None)`` of Sample Factory 2's report lines."""
    last: dict = {}

    def parse(line: str, t: float):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = SF2_STATUS.search(line)
        if m:
            fps = float(m.group(1)) if m.group(1) != "nan" else 0.0
            last.update(t=t, frames=int(m.group(2)), fps=fps)
            return t, int(m.group(2)), fps, None
        m = SF2_REWARD.search(line)
        if m and last:
            return last["t"], last["frames"], last["fps"], float(m.group(1)) * SF2_RETURN_UNITS.get(name, 1.0)
        return None

    # Sample Factory's command line refuses linear_decay, which is its Atari default: leave the flag to it
    flags = [f for f in WORKLOADS[name] if not f.startswith("--lr_schedule")]
    with tempfile.TemporaryDirectory() as td:
        budget = [f"--train_for_env_steps={frames}"] if frames else []
        cmd = [
            python,
            *SF2_ENTRY[name],
            *flags,
            "--device=cpu",
            "--experiment=bench_sf2",
            f"--train_dir={td}",
            "--restart_behavior=overwrite",
            "--with_wandb=False",
            *budget,
        ]
        return _run(cmd, parse, seconds if not frames else 10**9, td)


def steady_fps(rows: list[tuple], warmup: float) -> float | None:
    """Frames gained per second between the first and the last status line after ``warmup``.

    Not the median of the 10-s figures: before msf 2026-11-30 its "fps (10 s)" read high by up to one
    learner iteration per 10 s (Pong: 1,340 for a true 1,000), and a delta over the whole steady span
    is the same measure for both frameworks."""
    pts = [(r[0], r[1]) for r in rows if r[0] >= warmup]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def random_return(name: str, episodes: int = 5) -> float:
    """Mean return of uniformly random actions over ``episodes`` evaluation episodes (the game's own rewards)."""
    from msf.cfg.config import Config
    from msf.envs.registry import env_config_of, make_env

    env = make_env(name, env_config_of(Config(), seed=0, evaluation=True))
    total = 0.0
    for e in range(episodes):
        env.reset(seed=e)
        done = False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
    env.close()
    return total / episodes


def throughput_tables(names: list[str], a: argparse.Namespace) -> None:
    """For each workload: raw env loop, sampler, training (gymnasium and EnvPool backends), Sample Factory 2's
    training and the model's own limit, all in env frames per second (env steps x 4), measured in this run."""
    from throughput import cpu_costs, model_limit_sps, raw_env_fps, sampler_fps

    for name in names:
        flags = [*WORKLOADS[name], "--device=cpu"]
        env = name
        backends: list[list[str]] = [[]]
        try:
            if a.short:
                raise RuntimeError("--short")
            from msf.envs.vector import envpool_task

            envpool_task(env)
            backends.append(["--env_backend=envpool"])
        except Exception as e:  # noqa: BLE001 - a family EnvPool does not serve, or no envpool here
            print(f"{name}: no EnvPool row ({e})", flush=True)
        rows = []
        for extra in backends:
            tag = "EnvPool" if extra else "gymnasium"
            raw = 4 * raw_env_fps(env, 2, 15.0, flags + extra)
            rows.append((f"raw env loop, random actions, 2 processes ({tag})", raw))
            print(rows[-1], flush=True)
            if not a.short:
                raw = 4 * raw_env_fps(env, 2, 15.0, flags + extra, pin=True)
                rows.append((f"raw env loop, random actions, 2 processes pinned to a core each ({tag})", raw))
                print(rows[-1], flush=True)
            rows.append((f"msf sampler, policy, no learning ({tag})", 4 * sampler_fps(flags + extra, 30.0, 15.0)))
            print(rows[-1], flush=True)
            rows.append(
                (f"msf training ({tag})", steady_fps(run_msf(name, a.seconds, None, extra)[0], a.warmup) or 0.0)
            )
            print(rows[-1], flush=True)
            if not extra:
                cores = len(os.sched_getaffinity(0))
                rows.append(
                    (
                        f"msf training, --learner_threads={cores}",
                        steady_fps(run_msf(name, a.seconds, None, [f"--learner_threads={cores}"])[0], a.warmup) or 0.0,
                    )
                )
                print(rows[-1], flush=True)
            if not extra and not a.short:
                rows.append(
                    (
                        "msf training, --set_workers_cpu_affinity=False",
                        steady_fps(run_msf(name, a.seconds, None, ["--set_workers_cpu_affinity=False"])[0], a.warmup)
                        or 0.0,
                    )
                )
                print(rows[-1], flush=True)
        if a.sf2_python:
            rows.append(
                (
                    "Sample Factory 2.1.1 training, same arguments",
                    steady_fps(run_sf2(a.sf2_python, name, a.seconds, None)[0], a.warmup) or 0.0,
                )
            )
            print(rows[-1], flush=True)
        limit = 4 * model_limit_sps(flags, 40.0)
        rows.append(("the model's own limit (inference + learner work per sample, no envs)", limit))
        costs = cpu_costs(flags, 15.0)
        cores = len(os.sched_getaffinity(0))
        per_step = costs["env"] + costs["inference"] + costs["learner"]
        ceiling = 4 * 1000.0 * cores / per_step
        rows.append(
            (
                f"the CPU ceiling: {cores} cores / (env {costs['env']:.2f} + inference {costs['inference']:.2f} "
                f"(batch {costs['inference_batch']}) + learner {costs['learner']:.2f} core-ms per env step)",
                ceiling,
            )
        )
        train = dict(rows)["msf training (gymnasium)"]
        print(f"\n{name}: flags {' '.join(flags)}\n")
        print("| stage | env frames/s |\n|---|---|")
        for label, fps in rows:
            print(f"| {label} | {fps:,.0f} |")
        sf2 = dict(rows).get("Sample Factory 2.1.1 training, same arguments")
        best_label, best = max(((k, v) for k, v in rows if k.startswith("msf training")), key=lambda kv: kv[1])
        if sf2:
            print(
                f"\nmsf training / Sample Factory 2 training: {train / sf2:.2f}x (default flags), "
                f"{best / sf2:.2f}x ({best_label})"
            )
            print(
                f"share of the CPU ceiling: msf {train / ceiling:.2f} (default flags), {best / ceiling:.2f} "
                f"({best_label}), Sample Factory 2 {sf2 / ceiling:.2f}; 1.5x Sample Factory 2 would be "
                f"{1.5 * sf2 / ceiling:.2f}, and the ceiling is {ceiling / sf2:.2f}x Sample Factory 2"
            )
        print(
            f"msf training / the model's own limit: {train / limit:.2f} (default flags), {best / limit:.2f} "
            f"({best_label})",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("throughput", "curves"), default="throughput")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--warmup", type=float, default=40)
    ap.add_argument("--frames", type=int, default=2_000_000)
    ap.add_argument("--sf2_python", default=None)
    ap.add_argument("--only", default=None, choices=tuple(WORKLOADS))
    ap.add_argument(
        "--short",
        action="store_true",
        help="throughput: leave out the pinned raw loop, the unpinned training and the EnvPool rows",
    )
    ap.add_argument(
        "--msf_arm",
        action="append",
        default=[],
        metavar="FLAGS",
        help="curves: one more msf row, trained with these msf-train flags added (quoted; repeatable), after msf's own",
    )
    ap.add_argument(
        "--score",
        type=float,
        default=None,
        help="curves: also report the wall time (s, from the command's start) and frames to this mean return",
    )
    a = ap.parse_args()
    names = [a.only] if a.only else list(PIXEL)
    if a.mode == "throughput":
        throughput_tables(names, a)
        return
    for name in names:
        print(f"\n{name}: {a.frames:,} frames; random policy: {random_return(name):.1f}")
        runs = {"msf": run_msf(name, 0, a.frames)}
        for arm in a.msf_arm:
            runs[f"msf {arm}"] = run_msf(name, 0, a.frames, arm.split())
        if a.sf2_python:
            runs["Sample Factory 2"] = run_sf2(a.sf2_python, name, 0, a.frames)
        marks = [a.frames * k // 5 for k in range(1, 6)]
        to_score = [f"s to {a.score:g}", f"frames to {a.score:g}"] if a.score is not None else []
        print(
            "| system | "
            + " | ".join([*(f"return at {m / 1e6:.2f}M" for m in marks), "wall s", "FPS", *to_score])
            + " |"
        )
        print("|---|" + "---|" * (len(marks) + 2 + len(to_score)))
        for system, (rows, wall) in runs.items():
            rets = []
            for m in marks:
                seen = [r[3] for r in rows if r[1] <= m * 1.02 and r[3] is not None]
                rets.append(f"{seen[-1]:.1f}" if seen else "n/a")
            last = rows[-1][1] if rows else 0
            cells = [*rets, f"{wall:.0f}", f"{last / max(wall, 1e-9):,.0f}"]
            if a.score is not None:
                hit = next((r for r in rows if r[3] is not None and r[3] >= a.score), None)
                cells += [f"{hit[0]:.0f}", f"{hit[1]:,}"] if hit else ["not reached", "not reached"]
            print(f"| {system} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
