"""A scaling model: training FPS and weak-scaling efficiency of 1-64 device groups on machines we do not have.

Inputs, measured in this run on this machine (one workload at a time: CartPole-v1 with Sample Factory's CartPole
line, or atari_pong / doom_basic with the family arguments of ``families.py``):

* ``train``: core-seconds per env step of a whole msf training run, every process of it (``/proc``, over
  ``--seconds`` after ``--warmup``), and the share of the machine's cores it kept busy;
* ``zero``: the same for the sampler with a policy that costs nothing (``pipeline_overhead.py``'s (b)): what is left
  on the CPU when the policy's arithmetic runs elsewhere (a GPU): the envs and msf's plumbing;
* ``learner``: seconds of ``Learner.train`` per env step on one thread (``--device cuda`` on a GPU machine);
* a gloo all-reduce between 2 processes at several message sizes, over loopback and over a veth pair between two
  network namespaces (the link the node tests build), fitted to ``t(n) = a + n / b`` (a: latency, b: bandwidth).

The model (its assumptions, each a place where a real machine may differ):

1. A device group with ``c`` cores (``cores_per_node / groups_per_node``) does ``c x busy / train`` env steps per
   second on a CPU-only machine: its core-time per step stays what it is here (no worse for more processes, no
   better for caches of their own) and its cores are as busy as here.
2. Its learner must keep up: per env step it spends ``learner`` (on one thread; divided by the speed-up of two
   threads measured here when the group has 2 cores or more, and no more for more cores: small matrices gain
   little from more threads) plus ``num_epochs / batch_size`` SGD steps' all-reduce of the gradients (DDP's
   overlap with the backward pass is ignored: an upper bound on its cost). A group's FPS is the lower of the two
   bounds.
3. The all-reduce of ``W`` replicas is a ring: ``2 (W - 1)`` latencies and ``2 (W - 1) / W`` times the gradients'
   bytes over the bandwidth, over loopback within a node, over the slowest link (the veth pair, or the
   ``--net_gbps`` / ``--net_latency_us`` given) when the groups span nodes.
4. With a GPU per group, the CPU does only ``zero`` per step, and the learner's rate is ``--gpu_learner_sps`` (env
   steps per second of ``Learner.train`` on that GPU; measured with ``--device cuda`` there, never assumed here:
   without it the GPU table is not printed). Inference on the GPU is assumed not to bind.

Weak-scaling efficiency: FPS of ``W`` groups over ``W`` times one group's with the same cores per group.

The check: the model's prediction for what can be run here (1 group on 2 cores; 2 groups on 1 node; 2 "nodes" of
one group each in two network namespaces), from the inputs above, against msf-train's measured FPS, in one run.

Sampler nodes (``--sampler_nodes``, issue 37): the frames/s of one learner group fed by ``k`` sampler nodes of ``C``
cores each, over a link of ``B`` MB/s, with ``sampler_nodes.py``'s workloads (its node's workers). Inputs, measured
in this run:

* ``node``: core-seconds per env step of the node's sampling (envs and inference: the sampler with its policy and
  the node's workers, as in ``sampler_fps``), and the share of the cores it kept busy;
* ``send``: the node's transport per env step, on one thread: copying a window of trajectories out of its buffer,
  packing them and their HMAC (``wire.sign``); ``recv``: the job's, on one thread: checking the HMAC and every
  field (``wire.verify``, ``wire.unpack_trajectories``) and copying them into the buffer;
* ``bytes``: the signed message's bytes per env step; ``learner``: seconds of ``Learner.train`` per env step.

The model: frames/s = frameskip x the lowest of three bounds, each an assumption:

1. the nodes: ``k x C x busy / (node + send)`` (each node as busy as the sampler here, the transport on its cores);
2. the learner group: ``1 / (learner + recv)``: the endpoint's thread shares the learner's process and its GIL, so
   the two are serial (``learner`` is ``1 / --gpu_learner_sps`` on a GPU);
3. the link: ``B / bytes`` (ZeroMQ's framing, TCP and the pings not counted).

A node on the job's own ``C`` cores (the check, the runs of issue 37's number 7) shares them with the learner:
``C x busy / (node + send + learner + recv)``, and the learner's bound. The check runs ``sampler_nodes.py``'s two
arms (a learner fed by one node over loopback, and the all-local run) and prints the prediction against them.
What it leaves out, and the check shows: the transport's per-message and per-process costs (the node's main loop
and ZeroMQ's threads, the endpoint thread's polling in the learner's process, the node's join in the run's wall
time); its serialisation alone is under a core-microsecond per CartPole step, so the model predicts the fed run at
the all-local run's rate (1.00); measured on a quiet machine: 0.94-1.07 in steady state, 0.81-0.97 with the
node's start and join in the run's wall time.

Usage: python benchmarks/scaling_model.py [--workload cartpole|atari_pong|doom_basic] [--seconds 30] [--warmup 15]
       [--gpu_learner_sps N] [--net_gbps G --net_latency_us U] [--device cpu|cuda] [--skip_check]
       python benchmarks/scaling_model.py --sampler_nodes [--workload cartpole|atari_pong] [--link_mbps B]
       [--gpu_learner_sps N] [--skip_check]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "helpers"))  # netns
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

from families import WORKLOADS  # noqa: E402
from netns import veth_pair  # noqa: E402
from throughput import SF_CARTPOLE, allreduce_median_s, process_tree_costs, sampler_fps  # noqa: E402

ZERO = ["--encoder_custom=zero_policy:zero"]
SIZES = (1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22)  # float32 values per all-reduce
CORES = (8, 16, 32, 64, 128)
GROUPS = (1, 2, 4, 8, 16, 32, 64)
GROUPS_PER_NODE = 8  # GPUs per node, as on the machines our users have


@dataclass
class Link:
    """A link's all-reduce between 2 processes: ``latency_s + bytes / bytes_per_s``."""

    latency_s: float
    bytes_per_s: float

    def ring_allreduce_s(self, world: int, nbytes: int) -> float:
        """Seconds of a ring all-reduce of ``nbytes`` over ``world`` replicas (0 for one)."""
        if world <= 1:
            return 0.0
        # a 2-rank measurement is 2 latencies + the bytes once, so the fitted latency is two of the ring's steps
        return (world - 1) * self.latency_s + 2 * (world - 1) / world * nbytes / self.bytes_per_s


@dataclass
class Inputs:
    train_core_s: float  # core-seconds per env step, whole training run
    busy: float  # share of the cores the training run kept busy
    zero_core_s: float  # core-seconds per env step, the zero-cost sampler
    learner_s: float  # seconds of Learner.train per env step, one thread
    learner_speedup: float  # its speed-up on two threads
    grad_bytes: int
    sgd_per_step: float  # SGD steps (all-reduces) per env step: num_epochs / batch_size
    frames: int  # frames per env step
    loopback: Link
    network: Link


def fit_link(sizes_bytes: list[int], seconds: list[float]) -> Link:
    """``t = a + n / b`` through the smallest and the largest message (the small one's time is the latency;
    a least-squares line over sizes that span three decades is set by the large ones alone)."""
    (n0, t0), (n1, t1) = min(zip(sizes_bytes, seconds)), max(zip(sizes_bytes, seconds))
    b = (n1 - n0) / max(t1 - t0, 1e-12)
    return Link(max(t0 - n0 / b, 0.0), b)


def predict_cpu(i: Inputs, cores_per_node: float, world: int, groups_per_node: int) -> float:
    """Training frames/s of ``world`` device groups, ``groups_per_node`` per node of ``cores_per_node`` cores."""
    c = cores_per_node / groups_per_node
    link = i.loopback if world <= groups_per_node else i.network
    ar = i.sgd_per_step * link.ring_allreduce_s(world, i.grad_bytes)
    learner = i.learner_s / (i.learner_speedup if c >= 2 else 1.0)
    per_group = min(c * i.busy / i.train_core_s, 1.0 / (learner + ar))
    return world * per_group * i.frames


def predict_gpu(i: Inputs, cores_per_node: int, world: int, groups_per_node: int, gpu_sps: float) -> float:
    """The same with a GPU per group: the CPU does the sampler's work; the learner runs at ``gpu_sps``."""
    c = cores_per_node / groups_per_node
    link = i.loopback if world <= groups_per_node else i.network
    ar = i.sgd_per_step * link.ring_allreduce_s(world, i.grad_bytes)
    per_group = min(c * i.busy / i.zero_core_s, 1.0 / (1.0 / gpu_sps + ar))
    return world * per_group * i.frames


# --- measuring -----------------------------------------------------------------------------------------------


def workload_flags(name: str) -> tuple[list[str], int]:
    if name == "cartpole":
        return list(SF_CARTPOLE), 1
    return [*WORKLOADS[name], "--device=cpu"], 4


def _tb_steps(tb_dir: str) -> list[tuple[float, int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.wall_time, e.step) for e in acc.Scalars("perf/fps")]


def _steps_at(points: list[tuple[float, int]], t: float) -> float:
    """The run's step count at wall time ``t``, interpolated between its summaries."""
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return s0 + (s1 - s0) * (t - t0) / max(t1 - t0, 1e-9)
    raise ValueError(f"wall time {t} outside the run's summaries")


def train_costs(flags: list[str], seconds: float, warmup: float, frames: int) -> tuple[float, float, float]:
    """(core-seconds per env step of the whole training run, share of the machine's cores busy, env steps/s)
    over ``seconds`` after ``warmup``."""
    exe = os.path.join(os.path.dirname(sys.executable), "msf-train")
    with tempfile.TemporaryDirectory() as td:
        cmd = [
            exe,
            *flags,
            "--experiment=cost",
            f"--train_dir={td}",
            f"--train_for_seconds={int(warmup + seconds + 10)}",
            "--experiment_summaries_interval=1",
            "--with_progress_bar=False",
        ]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(warmup)
        t0, c0 = time.time(), process_tree_costs(p.pid, {})
        time.sleep(seconds)
        t1, c1 = time.time(), process_tree_costs(p.pid, {})
        p.wait(timeout=300)
        points = _tb_steps(os.path.join(td, "cost", "tensorboard"))
    inside = [(t, n) for t, n in points if t0 <= t <= t1]
    if len(inside) >= 2 and (points[0][0] > t0 or points[-1][0] < t1):  # a slow start: the summaries in the window
        rate = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
        steps = rate * (t1 - t0) / frames
    else:
        steps = (_steps_at(points, t1) - _steps_at(points, t0)) / frames
    cpu = sum(v[1] for v in c1.values()) - sum(c0.get(pid, (None, 0.0))[1] for pid in c1)
    cores = len(os.sched_getaffinity(0))
    return cpu / steps, cpu / ((t1 - t0) * cores), steps / (t1 - t0)


def zero_core_s(flags: list[str], seconds: float, warmup: float) -> float:
    costs: dict = {}
    sampler_fps(flags + ZERO, seconds, warmup, breakdown=costs)
    return costs["all"][0] * 1e-6


def learner_seconds_per_step(flags: list[str], device: str, seconds: float = 10.0, threads: int = 1) -> float:
    """Seconds of ``Learner.train`` per env step (one iteration of random data, ``threads`` torch threads)."""
    import torch
    from throughput import _random_batch

    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.learning.learner import Learner

    cfg, given = parse_args(flags)
    cfg = apply_family_defaults(cfg, given)
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env, env_config_of(cfg))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        learner = Learner(cfg, derived, spaces, device)
        batch = _random_batch(cfg, derived, spaces)
        B, T = batch["rewards"].shape
        learner.train({k: v.clone() for k, v in batch.items()})
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        sync()
        k, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds or k < 2:
            learner.train({k_: v.clone() for k_, v in batch.items()})
            k += 1
        sync()
        return (time.perf_counter() - t) / (k * B * T)
    finally:
        torch.set_num_threads(before)


def grad_bytes_and_sgd_rate(flags: list[str]) -> tuple[int, float]:
    from msf.cfg.arguments import parse_args
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.model.actor_critic import ActorCritic

    cfg, given = parse_args(flags)
    cfg = apply_family_defaults(cfg, given)
    model = ActorCritic(cfg, env_spaces(cfg.env, env_config_of(cfg)))
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return 4 * numel, cfg.num_epochs / cfg.batch_size


def _allreduce_rank(rank: int, addr: str, port: int, sizes: list[int], reps: int) -> None:
    """One rank of the all-reduce measurement (run in a network namespace); prints JSON seconds per size."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
    out = {numel: allreduce_median_s(numel, reps, warmup=3) for numel in sizes}
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def allreduce_curve(netns: bool, reps: int = 30) -> dict[int, float]:
    """Seconds of one 2-rank gloo all-reduce per size in ``SIZES`` (float32 values): over loopback, or over a
    veth pair between two network namespaces (needs root)."""
    port = 29600 + os.getpid() % 300
    with veth_pair("msfsm", "10.231.9") if netns else contextlib.nullcontext() as pair:
        procs = []
        for r in range(2):
            prefix = pair.prefix(r) if pair else []
            env = {**os.environ, **({"GLOO_SOCKET_IFNAME": pair.veth[r]} if pair else {})}
            cmd = [
                sys.executable,
                __file__,
                "--_allreduce_rank",
                str(r),
                "--_addr",
                pair.addrs[0] if pair else "127.0.0.1",
            ]
            cmd += ["--_port", str(port), "--_reps", str(reps)]
            procs.append(subprocess.Popen(prefix + cmd, stdout=subprocess.PIPE, text=True, env=env))
        outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    return {int(k): max(o[k] for o in outs) for k in outs[0]}


def nodes_train_fps(flags: list[str], seconds: float, warmup: float, frames: int) -> float:
    """Env steps/s of 2 "nodes" of one device group each, in two network namespaces over a veth pair (rank 0's
    summaries, over ``seconds`` after ``warmup``)."""
    port = 29900 + os.getpid() % 90
    with veth_pair("msfsm", "10.231.9") as pair, tempfile.TemporaryDirectory() as td:
        procs = []
        for node in range(2):
            cmd = [*pair.prefix(node), sys.executable, "-m", "msf.train", *flags]
            cmd += ["--experiment=nodes", f"--train_dir={td}/node{node}", "--nnodes=2", f"--node_rank={node}"]
            cmd += [f"--hosts={pair.addrs[0]},{pair.addrs[1]}", f"--master_port={port}", "--with_progress_bar=False"]
            cmd += [f"--train_for_seconds={int(warmup + seconds + 10)}", "--experiment_summaries_interval=1"]
            env = {**os.environ, "GLOO_SOCKET_IFNAME": pair.veth[node]}
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        t_start = time.time()
        for p in procs:
            p.wait(timeout=warmup + seconds + 300)
        points = _tb_steps(os.path.join(td, "node0", "nodes", "tensorboard"))
    pts = [(t, s) for t, s in points if t >= t_start + warmup]
    return (pts[-1][1] - pts[0][1]) / frames / (pts[-1][0] - pts[0][0])


# --- sampler nodes ------------------------------------------------------------------------------------------


@dataclass
class FedInputs:
    """Per env step: what a learner group fed by sampler nodes costs (the module's docstring)."""

    node_core_s: float  # core-seconds on a node: envs and inference
    node_busy: float  # share of the node's cores its sampler kept busy
    send_core_s: float  # the node's transport: copy out of its buffer, pack, HMAC
    recv_core_s: float  # the job's: HMAC check, field checks, copy into its buffer
    learner_s: float  # seconds of Learner.train, one thread
    bytes_per_step: float  # the signed message's bytes
    frames: int  # frames per env step


def predict_fed(i: FedInputs, k: int, cores: float, link_mb_s: float, gpu_sps: float | None) -> tuple[float, str]:
    """(frames/s of one learner group fed by ``k`` nodes of ``cores`` cores over a ``link_mb_s`` MB/s link, the
    binding bound: ``nodes``, ``learner`` or ``link``)."""
    learner = 1.0 / gpu_sps if gpu_sps else i.learner_s
    bounds = {
        "nodes": k * cores * i.node_busy / (i.node_core_s + i.send_core_s),
        "learner": 1.0 / (learner + i.recv_core_s),
        "link": link_mb_s * 1e6 / i.bytes_per_step,
    }
    which = min(bounds, key=bounds.__getitem__)
    return bounds[which] * i.frames, which


def predict_fed_shared(i: FedInputs, cores: float) -> float:
    """Frames/s of a learner fed by one node on the same ``cores`` cores (the node and the learner share them)."""
    shared = cores * i.node_busy / (i.node_core_s + i.send_core_s + i.learner_s + i.recv_core_s)
    return min(shared, 1.0 / (i.learner_s + i.recv_core_s)) * i.frames


def transport_costs(flags: list[str], seconds: float = 3.0) -> tuple[float, float, float]:
    """(the node's and the job's core-seconds per env step for the transport, bytes per env step) of one message
    of a window of trajectories (``trajectories_per_iteration``, at most a message's), each side timed on this
    thread's CPU clock."""
    import torch

    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.sampling import wire
    from msf.sampling.trajectory_buffer import TrajectoryBuffer

    cfg, given = parse_args(flags)
    cfg = apply_family_defaults(cfg, given)
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    derived = Derived.of(cfg, spaces.num_agents)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    fields = wire.trajectory_fields(TrajectoryBuffer.layout(cfg, derived, spaces))
    views = buffer.numpy_views()
    n = min(derived.trajectories_per_iteration, wire.MAX_TRAJECTORIES_PER_MESSAGE)
    slots, key = torch.arange(n), os.urandom(wire.KEY_BYTES)
    header = {"policies": [0] * n, "sent": n, "sampled": n, "seq": 1}

    def per_step(work) -> float:
        k, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds or k < 3:
            work()
            k += 1
        return (time.process_time() - t0) / (k * n * cfg.rollout)

    def send() -> list[bytes]:
        return wire.sign(key, "traj", header, wire.pack_trajectories(buffer.gather(slots), fields))

    msg = send()

    def receive() -> None:
        _, h, payload = wire.verify(key, msg)
        _, arrays = wire.unpack_trajectories(h, payload, fields, [0], spaces.num_actions, spaces.discrete)
        for name, a in arrays.items():
            views[name][slots.numpy()] = a

    receive()  # the message passes the checks (a zero buffer: finite, version 0, action 0)
    bytes_per_step = sum(map(len, msg)) / (n * cfg.rollout)
    return per_step(send), per_step(receive), bytes_per_step


def node_sampler_costs(flags: list[str], seconds: float, warmup: float) -> tuple[float, float]:
    """(core-seconds per env step of the sampler with its policy and these workers, share of the cores busy)."""
    costs: dict = {}
    fps = sampler_fps(flags, seconds, warmup, breakdown=costs)
    core_s = costs["all"][0] * 1e-6
    return core_s, core_s * fps / len(os.sched_getaffinity(0))


def sampler_nodes_main(a: argparse.Namespace) -> None:
    """``--sampler_nodes``: measure the inputs, print the table and the check against issue 37's number 7."""
    import sampler_nodes as sn

    if a.workload not in sn.ENVS:
        raise SystemExit(f"--sampler_nodes: --workload must be one of {sorted(sn.ENVS)}")
    job_flags, (workers, envs), frames, _ = sn.ENVS[a.workload]  # frames: per env step (the frameskip)
    node_flags = [*job_flags, f"--num_workers={workers}", f"--num_envs_per_worker={envs}"]
    print("node flags:", " ".join(node_flags), flush=True)
    send_s, recv_s, nbytes = transport_costs(node_flags)
    node_s, busy = node_sampler_costs(node_flags, a.seconds, a.warmup)
    learner_s = learner_seconds_per_step(node_flags, a.device)
    i = FedInputs(node_s, busy, send_s, recv_s, learner_s, nbytes, frames)
    print("\nInputs (per env step):")
    print(f"  node sampling (envs + inference): {node_s * 1e6:,.1f} core-us, cores busy {busy:.2f}")
    print(f"  node transport (copy, pack, HMAC): {send_s * 1e6:,.2f} core-us; job (HMAC, checks, copy): "
          f"{recv_s * 1e6:,.2f} core-us")  # fmt: skip
    print(f"  learner ({a.device}, one thread): {learner_s * 1e6:,.1f} us; {nbytes:,.1f} bytes ({nbytes / frames:,.1f} "
          "per frame)")  # fmt: skip
    gpu = a.gpu_learner_sps or math.inf
    for learner_sps, learner_name in (
        (None, f"this machine's learner on {a.device}"),
        (gpu, f"a GPU learner of {gpu:,.0f} env steps/s" if gpu < math.inf else "a learner that keeps up"),
    ):
        print(f"\nOne learner group ({learner_name}) fed by k sampler nodes over {a.link_mbps:,.0f} MB/s: predicted "
              "frames/s (binding bound)")  # fmt: skip
        _fed_table(i, a.link_mbps, learner_sps)
    if a.skip_check:
        return
    cores = len(os.sched_getaffinity(0))
    predicted = predict_fed_shared(i, cores)
    print(f"\nThe check: a learner fed by one node over loopback on the same {cores} cores (issue 37's number 7), "
          "frames/s of the run (start-up included)")  # fmt: skip
    print("| run | predicted | measured | measured / predicted |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as td:
        remote = sn.arm(a.workload, "loopback", a.check_frames, td)
        local = sn.arm(a.workload, "local", a.check_frames, td)
    r_fps, l_fps = remote["frames_per_s"], local["frames_per_s"]
    print(f"| sampler node (this run) | {predicted:,.0f} | {r_fps:,} | {r_fps / predicted:.2f} |")
    # the same work without the transport: how much of the miss is the sampling and learning, how much the transport
    local_predicted = min(cores * i.node_busy / (i.node_core_s + i.learner_s), 1.0 / i.learner_s) * i.frames
    print(f"| all-local (this run) | {local_predicted:,.0f} | {l_fps:,} | {l_fps / local_predicted:.2f} |")
    ratio = r_fps / l_fps
    r_st, l_st = remote["steady_frames_per_s"], local["steady_frames_per_s"]
    steady = f"{r_st / l_st:.2f}" if r_st and l_st else "-"
    print(f"node / all-local: predicted {predicted / local_predicted:.2f}, measured {ratio:.2f} (steady state "
          f"{steady}); bytes per frame {remote['bytes_per_frame']}")  # fmt: skip
    recorded = _recorded_fed_runs(a.workload)
    for r in recorded:
        print(f"| recorded: {r['arm']}, round {r['round']} (another invocation) | {predicted:,.0f} | "
              f"{r['frames_per_s']:,} | {r['frames_per_s'] / predicted:.2f} |")  # fmt: skip


def _fed_table(i: FedInputs, link_mb_s: float, gpu_sps: float | None) -> None:
    node_cores = (8, 16, 32, 64)
    print("| k nodes | " + " | ".join(f"{c} cores each" for c in node_cores) + " |")
    print("|---|" + "---|" * len(node_cores))
    for k in (1, 2, 4, 8, 16, 32):
        cells = [predict_fed(i, k, c, link_mb_s, gpu_sps) for c in node_cores]
        print(f"| {k} | " + " | ".join(f"{fps:,.0f} ({which})" for fps, which in cells) + " |")


def _recorded_fed_runs(workload: str) -> list[dict]:
    """The sampler-node rows of ``results/<workload>.json``'s ``sampler_node_transport`` table (none: [])."""
    path = os.path.join(HERE, "results", f"{workload}.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        tables = json.load(f).get("tables", [])
    rows: list[dict] = next((t["rows"] for t in tables if t.get("id") == "sampler_node_transport"), [])
    return [r for r in rows if r["arm"].startswith("sampler node")]


# --- printing -----------------------------------------------------------------------------------------------


def _table(title: str, fps_of) -> None:
    """``fps_of(cores_per_group, world, groups_per_node, cores_per_node)``: predicted frames/s."""
    print(f"\n{title}")
    print("| device groups (nodes) | " + " | ".join(f"{c} cores per node" for c in CORES) + " |")
    print("|---|" + "---|" * len(CORES))
    for w in GROUPS:
        g = min(w, GROUPS_PER_NODE)
        cells = []
        for c in CORES:
            fps = fps_of(c, w, g)
            base = w * fps_of(c / g, 1, 1)  # one group with the same cores, alone
            cells.append(f"{fps:,.0f} ({fps / base:.2f})")
        print(f"| {w} ({max(w // g, 1)}) | " + " | ".join(cells) + " |")


def print_tables(i: Inputs, gpu_sps: float | None) -> None:
    _table(
        f"CPU-only nodes, {GROUPS_PER_NODE} groups per node at most: predicted training frames/s "
        "(weak-scaling efficiency)",
        lambda c, w, g: predict_cpu(i, c, w, g),
    )
    if gpu_sps is None:
        print("\n(no GPU table: --gpu_learner_sps was not given; measure it with --device cuda on a GPU machine)")
        return
    _table(
        f"A GPU per device group (its learner {gpu_sps:,.0f} env steps/s), {GROUPS_PER_NODE} per node at most: "
        "predicted frames/s (weak-scaling efficiency)",
        lambda c, w, g: predict_gpu(i, c, w, g, gpu_sps),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="cartpole", choices=["cartpole", *sorted(WORKLOADS)])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--device", default="cpu", help="where the learner's rate is measured (cuda on a GPU machine)")
    ap.add_argument("--gpu_learner_sps", type=float, default=None, help="env steps/s of one GPU's learner")
    ap.add_argument("--net_gbps", type=float, default=None, help="model the network as this many Gbit/s ...")
    ap.add_argument("--net_latency_us", type=float, default=None, help="... with this latency (default: the veth)")
    ap.add_argument("--skip_check", action="store_true", help="no msf-train runs of 2 groups and 2 nodes")
    ap.add_argument("--sampler_nodes", action="store_true", help="the model of a learner fed by sampler nodes")
    ap.add_argument("--link_mbps", type=float, default=1250.0, help="sampler nodes' link, MB/s (10 Gbit/s)")
    ap.add_argument("--check_frames", type=int, default=200_000, help="frames of each sampler-node check run")
    ap.add_argument("--_allreduce_rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_addr", default="127.0.0.1", help=argparse.SUPPRESS)
    ap.add_argument("--_port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--_reps", type=int, default=30, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._allreduce_rank is not None:
        _allreduce_rank(a._allreduce_rank, a._addr, a._port, list(SIZES), a._reps)
        return
    if a.sampler_nodes:
        sampler_nodes_main(a)
        return

    flags, frames = workload_flags(a.workload)
    print("flags:", " ".join(flags), flush=True)
    grad_bytes, sgd_rate = grad_bytes_and_sgd_rate(flags)
    curves = {"loopback": allreduce_curve(False)}
    try:
        curves["veth"] = allreduce_curve(True)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"veth pair between network namespaces not available ({e}); the network is modelled as loopback")
    links = {k: fit_link([4 * n for n in v], list(v.values())) for k, v in curves.items()}
    print("\n2-rank gloo all-reduce, median seconds per size (float32 values):")
    print(
        "| link | " + " | ".join(f"{n * 4 / 1024:,.0f} KiB" for n in SIZES) + " | fitted latency | fitted bandwidth |"
    )
    print("|---|" + "---|" * (len(SIZES) + 2))
    for k, v in curves.items():
        cells = " | ".join(f"{v[n] * 1e3:.3f} ms" for n in SIZES)
        print(f"| {k} | {cells} | {links[k].latency_s * 1e6:.0f} us | {links[k].bytes_per_s / 1e9:.2f} GB/s |")
    network = links.get("veth", links["loopback"])
    if a.net_gbps is not None:
        network = Link((a.net_latency_us or 20.0) * 2e-6, a.net_gbps * 1e9 / 8)

    train_s, busy, fps1 = train_costs(flags, a.seconds, a.warmup, frames)
    zero_s = zero_core_s(flags, a.seconds, a.warmup)
    learner_s = learner_seconds_per_step(flags, a.device)
    speedup = learner_s / learner_seconds_per_step(flags, a.device, threads=2) if a.device == "cpu" else 1.0
    i = Inputs(train_s, busy, zero_s, learner_s, speedup, grad_bytes, sgd_rate, frames, links["loopback"], network)
    print("\nInputs (per env step):")
    print(f"  whole training run: {train_s * 1e6:,.1f} core-us, cores busy {busy:.2f} (measured {fps1:,.0f} steps/s)")
    print(f"  zero-cost sampler: {zero_s * 1e6:,.1f} core-us")
    print(f"  learner ({a.device}, one thread): {learner_s * 1e6:,.1f} us, {speedup:.2f}x on two threads")
    print(f"  {sgd_rate:.5f} SGD steps (all-reduces) per env step")
    print(f"  gradients: {grad_bytes / 2**20:.2f} MiB per all-reduce")
    if a.device.startswith("cuda") and a.gpu_learner_sps is None:
        a.gpu_learner_sps = 1.0 / learner_s
    print_tables(i, a.gpu_learner_sps)

    if a.skip_check:
        return
    cores = len(os.sched_getaffinity(0))
    print("\nThe check on this machine (frames/s): predicted from the inputs against msf-train measured")
    print("| run | predicted | measured | measured / predicted |")
    print("|---|---|---|---|")
    rows = [("1 group", predict_cpu(i, cores, 1, 1), fps1 * frames)]
    # 2 groups share the job's workers (one each) at the same per-group batch: weak scaling
    two = [f for f in flags if not f.startswith("--policy_workers_per_policy")] + ["--policy_workers_per_policy=1"]
    _, _, fps2 = train_costs([*two, "--nproc_per_node=2"], a.seconds, a.warmup + 10, frames)
    rows.append(("2 groups, 1 node", predict_cpu(i, cores, 2, 2), fps2 * frames))
    if "veth" in links:  # two "nodes" on this machine's cores: half of them each
        fpsn = nodes_train_fps(two, a.seconds, a.warmup, frames)
        rows.append(("2 nodes of 1 group (veth)", predict_cpu(i, cores / 2, 2, 1), fpsn * frames))
    for name, pred, meas in rows:
        print(f"| {name} | {pred:,.0f} | {meas:,.0f} | {meas / pred:.2f} |")


if __name__ == "__main__":
    main()
