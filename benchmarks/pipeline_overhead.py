"""msf's own pipeline overhead: the sampler with a policy that costs nothing, against the raw env loop.

For each workload, measured in this run, in env steps per second (frames for the pixel envs: steps x 4):

(a) the raw env loop: ``--num_workers`` processes stepping one env each with random actions
    (``throughput.raw_env_fps``; the gymnasium backend and msf's wrappers, as a rollout worker has them);
(b) msf's sampler with a zero-cost policy: the real rollout workers, inference worker, pipes and trajectory
    buffer, the learner replaced by a stand-in that hands every finished trajectory's slot straight back
    (``throughput.sampler_fps``), the encoder replaced by ``zero_policy.ZeroEncoder`` (``[N, 1]`` zeros)
    and a recurrent core by ``zero_policy.ZeroCore`` (zeros out, states passed through);
(c) the same sampler with the workload's real policy.

For (b) it also reads, from ``/proc``, where the CPU time of the measured window went (``throughput.cost_breakdown``):
core-microseconds per env step of the rollout workers, the inference workers, the main process (the stand-in
learner) and other processes (an env's helpers such as ViZDoom's engines), how much of it the kernel spent
(system time: pipes, waits, context switches, page faults), the context switches per env step,
how busy the machine's cores were, and the inference worker's work alone (``serve_alone_us``: the same requests
served in a loop in one process): the second table.

(b) / (a) is the share of the env loop that msf's plumbing leaves: on a machine whose policy runs on a GPU, what
the CPU can sample at. (c) / (b) is what the policy's arithmetic costs on these CPU cores.

Workloads: CartPole-v1 with Sample Factory's CartPole command line (``throughput.SF_CARTPOLE``), then with 256 envs
per worker, and with each split stepped as one EnvPool (``--env_backend=envpool``, what ``--batched_sampling=True``
means) or one vector env (``--env_backend=vector``) at 20 and 256 envs per worker; atari_pong and doom_basic with
Sample Factory's family arguments (``families.WORKLOADS``), and atari_pong with EnvPool and with ale-py's vector env.
(a) is always the gymnasium loop; for an EnvPool or vector row the table also gives the raw loop of the backend
itself (one pool or vector env of a worker's envs per process, stepped bare), and (b) over it. With
``--train_seconds``, each workload also trains (``msf-train``) for its training frames/s.

Usage: python benchmarks/pipeline_overhead.py [--seconds 30] [--only "CartPole-v1, EnvPool" atari_pong ...]
       [--train_seconds 60]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # zero_policy, for this process and (through spawn's sys.path) the workers it starts
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

from families import WORKLOADS  # noqa: E402
from throughput import SF_CARTPOLE, msf_train_fps, raw_env_fps, sampler_fps  # noqa: E402

ZERO = ["--encoder_custom=zero_policy:zero"]


ENVPOOL = ["--env_backend=envpool"]
VECTOR = ["--env_backend=vector"]  # CartPole-v1's CartPoleVectorEnv: one numpy call steps a split
MANY = ["--num_envs_per_worker=256"]  # 128 per split: where the per-request cost stops mattering


def workloads() -> dict[str, tuple[list[str], int]]:
    """name -> (msf flags, frames per env step). The CartPole rows beyond Sample Factory's line: 256 envs per
    worker, and each split stepped as one EnvPool (``--env_backend=envpool``) or as gymnasium's CartPoleVectorEnv
    (``--env_backend=vector``), at 20 and 256 envs per worker (vector: also 2048 and 16384); the Atari workloads
    also with EnvPool and with ale-py's vector env."""
    out = {
        "CartPole-v1": (list(SF_CARTPOLE), 1),
        "CartPole-v1, 256 envs/worker": ([*SF_CARTPOLE, *MANY], 1),
        "CartPole-v1, EnvPool": ([*SF_CARTPOLE, *ENVPOOL], 1),
        "CartPole-v1, EnvPool, 256 envs/worker": ([*SF_CARTPOLE, *ENVPOOL, *MANY], 1),
        "CartPole-v1, vector": ([*SF_CARTPOLE, *VECTOR], 1),
        "CartPole-v1, vector, 256 envs/worker": ([*SF_CARTPOLE, *VECTOR, *MANY], 1),
        "CartPole-v1, vector, 2048 envs/worker": ([*SF_CARTPOLE, *VECTOR, "--num_envs_per_worker=2048"], 1),
        "CartPole-v1, vector, 16384 envs/worker": ([*SF_CARTPOLE, *VECTOR, "--num_envs_per_worker=16384"], 1),
    }
    for name, flags in WORKLOADS.items():
        out[name] = ([*flags, "--device=cpu"], 4)
        if name.startswith("atari_"):  # EnvPool's Atari: ALE and the preprocessing in C++; ale-py's AtariVectorEnv
            out[f"{name}, EnvPool"] = ([*flags, "--device=cpu", *ENVPOOL], 4)
            out[f"{name}, vector"] = ([*flags, "--device=cpu", *VECTOR], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds of each sampler run")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds before a sampler run is measured")
    ap.add_argument("--only", nargs="+", default=None, help="workload names (default: all)")
    ap.add_argument(
        "--train_seconds",
        type=float,
        default=0.0,
        help="also train each workload this long and give its training frames/s (msf-train; 0: not measured)",
    )
    a = ap.parse_args()
    from msf.cfg.arguments import parse_args

    rows, breakdowns = [], []
    for name, (flags, fs) in workloads().items():
        if a.only and name not in a.only:
            continue
        cfg = parse_args(flags)[0]
        procs = cfg.num_workers
        # (a) is the gymnasium loop, whatever the sampler's backend: what a user's env costs stepped one by one
        gym_flags = [f for f in flags if not f.startswith("--env_backend")]
        raw = fs * raw_env_fps(cfg.env, procs, min(a.seconds, 15.0), gym_flags)
        print(f"{name}: raw env loop {raw:,.0f}", flush=True)
        raw_backend = raw
        if cfg.env_backend != "gymnasium":  # and the backend's own loop: a pool of a worker's envs, stepped bare
            raw_backend = fs * raw_env_fps(cfg.env, procs, min(a.seconds, 15.0), flags)
            print(f"{name}: raw loop of the {cfg.env_backend} backend {raw_backend:,.0f}", flush=True)
        costs: dict = {}
        zero = fs * sampler_fps(flags + ZERO, a.seconds, a.warmup, breakdown=costs)
        print(f"{name}: sampler, zero-cost policy {zero:,.0f}", flush=True)
        real = fs * sampler_fps(flags, a.seconds, a.warmup)
        print(f"{name}: sampler, real policy {real:,.0f}", flush=True)
        train = msf_train_fps(flags, a.train_seconds, a.warmup)[0] if a.train_seconds > 0 else float("nan")
        if a.train_seconds > 0:
            print(f"{name}: training {train:,.0f} frames/s", flush=True)
        rows.append((name, procs, fs, raw, raw_backend, zero, real, train))
        costs["serve_alone"], costs["act_alone"] = ((us, 0.0, 0.0) for us in serve_alone_us(flags + ZERO))
        breakdowns.append((name, procs, raw_backend / fs, zero / fs, costs))
    unit = lambda fs: "frames/s" if fs > 1 else "steps/s"  # noqa: E731
    print()
    print(
        "| workload | env processes | raw env loop | raw loop of the backend | sampler, zero-cost policy | zero / raw "
        "| zero / raw of the backend | sampler, real policy | real / zero | training frames/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, procs, fs, raw, raw_backend, zero, real, train in rows:
        print(
            f"| {name} | {procs} | {raw:,.0f} {unit(fs)} | {raw_backend:,.0f} | {zero:,.0f} | **{zero / raw:.3f}** "
            f"| **{zero / raw_backend:.3f}** | {real:,.0f} | {real / zero:.3f} | {train:,.0f} |"
        )

    print_breakdown(breakdowns)


def serve_alone_us(flags: list[str], calls: int = 1000) -> tuple[float, float]:
    """Core-microseconds per env step of the inference worker's work alone: :meth:`InferenceWorker.serve` of one
    split's request, called ``calls`` times in a loop in this process (one thread, warm caches, no pipes, no
    waiting), divided by the split's rows. Against the inference workers' figure of the sampler run, it shows what
    running in a process of its own adds (waking, the pipes' system calls, caches the other processes cooled).
    Second: the same for the policy's ``act`` alone on the split's observations (no gathers, no buffer writes):
    what any design that samples an action per env step from this policy pays, where the pipeline is free."""
    import time

    import torch

    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.model.actor_critic import ActorCritic
    from msf.sampling.inference_worker import InferenceWorker
    from msf.sampling.published_weights import PublishedWeights
    from msf.sampling.trajectory_buffer import TrajectoryBuffer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg, given = parse_args(flags)
        cfg = apply_family_defaults(cfg, given)
        derived, spaces = Derived.of(cfg), env_spaces(cfg.env, env_config_of(cfg))
        buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
        model = ActorCritic(cfg, spaces).eval()
        weights = PublishedWeights(model)
        weights.publish(model, 0)
        worker = InferenceWorker.in_process(cfg, derived, spaces, buffer, weights)
        rows = cfg.num_workers * derived.agents_per_split * cfg.worker_num_splits
        buffer.cursors[..., 0] = torch.arange(rows).view(cfg.num_workers, -1)  # every row at a slot of its own
        worker.serve([(0, 0)])
        t0 = time.process_time()
        for _ in range(calls):
            worker.serve([(0, 0)])
        serve = 1e6 * (time.process_time() - t0) / calls / derived.agents_per_split
        obs = buffer.obs[0, 0].expand(derived.agents_per_split, *buffer.obs.shape[2:]).contiguous()
        with torch.inference_mode():
            worker.model.act(obs)
            t0 = time.process_time()
            for _ in range(calls):
                worker.model.act(obs)
        return serve, 1e6 * (time.process_time() - t0) / calls / derived.agents_per_split
    finally:
        torch.set_num_threads(threads)


def print_breakdown(breakdowns: list) -> None:
    """The second table: per workload, core-us per env step of each process role in the zero-cost sampler,
    against the raw loop's of the backend (its processes' core-time per step: each is busy all the time), context
    switches per env step, the cores' busy share (all the tree's CPU time over wall time x cores), the inference
    worker's work alone and the policy's ``act`` alone (:func:`serve_alone_us`), and the ceiling that ``act`` alone
    sets on zero / raw of the backend: raw / (raw + act), what a pipeline that cost nothing else would reach."""
    cores = os.cpu_count() or 1
    print()
    print(
        "| workload | raw loop: core-us per step | sampler: core-us per step (rollout / inference / main / other) "
        "| all | of it in the kernel | context switches per step | cores busy | inference work alone | act alone "
        "| ceiling: raw / (raw + act) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, procs, raw_sps, zero_sps, c in breakdowns:
        if "all" not in c:
            continue
        roles = " / ".join(
            f"{c.get(k, (0.0, 0.0))[0]:.3g}" for k in ("rollout_worker", "inference_worker", "main", "other")
        )
        busy = c["all"][0] * 1e-6 * zero_sps / cores
        raw_us, act_us = 1e6 * min(procs, cores) / raw_sps, c["act_alone"][0]
        print(
            f"| {name} | {raw_us:.3g} | {roles} | {c['all'][0]:.3g} | {c['all'][1]:.3g} | {c['all'][2]:.2f} "
            f"| {busy:.2f} | {c['serve_alone'][0]:.3g} | {act_us:.3g} | {raw_us / (raw_us + act_us):.3f} |"
        )


if __name__ == "__main__":
    main()
