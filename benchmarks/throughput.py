"""Throughput of msf on one machine, three stages measured in one run, with their ratios.

(a) raw env: ``--env`` stepped with random actions in ``--procs`` processes (default: one per core);
(b) sampler: msf's real rollout and inference workers with the real policy and no learning
    (a stand-in learner hands every finished trajectory's slot straight back);
(c) training: ``msf-train`` with the same flags, steady-state FPS = median of its 10-s FPS
    after ``--warmup`` seconds (as ``../shared/peers/bench_sf.py`` measures Sample Factory 2);
(d) optionally Sample Factory 2 with the same arguments, when ``--sf2_python`` names a python
    with sample-factory installed (``bash ../shared/peers/setup.sh`` makes one);
(e) optionally, with ``--nproc_sweep 1 2``, training FPS with that many CPU device groups (DDP
    learner replicas, same per-replica flags), and the time of one gloo all-reduce of the
    model's gradients (its size in bytes), so that the cost of scaling out is visible.

The default flags are the Sample Factory CartPole command line of ``../shared/peers/run_sf.sh``.
Usage: python benchmarks/throughput.py [--seconds 60] [--sf2_python /tmp/anchors-venv/bin/python]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SF_CARTPOLE = [
    "--env=CartPole-v1",
    "--num_workers=2",
    "--num_envs_per_worker=20",
    "--policy_workers_per_policy=2",
    "--recurrence=1",
    "--with_vtrace=False",
    "--batch_size=512",
    "--reward_scale=0.1",
    "--device=cpu",
]


def _raw_env_proc(
    env_name: str, seconds: float, out: "mp.Queue", flags: list[str] | None = None, core: int | None = None
) -> None:
    """Step one env (gymnasium backend, msf's wrappers) or, with ``--env_backend=vector`` or ``envpool`` in
    ``flags``, one bare vector env (EnvPool) of ``--num_envs_per_worker`` envs, with random actions; put steps/s on
    ``out``. ``core``: pin this process to that CPU core first, as ``--set_workers_cpu_affinity`` pins a rollout
    worker."""
    from msf.runtime.affinity import pin_this_process

    pin_this_process(None if core is None else [core])
    from msf.cfg.arguments import parse_args
    from msf.envs.registry import env_config_of, make_env

    cfg, _ = parse_args([f"--env={env_name}", *(flags or [])])
    if cfg.env_backend != "gymnasium":  # the bare vector env (or EnvPool) of a worker's envs, no split around it
        from msf.envs.vector import make_vector_env

        n_envs = cfg.num_envs_per_worker
        venv = make_vector_env(cfg, 0, list(range(n_envs)), os.getpid())[0]
        venv.reset(seed=os.getpid())
        space = venv.single_action_space
        batches = [np.stack([space.sample() for _ in range(n_envs)]) for _ in range(64)]
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for a in batches:
                venv.step(a)
            n += len(batches) * n_envs
        out.put(n / (time.perf_counter() - t0))
        venv.close()
        return
    env = make_env(env_name, env_config_of(cfg, seed=os.getpid()))
    env.reset(seed=os.getpid())
    space = env.action_space
    actions = [space.sample() for _ in range(1024)]
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for a in actions:
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset()
            n += 1
            if n % 64 == 0 and time.perf_counter() - t0 >= seconds:
                break
    out.put(n / (time.perf_counter() - t0))


def raw_env_fps(env_name: str, procs: int, seconds: float, flags: list[str] | None = None, pin: bool = False) -> float:
    """(a): summed env steps/s of ``procs`` processes stepping with random actions (see :func:`_raw_env_proc`);
    ``pin``: process i runs on core i mod cores only."""
    from msf.runtime.affinity import usable_cores

    cores = usable_cores()
    q: mp.Queue = mp.get_context("spawn").Queue()
    ps = [
        mp.get_context("spawn").Process(
            target=_raw_env_proc, args=(env_name, seconds, q, flags, cores[i % len(cores)] if pin else None)
        )
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    rates = [q.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join()
    return sum(rates)


def model_limit_sps(flags: list[str], seconds: float) -> float:
    """The model's own limit, in env steps/s: a tight loop in one process (all cores' threads) doing the
    configured work per sample and nothing else: one inference forward in batches of one request's size
    (``num_envs_per_worker / worker_num_splits`` envs), then the learner's whole iteration (its bootstrap
    forward and ``num_epochs`` forward + backward passes in minibatches of ``batch_size``) on batches
    of ``batch_size x num_batches_per_epoch`` samples. Envs, pipes and buffers cost nothing here."""
    import torch

    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.learning.learner import Learner
    from msf.model.actor_critic import ActorCritic

    cfg, given = parse_args(flags)
    cfg = apply_family_defaults(cfg, given)
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env, env_config_of(cfg))
    torch.set_num_threads(os.cpu_count() or 1)
    learner = Learner(cfg, derived, spaces, "cpu")
    policy = ActorCritic(cfg, spaces).eval()
    batch = _random_batch(cfg, derived, spaces)
    obs = batch["obs"]
    B, T = batch["rewards"].shape
    request = max(1, derived.envs_per_split)
    flat = obs[:, :T].reshape(B * T, *spaces.obs_shape)
    states = torch.zeros(request, derived.rnn_state_size) if derived.rnn_state_size else None
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or steps == 0:
        with torch.no_grad():
            for i in range(0, B * T, request):
                policy.act(flat[i : i + request], None if states is None else states[: len(flat[i : i + request])])
        learner.train({k: v.clone() for k, v in batch.items()})
        steps += B * T
    return steps / (time.perf_counter() - t0)


def _core_ticks(core: int) -> tuple[int, int]:
    """(busy, total) jiffies of CPU ``core`` so far, from ``/proc/stat`` (Linux)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]  # idle + iowait
                return sum(v) - idle, sum(v)
    raise RuntimeError(f"no cpu{core} in /proc/stat")


def _env_cost_proc(flags: list[str], seconds: float, core: int, out: "mp.Queue") -> None:
    """One rollout worker's envs alone (``--num_envs_per_worker`` of them, stepped in turn with random
    actions) in this process pinned to ``core``; puts the env steps it made on ``out``."""
    from msf.runtime.affinity import pin_this_process

    pin_this_process([core])
    from msf.cfg.arguments import parse_args
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, make_env

    cfg, given = parse_args(flags)
    cfg = apply_family_defaults(cfg, given)
    envs = [
        make_env(cfg.env, env_config_of(cfg, worker_index=0, env_index=i, seed=i))
        for i in range(cfg.num_envs_per_worker)
    ]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    out.put("ready")
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for e in envs:
            _, _, term, trunc, _ = e.step(e.action_space.sample())
            if term or trunc:
                e.reset()
        n += len(envs)
    out.put((n, time.perf_counter() - t0))
    for e in envs:
        e.close()


def cpu_costs(flags: list[str], seconds: float = 15.0) -> dict[str, float]:
    """CPU time per env step of each part of the work, each measured alone, in core-milliseconds.

    * ``env``: one rollout worker's envs in one process pinned to the last usable core (an env's helper
      processes, such as ViZDoom's engine, inherit the pin, so their time counts too), times that core's
      busy fraction over the run from ``/proc/stat`` (the waits between a process and its engine are not
      counted as work);
    * ``inference``: ``ActorCritic.act`` on one thread, per sample, in batches of
      ``num_workers x num_envs_per_worker`` (every env of every worker at once: the largest batch an
      inference worker can gather, so the cheapest per sample);
    * ``learner``: ``Learner.train`` on one thread (a whole iteration: bootstrap forward, ``num_epochs``
      forward + backward passes, optimiser steps), per sample.

    One thread is where a core does the most of this work; more threads on the same cores only add
    synchronisation. So ``cores / (env + inference + learner)`` bounds the training steps per second
    any framework can reach doing exactly this work on this machine (the *CPU ceiling*), before any
    cost of moving data between processes.
    """
    import torch

    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.learning.learner import Learner
    from msf.model.actor_critic import ActorCritic
    from msf.runtime.affinity import usable_cores

    core = usable_cores()[-1]
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_env_cost_proc, args=(flags, seconds, core, q))
    p.start()
    q.get(timeout=300)
    b0, t0 = _core_ticks(core)
    steps, elapsed = q.get(timeout=seconds + 300)
    b1, t1 = _core_ticks(core)
    p.join(timeout=60)
    env_ms = 1000.0 * elapsed * (b1 - b0) / max(t1 - t0, 1) / steps  # the busy share of the loop's time

    cfg, given = parse_args(flags)
    cfg = apply_family_defaults(cfg, given)
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env, env_config_of(cfg))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = ActorCritic(cfg, spaces).eval()
        n = cfg.num_workers * cfg.num_envs_per_worker
        g = torch.Generator().manual_seed(0)
        obs = (
            torch.randint(0, 256, (n, *spaces.obs_shape), generator=g).to(torch.uint8)
            if spaces.obs_dtype == np.uint8
            else torch.randn(n, *spaces.obs_shape, generator=g)
        )
        states = torch.zeros(n, derived.rnn_state_size) if derived.rnn_state_size else None
        with torch.inference_mode():
            for _ in range(3):
                policy.act(obs, states)
            k, t = 0, time.perf_counter()
            while time.perf_counter() - t < seconds / 3 or k < 3:
                policy.act(obs, states)
                k += 1
            inference_ms = 1000.0 * (time.perf_counter() - t) / (k * n)
        learner = Learner(cfg, derived, spaces, "cpu")
        batch = _random_batch(cfg, derived, spaces)
        B, T = batch["rewards"].shape
        learner.train({k: v.clone() for k, v in batch.items()})
        k, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds or k < 2:
            learner.train({k_: v.clone() for k_, v in batch.items()})
            k += 1
        learner_ms = 1000.0 * (time.perf_counter() - t) / (k * B * T)
    finally:
        torch.set_num_threads(threads)
    return {
        "env": env_ms,
        "inference": inference_ms,
        "learner": learner_ms,
        "inference_batch": n,
        "env_core_busy": (b1 - b0) / max(t1 - t0, 1),
    }


def _random_batch(cfg, derived, spaces) -> dict:
    """One learner iteration's trajectories of random observations, actions and rewards."""
    import torch

    B, T = derived.trajectories_per_iteration, cfg.rollout
    g = torch.Generator().manual_seed(0)
    obs = (
        torch.randint(0, 256, (B, T + 1, *spaces.obs_shape), generator=g).to(torch.uint8)
        if spaces.obs_dtype == np.uint8
        else torch.randn(B, T + 1, *spaces.obs_shape, generator=g)
    )
    act_shape = spaces.action_shape
    actions = (
        torch.randint(
            0,
            spaces.num_actions if spaces.action_nvec is None else min(spaces.action_nvec),
            (B, T, *act_shape),
            generator=g,
        )
        if spaces.discrete
        else torch.randn(B, T, *act_shape)
    )
    batch = {
        "obs": obs,
        "actions": actions,
        "log_probs": torch.full((B, T), -1.0),
        "values": torch.zeros(B, T),
        "rewards": torch.randn(B, T, generator=g),
        "dones": torch.zeros(B, T, dtype=torch.uint8),
        "time_outs": torch.zeros(B, T, dtype=torch.uint8),
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
    }
    if derived.rnn_state_size:
        batch["rnn_states"] = torch.zeros(B, T + 1, derived.rnn_state_size)
    return batch


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_tree_costs(root: int, names: dict[int, str]) -> dict[int, tuple[str, float, float, int, int]]:
    """pid -> (role, CPU seconds so far, of them in the kernel, voluntary, involuntary context switches) of ``root``
    and every process
    below it, read from ``/proc`` (Linux; empty elsewhere). ``role``: ``names[pid]`` for the processes named there
    (msf's workers), "main" for ``root``, else "other" (an env's helper process, such as a ViZDoom engine, or
    multiprocessing's resource tracker). CPU seconds are user + system time of the process itself, not of its
    children: each process of the tree is read on its own."""
    stats: dict[int, tuple[int, float, float]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after "pid (comm)": state ppid ... utime (field 14 of the whole line) stime (15)
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK)
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    out = {}
    for pid in tree:
        if pid not in stats:
            continue
        switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in switches:
                        switches[key] = int(value)
        except OSError:
            continue
        role = "main" if pid == root else names.get(pid, "other")
        vol, invol = switches["voluntary_ctxt_switches"], switches["nonvoluntary_ctxt_switches"]
        out[pid] = (role, stats[pid][1], stats[pid][2], vol, invol)
    return out


def cost_breakdown(before: dict, after: dict, steps: int) -> dict[str, tuple[float, float, float]]:
    """Per role (rollout workers, inference workers, main, other; summed over the processes of a role):
    (core-microseconds per env step, of them in the kernel, context switches per env step) between two
    :func:`process_tree_costs` readings, and "all" for the whole tree."""
    out: dict[str, list[float]] = {}
    for pid, (role, cpu, kernel, vol, invol) in after.items():
        _, cpu0, kernel0, vol0, invol0 = before.get(pid, (role, 0.0, 0.0, 0, 0))
        kind = role.rstrip("0123456789_").removesuffix("_p")
        for key in (kind, "all"):
            acc = out.setdefault(key, [0.0, 0.0, 0.0])
            acc[0] += cpu - cpu0
            acc[1] += kernel - kernel0
            acc[2] += (vol - vol0) + (invol - invol0)
    n = max(steps, 1)
    return {k: (1e6 * cpu / n, 1e6 * kernel / n, sw / n) for k, (cpu, kernel, sw) in out.items()}


def sampler_fps(flags: list[str], seconds: float, warmup: float, breakdown: dict | None = None) -> float:
    """(b): env steps/s of the real rollout and inference workers, trajectories discarded unread.

    ``breakdown``: when given, filled with :func:`cost_breakdown` of the measured window (where the CPU time
    went per process role, per env step)."""
    import queue as queue_mod

    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived
    from msf.envs.registry import env_spaces
    from msf.model.actor_critic import ActorCritic
    from msf.sampling.messages import SlotsReturned
    from msf.sampling.plan import DeviceGroup
    from msf.sampling.process_sampler import ProcessSampler
    from msf.sampling.published_weights import PublishedWeights
    from msf.sampling.trajectory_buffer import TrajectoryBuffer

    cfg, _ = parse_args(flags)
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env)
    model = ActorCritic(cfg, spaces)
    weights = PublishedWeights(model)
    weights.publish(model, 0)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    ch = ProcessSampler(cfg, derived, spaces, DeviceGroup(buffer, [weights] * cfg.num_policies))
    steps, t_start, t_end = 0, None, time.monotonic() + warmup + seconds + 60
    names = {p.pid: p.name for p in ch.procs if p.pid is not None}
    try:
        while time.monotonic() < t_end:
            try:
                msg = ch.full_queue.get(timeout=1.0)
            except queue_mod.Empty:
                continue
            ch.free_queues[msg.worker].put(SlotsReturned(msg.slots))
            while True:  # the episode statistics, read as the training loop reads them (an unread queue fills its pipe)
                try:
                    ch.stats_queue.get_nowait()
                except queue_mod.Empty:
                    break
            if t_start is None and time.monotonic() > t_end - 60 - seconds:
                t_start, steps = time.monotonic(), 0
                if breakdown is not None:
                    costs0 = process_tree_costs(os.getpid(), names)
            elif t_start is not None:
                steps += len(msg.slots) * cfg.rollout
                if time.monotonic() - t_start >= seconds:
                    if breakdown is not None:
                        breakdown.update(cost_breakdown(costs0, process_tree_costs(os.getpid(), names), steps))
                        breakdown["wall_s"] = (time.monotonic() - t_start, 0.0, 0.0)
                    break
        if t_start is None:
            raise RuntimeError(f"no trajectory came in {warmup + seconds + 60:.0f} s: the sampler did not start")
        rate = steps / (time.monotonic() - t_start)
    finally:
        ch.stop()
        # a worker exits only once its queues' feeder threads have written what they hold: read on until they do
        deadline = time.monotonic() + 30
        while any(p.is_alive() for p in ch.procs) and time.monotonic() < deadline:
            for q in (ch.full_queue, ch.stats_queue):
                try:
                    while True:
                        q.get_nowait()
                except queue_mod.Empty:
                    pass
            time.sleep(0.05)
        ch.close()
    return rate


def msf_train_fps(flags: list[str], seconds: float, warmup: float) -> tuple[float, int]:
    """(c): steady-state training FPS: frames gained between the first and the last summary after
    ``warmup``, over the seconds between them (env frames; summaries come right after a learner
    iteration, so the span holds whole iterations)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exe = os.path.join(os.path.dirname(sys.executable), "msf-train")
    with tempfile.TemporaryDirectory() as td:
        t0 = time.time()
        subprocess.run(
            [
                exe,
                *flags,
                "--experiment=tput",
                f"--train_dir={td}",
                f"--train_for_seconds={int(seconds)}",
                "--experiment_summaries_interval=5",
                "--with_progress_bar=False",
                "--restart_behavior=overwrite",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        acc = EventAccumulator(os.path.join(td, "tput", "tensorboard"), size_guidance={"scalars": 0})
        acc.Reload()
        pts = [e for e in acc.Scalars("perf/fps") if e.wall_time - t0 >= warmup]
        rate = (pts[-1].step - pts[0].step) / (pts[-1].wall_time - pts[0].wall_time)
        return rate, int(acc.Scalars("perf/fps")[-1].step)


def allreduce_median_s(numel: int, reps: int, warmup: int = 5) -> float:
    """Median seconds of one all-reduce of ``numel`` float32 zeros in the initialised default process group
    (each timed after a barrier, after ``warmup`` untimed ones). Collective: every rank calls it alike."""
    import torch
    import torch.distributed as dist

    t = torch.zeros(numel)
    for _ in range(warmup):
        dist.all_reduce(t)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _allreduce_proc(rank: int, world: int, port: int, numel: int, reps: int, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out[rank] = allreduce_median_s(numel, reps)
    dist.destroy_process_group()


def allreduce_seconds(numel: int, world: int = 2, reps: int = 50) -> float:
    """Median seconds of one gloo all-reduce of ``numel`` float32 values between ``world`` processes."""
    import socket

    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp.Manager().dict()
    tmp.spawn(_allreduce_proc, args=(world, port, numel, reps, out), nprocs=world, join=True)
    return max(out.values())


def model_numel(flags: list[str]) -> int:
    from msf.cfg.arguments import parse_args
    from msf.envs.registry import env_spaces
    from msf.model.actor_critic import ActorCritic

    cfg, _ = parse_args(flags)
    return sum(p.numel() for p in ActorCritic(cfg, env_spaces(cfg.env)).parameters())


def sf2_train_fps(python: str, flags: list[str], seconds: float, warmup: float) -> float | None:
    """(d): Sample Factory 2's steady-state FPS: frames gained between its first and last report after
    ``warmup`` ('Total num frames: N' lines), over the seconds between them."""
    rx = re.compile(r"Total num frames: (\d+)")
    with tempfile.TemporaryDirectory() as td:
        cmd = [
            python,
            "-m",
            "sf_examples.train_gym_env",
            *flags,
            "--algo=APPO",
            "--use_rnn=False",
            "--experiment=tput_sf2",
            f"--train_dir={td}",
            "--restart_behavior=overwrite",
            "--with_wandb=False",
        ]
        t0 = time.time()
        # its own session, so that the whole process group (SF2 spawns workers) can be stopped
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=td, start_new_session=True
        )
        values = []
        assert p.stdout is not None, "a pipe was asked for"
        try:
            for line in p.stdout:
                m = rx.search(line)
                if m and time.time() - t0 >= warmup:
                    values.append((time.time(), int(m.group(1))))
                if time.time() - t0 >= seconds:
                    break
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if len(values) < 2:
            return None
        return (values[-1][1] - values[0][1]) / (values[-1][0] - values[0][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the training runs (c) and (d)")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--procs", type=int, default=os.cpu_count())
    ap.add_argument("--sf2_python", default=None)
    ap.add_argument("--nproc_sweep", type=int, nargs="*", default=[], help="e.g. 1 2: device groups to compare")
    ap.add_argument("flags", nargs="*", help="msf-train flags (after --); default: the SF2 CartPole command line")
    a = ap.parse_args()
    flags = a.flags or SF_CARTPOLE
    env = next(f.split("=", 1)[1] for f in flags if f.startswith("--env="))
    print("flags:", " ".join(flags), flush=True)
    raw = raw_env_fps(env, a.procs, 10.0)
    print(f"(a) raw env, {a.procs} processes: {raw:,.0f} steps/s", flush=True)
    smp = sampler_fps(flags, 20.0, 10.0)
    print(f"(b) msf sampler, no learning: {smp:,.0f} steps/s", flush=True)
    trn, frames = msf_train_fps(flags, a.seconds, a.warmup)
    print(f"(c) msf training: {trn:,.0f} FPS (steady state; {frames:,} frames in {a.seconds:.0f} s)", flush=True)
    sf2 = sf2_train_fps(a.sf2_python, flags, a.seconds + 30, a.warmup + 10) if a.sf2_python else None
    print("\n| stage | FPS | ratio to (a) |\n|---|---|---|")
    print(f"| (a) raw env, random actions, {a.procs} processes | {raw:,.0f} | 1.00 |")
    print(f"| (b) msf sampler (policy, no learning) | {smp:,.0f} | {smp / raw:.3f} |")
    print(f"| (c) msf training | {trn:,.0f} | {trn / raw:.3f} |")
    if sf2 is not None:
        print(f"| (d) Sample Factory 2.1.1 training, same flags | {sf2:,.0f} | {sf2 / raw:.3f} |")
        print(f"\nmsf training / Sample Factory 2 training: {trn / sf2:.2f}x")
    if a.nproc_sweep:
        # one inference worker per device group, so that every group has a rollout worker to serve
        sweep = flags + ["--policy_workers_per_policy=1"]
        print("\nsweep flags:", " ".join(sweep), flush=True)
        rows = [(n, msf_train_fps(sweep + [f"--nproc_per_node={n}"], a.seconds, a.warmup)[0]) for n in a.nproc_sweep]
        numel = model_numel(flags)
        ar = allreduce_seconds(numel)
        print("\n| device groups (--nproc_per_node) | training FPS | ratio to 1 |\n|---|---|---|")
        base = dict(rows).get(1, rows[0][1])
        for n, fps in rows:
            print(f"| {n} | {fps:,.0f} | {fps / base:.2f} |")
        print(
            f"\none gloo all-reduce of the gradients, 2 processes: {ar * 1e3:.2f} ms for {numel:,} parameters "
            f"({numel * 4 / 2**20:.2f} MiB)"
        )


if __name__ == "__main__":
    main()
