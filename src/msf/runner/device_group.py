"""The wiring of one device group: the whole graph on one screen.

::

    rollout worker w --(pipe: split byte)--> inference worker (w % P) --(pipe: split byte)--> rollout worker w
          |  writes obs/rewards/dones                    |  writes actions/log-probs/versions
          v                                              v
                      trajectory buffer (shared memory, one per device group)
          |  FullTrajectories (slot indices) on full_queue
          v
    training loop + learner (this process) --free slots--> free_queues[w] --> rollout worker w
          |  publish weights after each SGD step (seqlock, shared memory) --> inference workers
          +--> checkpoints, TensorBoard, summary.json (rank 0)

Back-pressure: a rollout worker with no free slot waits for the learner to return one.
Stop: the main process sets ``stop_event``; every child polls it at least every 0.5 s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from typing import Any

import torch

import msf
from msf.cfg.config import Config, Derived
from msf.distributed.collectives import collectives_of, learner_state_tensors
from msf.distributed.topology import RankInfo, split_evenly
from msf.envs.registry import EnvSpaces
from msf.learning.learner import Learner
from msf.persistence.checkpoint import load_latest_checkpoint
from msf.persistence.summaries import TensorBoardSummaries, setup_logging, write_json_atomic
from msf.runner.experiment import experiment_dir
from msf.runner.training_loop import Channels, Counters, PolicyCounters, TrainingLoop
from msf.runtime.affinity import learner_threads, set_learner_niceness, usable_cores, worker_cores
from msf.runtime.supervision import CTX, spawn, stop_children, use_quiet_executable
from msf.sampling.inference_worker import inference_worker_main
from msf.sampling.messages import InferenceCounters, RolloutCounters
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.rollout_worker import rollout_worker_main
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")


def rank_config(cfg: Config, rank: RankInfo) -> Config:
    """The config of one device group: its share of this node's rollout workers."""
    return dataclasses.replace(cfg, num_workers=split_evenly(cfg.num_workers, rank.nproc_per_node, rank.local_rank))


class RunFailed(RuntimeError):
    """The run ended with ``status: failed`` (the cause is in the message and in the log)."""


class _SignalHandler:
    """First SIGINT/SIGTERM: stop cleanly (final checkpoint). Second SIGINT: exit at once."""

    def __init__(self, loop: TrainingLoop):
        self.loop, self.count = loop, 0
        self.old = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1 and signum == signal.SIGINT:
            os._exit(130)
        log.warning(
            "received %s: stopping after the current iteration with a final checkpoint%s",
            signal.Signals(signum).name,
            " (Ctrl-C again to exit at once)" if signum == signal.SIGINT else "",
        )
        self.loop.request_stop("stopped")

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def _start_workers(
    cfg: Config,
    derived: Derived,
    spaces: EnvSpaces,
    buffer: TrajectoryBuffer,
    weights: list[PublishedWeights],
    device: str,
    stop_event: Any,
    prefix: str = "",
    node_workers: tuple[int, int] | None = None,
) -> Channels:
    """Spawn the inference workers (``policy_workers_per_policy`` per policy) and the rollout workers;
    rollout worker ``w`` has one pipe per policy, to that policy's inference worker ``w % policy_workers_per_policy``.

    ``node_workers``: (index of this group's first rollout worker among the node's, the node's rollout workers),
    for ``--set_workers_cpu_affinity``; None: this group's workers are all of the node's."""
    failures, full_queue, stats_queue = CTX.Queue(), CTX.Queue(), CTX.Queue()
    free_queues = [CTX.Queue() for _ in range(cfg.num_workers)]
    K, P = cfg.policy_workers_per_policy, cfg.num_policies
    pipes = [[CTX.Pipe(duplex=True) for _ in range(P)] for _ in range(cfg.num_workers)]
    inference_stats = [InferenceCounters() for _ in range(P * K)]
    rollout_wait = [RolloutCounters() for _ in range(cfg.num_workers)]
    procs = []
    me = os.getpid()
    for p in range(P):
        for i in range(K):
            conns = {w: pipes[w][p][0] for w in range(i, cfg.num_workers, K)}
            name = f"{prefix}inference_worker_{i}" if P == 1 else f"{prefix}inference_worker_p{p}_{i}"
            procs.append(
                spawn(
                    inference_worker_main,
                    name,
                    failures,
                    cfg,
                    derived,
                    spaces,
                    buffer,
                    p,
                    conns,
                    weights[p],
                    device,
                    stop_event,
                    me,
                    inference_stats[p * K + i],
                )
            )
    first, total = node_workers or (0, cfg.num_workers)
    cores = usable_cores()
    if cfg.set_workers_cpu_affinity and worker_cores(first, total, cores) is None:
        log.info(
            "--set_workers_cpu_affinity: %d rollout workers do not spread evenly over %d cores; none is pinned "
            "(use a multiple of the cores, or at most one worker per core)",
            total,
            len(cores),
        )
    pins = [
        worker_cores(first + w, total, cores) if cfg.set_workers_cpu_affinity else None for w in range(cfg.num_workers)
    ]
    if not cfg.set_workers_cpu_affinity:
        log.info("--set_workers_cpu_affinity=False: the rollout workers are not pinned")
    elif pins and pins[0] is not None:
        log.info("rollout workers pinned to CPU cores: %s", ", ".join(f"{w}: {c}" for w, c in enumerate(pins)))
    for w, pin in enumerate(pins):
        procs.append(
            spawn(
                rollout_worker_main,
                f"{prefix}rollout_worker_{w}",
                failures,
                pin,
                cfg,
                derived,
                w,
                buffer,
                [pipes[w][p][1] for p in range(P)],
                full_queue,
                free_queues[w],
                stats_queue,
                stop_event,
                me,
                rollout_wait[w],
            )
        )
    return Channels(full_queue, free_queues, stats_queue, failures, procs, inference_stats, rollout_wait)


def run_device_group(cfg: Config, spaces: EnvSpaces, rank: RankInfo) -> dict | None:
    """Train one policy on this device group until done; rank 0 writes and returns ``summary.json``.

    ``cfg`` is the node's resolved config (see :func:`msf.runner.launch.resolve`); this
    group runs its share of the rollout workers. The process group, if any, is already
    initialised. A failed run is logged with its traceback, its summary's ``status`` is
    ``"failed"``, the last checkpoint is left as it was, and then :class:`RunFailed` is raised on
    every rank (so that every node's launcher sees the failure and may restart).
    """
    use_quiet_executable()  # before any queue: the first one starts multiprocessing's resource tracker
    group_cfg = rank_config(cfg, rank)
    derived = Derived.of(group_cfg, spaces.num_agents)
    exp_dir = experiment_dir(cfg)
    setup_logging(exp_dir, rank=rank.rank if rank.distributed else None)
    device = f"cuda:{rank.local_rank}" if cfg.device == "gpu" else "cpu"
    torch.manual_seed(cfg.seed)  # the same on every replica; DDP also broadcasts rank 0's weights
    P = cfg.num_policies
    if cfg.default_niceness != 0:  # before the workers are spawned: they inherit it and add their offsets
        why = set_learner_niceness(cfg.default_niceness)
        if why:
            log.warning(why)
    if hasattr(os, "getpriority"):
        log.info("learner runs at niceness %d", os.getpriority(os.PRIO_PROCESS, 0))
    torch.set_num_threads(
        learner_threads(
            cfg.learner_threads,
            cfg.num_workers,
            cfg.policy_workers_per_policy * P * rank.nproc_per_node,
            rank.nproc_per_node,
            len(usable_cores()),
        )
    )
    log.info(
        "learner: %d torch thread(s) (--learner_threads=%d%s)",
        torch.get_num_threads(),
        cfg.learner_threads,
        ": chosen again from the measured load after 30 s" if cfg.learner_threads == 0 else "",
    )
    # one process group per policy over all ranks, created in the same order on every rank: each policy's
    # DDP and learner collectives run on its own group (one policy: the default group)
    groups = (
        [torch.distributed.new_group(list(range(rank.world_size))) for _ in range(P)]
        if rank.distributed and P > 1
        else [None] * P
    )
    learners = []
    for p in range(P):
        torch.manual_seed(cfg.seed + p)  # policies start apart; a policy's replicas start equal (and DDP broadcasts)
        learners.append(Learner(group_cfg, derived, spaces, device, collectives=collectives_of(groups[p])))
    world = collectives_of()  # every rank: the loop's agreement, the statistics, the checkpoint exchange
    counters = Counters(policies=[PolicyCounters() for _ in range(P)])
    purge_step = None
    for p, learner in enumerate(learners):
        state = load_latest_checkpoint(exp_dir, policy=p) if cfg.restart_behavior == "resume" else None
        if rank.distributed:
            # no shared file system needed: the rank with the newest checkpoint sends it to the others
            state = world.newest_state(state)
        if state is None:
            continue
        learner.load_state_dict(state)
        saved_lr = state.get("config", {}).get("learning_rate")
        if saved_lr is not None and saved_lr != cfg.learning_rate:
            # --learning_rate was changed on the command line: it replaces the checkpoint's lr
            learner.set_lr(cfg.learning_rate)
            log.info("learning rate set to %g (--learning_rate changed from %g)", cfg.learning_rate, saved_lr)
        counters.policies[p] = PolicyCounters(
            returns=state["episode_returns"], lengths=state["episode_lengths"], best_metric=state.get("best_metric")
        )
        if p == 0:
            counters.env_steps, counters.episodes = state["env_steps"], state["episodes"]
            counters.dropped_trajectories = state["dropped_trajectories"]
            counters.pbt_round = int(state.get("pbt_round", 0))
            counters.pbt_replacements = list(state.get("pbt_replacements", []))
            # the curves resume after the checkpoint's point, which the run that stopped there wrote last
            # (a run that died later wrote more: those events are dropped from the curves)
            purge_step = counters.env_steps * derived.frameskip + 1
        log.info(
            "resumed%s from %s at env step %d, policy version %d",
            f" policy {p}" if P > 1 else "",
            state["path"],
            state["env_steps"],
            learner.policy_version,
        )
    if purge_step is not None and counters.env_steps * derived.frameskip >= cfg.train_for_env_steps:
        # every rank reads the same checkpoint, so every rank returns here: nothing to agree on
        log.info(
            "the budget (--train_for_env_steps=%d) is already spent: nothing to do; the results of the "
            "finished run are kept",
            cfg.train_for_env_steps,
        )
        return None
    log.info(
        "msf %s | %s | rank %d/%d | device %s | %d rollout workers x %d envs, %d inference worker(s) | %s",
        msf.__version__,
        cfg.env,
        rank.rank,
        rank.world_size,
        device,
        group_cfg.num_workers,
        cfg.num_envs_per_worker,
        cfg.policy_workers_per_policy,
        exp_dir,
    )
    for learner in learners:
        world.check_identical(learner_state_tensors(learner.model, learner.optimizer))
    buffer = TrajectoryBuffer.allocate(group_cfg, derived, spaces)
    weights = [PublishedWeights(learner.model) for learner in learners]
    for w, learner in zip(weights, learners):
        w.publish(learner.model, learner.policy_version)
    stop_event = CTX.Event()
    tb = (
        TensorBoardSummaries(exp_dir, purge_step=purge_step, wandb_cfg=cfg if cfg.with_wandb else None)
        if rank.is_main
        else None
    )
    # environments are seeded differently on every rank, so that replicas see different experience
    worker_cfg = dataclasses.replace(group_cfg, seed=cfg.seed + 1_000_003 * rank.rank)
    first_worker = sum(split_evenly(cfg.num_workers, rank.nproc_per_node, i) for i in range(rank.local_rank))
    ch = _start_workers(
        worker_cfg,
        derived,
        spaces,
        buffer,
        weights,
        device,
        stop_event,
        prefix=f"rank{rank.rank}/" if rank.distributed else "",
        node_workers=(first_worker, cfg.num_workers),
    )
    loop = TrainingLoop(cfg, derived, learners, buffer, weights, ch, exp_dir, counters, tb, rank, world)
    signals = _SignalHandler(loop)
    t0 = time.monotonic()
    error: Exception | None = None
    try:
        status = loop.run()
        if loop.iteration > 0:  # a stop before the first training step leaves the checkpoints as they were
            loop.save(wait=True)
    except Exception as e:  # noqa: BLE001 - any failure ends the run with status "failed"
        log.error("run failed: %s", e)
        status, error = "failed", e
    finally:
        try:
            loop.close_writers()  # a periodic checkpoint still being written completes: nothing is lost
        except Exception as e:  # noqa: BLE001
            log.error("writing a checkpoint failed: %s", e)
            status, error = "failed", error or e
        stop_event.set()
        stop_children(ch.procs)
        if tb is not None:
            tb.close()
    summary = None
    if rank.is_main:
        summary = _summary(cfg, rank, loop, status, time.monotonic() - t0)
        write_json_atomic(os.path.join(exp_dir, "summary.json"), summary)
    # only now: a second Ctrl-C during the teardown above must still exit at once
    signals.restore()
    if status == "failed":
        raise RunFailed(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__) from error
    return summary


def _summary(cfg: Config, rank: RankInfo, loop: TrainingLoop, status: str, wall: float) -> dict:
    """``summary.json``: the run's figures (those of policy 0 at the top level) and ``policies``, keyed by
    policy id, each with its return, episode length, train steps, policy version and lag."""
    c, gs = loop.c, loop.global_stats
    run_frames = (c.env_steps - loop.start_steps) * cfg.env_frameskip
    per_policy = gs.get("policies") or [{} for _ in loop.policies]
    policies = {
        str(p): {
            "episode_return_mean": ps.get("return_mean"),
            "episode_length_mean": ps.get("length_mean"),
            "train_steps": pol.learner.train_step,
            "policy_version": pol.learner.policy_version,
            "policy_lag_mean": ps.get("lag_mean", pol.stats.lag[1]),
            "best_metric": pol.stats.best_metric,
            "hyperparameters": pol.learner.hyperparameters(),
            "empty_batches": ps.get("empty_batches", pol.empty_batches),
        }
        for p, (pol, ps) in enumerate(zip(loop.policies, per_policy))
    }
    lag = loop.policies[0].stats.lag
    return {
        "status": status,
        "env": cfg.env,
        "experiment": cfg.experiment,
        "msf_version": msf.__version__,
        "env_steps": c.env_steps,
        "env_frames": c.env_steps * cfg.env_frameskip,
        "wall_seconds": wall,
        "fps": run_frames / max(wall, 1e-9),
        "train_steps": loop.learner.train_step,
        "policy_version": loop.learner.policy_version,
        "episodes": c.episodes,
        "episode_return_mean": gs.get("return_mean"),
        "episode_length_mean": gs.get("length_mean"),
        "policy_lag_mean": gs.get("lag_mean", lag[1]),
        "policy_lag_max": gs.get("lag_max", lag[2]),
        "dropped_trajectories": c.dropped_trajectories,
        "world_size": rank.world_size,
        "nproc_per_node": rank.nproc_per_node,
        "nnodes": rank.nnodes,
        "fps_per_rank": gs.get("fps_per_rank"),
        "seed": cfg.seed,
        "num_policies": cfg.num_policies,
        "policies": policies,
        "pbt_replacements": loop.pbt_replacements,
    }
