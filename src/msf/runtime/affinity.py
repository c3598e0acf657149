"""Cores, threads and priorities: pinning rollout workers to CPU cores (``--set_workers_cpu_affinity``,
Sample Factory's flag), the processes' niceness (``--default_niceness``, Sample Factory's flag and
offsets) and the learner's torch threads (``--learner_threads``: at the start, and once more from the measured
load: :class:`LearnerThreadRetune`).

A simulator such as ViZDoom runs its game engine in a thread of the worker's process; when the process
floats, the engine and the Python loop bounce between cores and the env loop runs at about half speed.
Pinning each rollout worker to one core of those the run may use avoids that. Inference workers and the
learner are not pinned: they use whatever cores are free.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

log = logging.getLogger("msf")


def usable_cores() -> list[int]:
    """The CPU cores this process may run on, ascending (all of ``os.cpu_count()`` where the platform
    cannot tell, e.g. macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def worker_cores(node_worker_index: int, node_workers: int, cores: list[int]) -> list[int] | None:
    """The cores rollout worker ``node_worker_index`` (its index among the ``node_workers`` rollout workers
    of all device groups on this node) is pinned to, or None to leave it floating.

    Worker ``i`` gets core ``cores[i % len(cores)]`` when every core then carries the same number of
    workers: when ``node_workers`` is at most the number of cores, or a multiple of it. Otherwise some cores
    would carry one worker more than others and slow the run to their pace, so no worker is pinned.

    Raises:
        ValueError: an index outside ``[0, node_workers)`` or no cores.
    """
    if not cores:
        raise ValueError("no CPU cores to pin the rollout workers to")
    if not 0 <= node_worker_index < node_workers:
        raise ValueError(f"rollout worker index {node_worker_index} outside [0, {node_workers})")
    n = len(cores)
    if node_workers <= n or node_workers % n == 0:
        return [cores[node_worker_index % n]]
    return None


def pin_this_process(cores: list[int] | None) -> list[int] | None:
    """Restrict this process to ``cores`` (nothing when None or the platform has no ``sched_setaffinity``);
    returns the cores it may now run on as the OS reports them, or None when not pinned."""
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return None
    os.sched_setaffinity(0, cores)
    return sorted(os.sched_getaffinity(0))


# Sample Factory's scheme: the learner at --default_niceness, inference workers 2 and rollout workers 10 above
# it (both only when there is more than one rollout worker)
INFERENCE_NICENESS, ROLLOUT_NICENESS = 2, 10


def raise_niceness(increment: int) -> int:
    """Raise this process's niceness by ``increment`` (the kernel caps it at 19; raising never needs
    privileges) and return the niceness it now has. Nothing where the platform has no ``os.nice``.

    On an oversubscribed machine this lets the learner, when it is the bottleneck, keep its core: without
    it a worker woken on the learner's core preempts the learner, and Linux does not move the cache-hot
    learner to the idle core.
    """
    if not hasattr(os, "nice"):
        return 0
    return os.nice(increment) if increment > 0 else os.nice(0)


def set_learner_niceness(niceness: int) -> str | None:
    """Set this process's niceness to ``niceness`` (``--default_niceness``; clamped to [-20, 19]) when it
    differs from the current one. Returns None, or why it could not (going below the current niceness
    needs privileges: CAP_SYS_NICE)."""
    if not hasattr(os, "setpriority"):
        return None
    target = max(-20, min(19, niceness))
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if target == now:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, target)
    except PermissionError:
        return (
            f"--default_niceness={niceness}: lowering the niceness below {now} needs privileges "
            f"(CAP_SYS_NICE); the learner stays at {now}"
        )
    return None


def learner_threads(
    learner_threads_flag: int,
    num_workers: int,
    inference_workers: int,
    nproc_per_node: int,
    cores: int,
    synchronous: bool = False,
) -> int:
    """torch threads a learner replica starts with: ``--learner_threads`` when given (> 0); otherwise the
    cores left when each of the node's ``num_workers`` rollout workers and ``inference_workers`` inference
    workers holds one, shared by the node's ``nproc_per_node`` replicas, and at least 1.

    ``synchronous`` (``--async_rl=False``): the replica's whole share of the cores, at least 1. The workers wait
    while the learner trains, so the cores they hold during collection are idle during training."""
    if learner_threads_flag > 0:
        return learner_threads_flag
    if synchronous:
        return max(1, cores // nproc_per_node)
    return max(1, (cores - num_workers - inference_workers) // nproc_per_node)


def auto_learner_threads(
    cores: float,
    rollout_workers: int,
    rollout_wait: float,
    inference_workers: int,
    inference_wait: float,
    learner_wait: float,
    current: int,
) -> int:
    """The learner's torch threads chosen from what the workers were measured to use (``--learner_threads=0``).

    The start rule assumes every worker keeps a core busy. With pixel envs on few cores they mostly wait for
    the learner, and the idle share is wasted. The workers' busy cores are ``n x (1 - wait share)`` per kind;
    the learner gets what is left of its share of the node, rounded to whole threads, at least 1. A learner
    that waits for trajectories more than 10% of the time is not the bottleneck, and keeps ``current``.

    Args:
        cores: this replica's share of the node's usable cores (cores / nproc_per_node).
        rollout_workers, inference_workers: this replica's worker processes.
        rollout_wait, inference_wait, learner_wait: mean share of the time each kind waited, in [0, 1].
        current: the learner's threads now.

    Returns:
        The number of threads, in ``[1, max(1, floor(cores))]``.
    """
    if learner_wait > 0.1:
        return current
    spare = cores - rollout_workers * (1.0 - rollout_wait) - inference_workers * (1.0 - inference_wait)
    return int(max(1, min(int(cores), int(spare + 0.5))))


class LearnerThreadRetune:
    """``--learner_threads=0`` with ``--async_rl`` (``auto``): once, at the first call 30 s after ``start``, set this
    process's torch threads from the waiting shares measured meanwhile (:func:`auto_learner_threads` on this
    device group's share of the node's usable cores), and log the choice. Otherwise the start's number is kept:
    a given one, or a synchronous learner's, which has its share of the cores from the start
    (:func:`learner_threads`).

    Args:
        auto: retune once. start: the clock at the start (s). rollout_workers, inference_workers: this replica's.
        groups_per_node: device groups sharing the node's cores.
    """

    def __init__(self, auto: bool, start: float, rollout_workers: int, inference_workers: int, groups_per_node: int):
        self.due, self.start, self.after_s = auto, start, 30.0
        self.workers, self.groups_per_node = (rollout_workers, inference_workers), groups_per_node

    def __call__(self, now: float, waits: Sequence[float]) -> None:
        """``now``: the clock (s); ``waits``: this replica's waiting shares (rollout, inference, learner; each in
        ``[0, 1]``) over the last window."""
        if not self.due or now - self.start < self.after_s:
            return
        import torch  # here only: the rest of this module serves processes that need no torch

        self.due = False
        (n_rollout, n_inference), (rollout_wait, inference_wait, learner_wait) = self.workers, waits
        cores = len(usable_cores()) / self.groups_per_node
        before = torch.get_num_threads()
        after = auto_learner_threads(cores, n_rollout, rollout_wait, n_inference, inference_wait, learner_wait, before)
        if after != before:
            torch.set_num_threads(after)
        log.info("learner: %s", learner_threads_note(after, before, waits, n_rollout, n_inference, cores))


def learner_threads_note(
    after: int, before: int, waits: Sequence[float], n_rollout: int, n_inference: int, cores: float
) -> str:
    """What the log says of the learner's new thread count: the workers' busy time is ``n x (1 - wait share)``
    per kind, and it means cores only when it fits into them. When it does not, the time not spent waiting
    includes the time spent waiting for a core: then the cores are said to be oversubscribed instead."""
    rollout_wait, inference_wait, learner_wait = waits
    busy = n_rollout * (1 - rollout_wait) + n_inference * (1 - inference_wait)
    if busy <= cores:
        load = f"the workers kept {busy:.2f} of {cores:.2f} cores busy"
    else:
        load = (
            f"{n_rollout} rollout and {n_inference} inference worker(s) on {cores:.2f} cores were busy or waiting "
            f"for a core {100 * (1 - rollout_wait):.0f}% and {100 * (1 - inference_wait):.0f}% of the time: the "
            "cores are oversubscribed"
        )
    return (
        f"{after} torch thread(s) from now on, was {before} ({load}; the learner waited {100 * learner_wait:.0f}% "
        "of the time; --learner_threads=N fixes the number)"
    )
