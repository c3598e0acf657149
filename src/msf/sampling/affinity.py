"""Pinning rollout workers to CPU cores (``--set_workers_cpu_affinity``, Sample Factory's flag).

A simulator such as ViZDoom runs its game engine in a thread of the worker's process; when the process
floats, the engine and the Python loop bounce between cores and the env loop runs at about half speed.
Pinning each rollout worker to one core of those the run may use avoids that. Inference workers and the
learner are not pinned: they use whatever cores are free.
"""

from __future__ import annotations

import os


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
