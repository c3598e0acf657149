"""The wiring plan of one device group: its workers, what each is given, and the channels that join them
(listed in :mod:`msf.sampling.protocol`). :func:`plan_workers` is the one place where worker specs are built: the
process sampler, the serial sampler and :meth:`~msf.sampling.inference_worker.InferenceWorker.in_process` take
theirs from it."""

from __future__ import annotations

import dataclasses
import os
import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msf.cfg.config import Config, Derived
from msf.distributed.topology import RankInfo, split_evenly
from msf.envs.registry import EnvSpaces
from msf.runtime.affinity import worker_cores
from msf.sampling.messages import EpisodeStats, FullTrajectories, InferenceCounters, RolloutCounters, SlotsReturned
from msf.sampling.protocol import Inbox, InferenceWorkerSpec, Outbox, RolloutWorkerSpec, StopSignal
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer


def rank_config(cfg: Config, rank: RankInfo) -> Config:
    """The config of one device group: its share of this node's rollout workers."""
    return dataclasses.replace(cfg, num_workers=split_evenly(cfg.num_workers, rank.nproc_per_node, rank.local_rank))


@dataclass(frozen=True)
class DeviceGroup:
    """What a device group's workers bind to, and where the group sits in the job.

    Attributes:
        buffer: its trajectory buffer. weights: per policy, where its learner publishes its weights.
        rank: its place (its share of the node's rollout workers, their seeds and names).
        device: torch device of its inference workers ("cpu", "cuda:0").
        first_worker: the job-wide index of its rollout worker 0 (the rollout workers of the ranks before it).
        cores: the cores the node's rollout workers are pinned over (``--set_workers_cpu_affinity``); None: none is.
    """

    buffer: TrajectoryBuffer
    weights: Sequence[PublishedWeights]
    rank: RankInfo = RankInfo()
    device: str = "cpu"
    first_worker: int = 0
    cores: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WorkerPlan:
    """One device group's workers, each with its spec, and the training loop's ends of their channels.

    Attributes:
        inference: ``{(policy, k): spec}`` of inference worker ``k`` of each policy, policy-major; it serves the
            rollout workers ``w`` with ``w % policy_workers_per_policy == k``.
        rollout: the rollout workers' specs, by index.
        full_queue, free_queues, stats_queue: the training loop's ends (``free_queues[w]``: rollout worker ``w``'s).
        prefix: what the workers' names start with (``"rank1/"`` when there are several device groups).
    """

    inference: dict[tuple[int, int], InferenceWorkerSpec]
    rollout: list[RolloutWorkerSpec]
    full_queue: Inbox[FullTrajectories]
    free_queues: Sequence[Outbox[SlotsReturned]]
    stats_queue: Inbox[EpisodeStats]
    prefix: str = ""

    @property
    def inference_stats(self) -> Sequence[InferenceCounters]:
        return [s.counters for s in self.inference.values()]

    @property
    def rollout_wait(self) -> Sequence[RolloutCounters]:
        return [s.counters for s in self.rollout]

    def inference_name(self, policy: int, k: int) -> str:
        one = self.inference[(policy, k)].cfg.num_policies == 1
        return f"{self.prefix}inference_worker_{k}" if one else f"{self.prefix}inference_worker_p{policy}_{k}"

    def rollout_name(self, w: int) -> str:
        return f"{self.prefix}rollout_worker_{w}"


def plan_workers(
    cfg: Config, derived: Derived, spaces: EnvSpaces, group: DeviceGroup, stop_event: StopSignal, ctx: Any = None
) -> WorkerPlan:
    """The workers of one device group and their channels: ``policy_workers_per_policy`` inference workers per
    policy and the group's share of the node's rollout workers (:func:`rank_config`); rollout worker ``w`` has one
    pipe per policy, to that policy's inference worker ``w % policy_workers_per_policy``.

    Args:
        cfg: the node's config. derived: the device group's (of ``rank_config(cfg, group.rank)``).
        spaces: the env's spaces. stop_event: set to stop every worker.
        ctx: the ``multiprocessing`` context the workers are spawned with: its queues and pipes join them, and
            they watch this process; None: one process (``queue.Queue``, no pipes, no parent to watch).
    """
    rank = group.rank
    # envs are seeded differently on every rank, so that replicas see different experience; with
    # --deterministic, by the seed and their job-wide index alone (already different on every rank), so that
    # an env gets the same seed on 1 or N device groups
    seed = cfg.seed
    if rank.rank and not cfg.deterministic:
        assert seed is not None, "launch.resolve() sets it for a job of several ranks"
        seed += 1_000_003 * rank.rank
    wcfg = dataclasses.replace(rank_config(cfg, rank), seed=seed)
    W, P, K = wcfg.num_workers, wcfg.num_policies, wcfg.policy_workers_per_policy
    make_queue: Any = queue.Queue if ctx is None else ctx.Queue
    full_queue, free_queues, stats_queue = make_queue(), [make_queue() for _ in range(W)], make_queue()
    # pipes[w][p]: rollout worker w's pipe to the inference worker of policy p that serves it (none in one process)
    pipes = [] if ctx is None else [[ctx.Pipe(duplex=True) for _ in range(P)] for _ in range(W)]
    common: dict[str, Any] = dict(cfg=wcfg, derived=derived, buffer=group.buffer, stop_event=stop_event)
    common.update(parent_pid=None if ctx is None else os.getpid(), first_worker=group.first_worker)
    inference = {
        (p, k): InferenceWorkerSpec(
            **common,
            spaces=spaces,
            policy=p,
            conns={w: pipes[w][p][0] for w in range(k, W, K)} if pipes else {},
            weights=group.weights[p],
            device=group.device,
            counters=InferenceCounters(),
        )
        for p in range(P)
        for k in range(K)
    }
    # the index of this group's rollout worker 0 among the node's, for the cores it is pinned to
    node_first = sum(split_evenly(cfg.num_workers, rank.nproc_per_node, i) for i in range(rank.local_rank))
    rollout = [
        RolloutWorkerSpec(
            **common,
            index=w,
            conns=[pipes[w][p][1] for p in range(P)] if pipes else [],
            full_queue=full_queue,
            free_queue=free_queues[w],
            stats_queue=stats_queue,
            counters=RolloutCounters(),
            cores=None if group.cores is None else worker_cores(node_first + w, cfg.num_workers, list(group.cores)),
            device_group=rank.rank,
        )
        for w in range(W)
    ]
    prefix = f"rank{rank.rank}/" if rank.distributed else ""
    return WorkerPlan(inference, rollout, full_queue, free_queues, stats_queue, prefix)
