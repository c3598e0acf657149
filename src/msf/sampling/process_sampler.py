"""The parallel run's sampler: one device group's workers, each in a child process."""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from multiprocessing.process import BaseProcess
from typing import Any, cast

from msf.cfg.config import Config, Derived
from msf.envs.families import remove_engine_files
from msf.envs.registry import EnvSpaces
from msf.runtime import reaping, spawning
from msf.runtime.affinity import usable_cores
from msf.runtime.semaphore_records import record_semaphores
from msf.sampling.inference_worker import inference_worker_main
from msf.sampling.plan import DeviceGroup, WorkerPlan, plan_workers
from msf.sampling.protocol import ComponentFailed, OwnSamples
from msf.sampling.rollout_worker import rollout_worker_main

log = logging.getLogger("msf")


class ProcessSampler(OwnSamples):
    """A :class:`~msf.sampling.protocol.Sampler` whose workers (:func:`~msf.sampling.plan.plan_workers`) each run
    in a child process (:func:`~msf.runtime.spawning.spawn`), the inference workers first. They sample by
    themselves; the training loop only checks on them (:meth:`advance`).

    Args:
        cfg, derived, spaces, group: see :func:`~msf.sampling.plan.plan_workers` (``group.cores`` is set here from
            ``--set_workers_cpu_affinity``).

    Attributes:
        procs: the child processes. failures: where a child reports its exception before it exits.
    """

    receive_timeout_s = 0.05  # the workers announce trajectories while the loop waits
    logs_tracebacks = False  # a child's report holds its own traceback

    def __init__(self, cfg: Config, derived: Derived, spaces: EnvSpaces, group: DeviceGroup):
        self.stop_event, self.failures = spawning.CTX.Event(), spawning.CTX.Queue()
        group = dataclasses.replace(group, cores=tuple(usable_cores()) if cfg.set_workers_cpu_affinity else None)
        plan = plan_workers(cfg, derived, spaces, group, self.stop_event, spawning.CTX)
        record_semaphores(self.stop_event, self.failures, plan)  # a run killed with them: the next one unlinks them
        self.full_queue, self.free_queues, self.stats_queue = plan.full_queue, plan.free_queues, plan.stats_queue
        self.inference_stats, self.rollout_wait = plan.inference_stats, plan.rollout_wait
        _log_pins(cfg, plan, group.cores)
        named: list[tuple] = [
            (inference_worker_main, plan.inference_name(*key), s) for key, s in plan.inference.items()
        ]
        named += [(rollout_worker_main, plan.rollout_name(w), s) for w, s in enumerate(plan.rollout)]
        self.procs = [spawning.spawn(main, name, self.failures, spec) for main, name, spec in named]
        # what a stop that has to kill a rollout worker names besides it: its envs, by their job-wide indices
        n = cfg.num_envs_per_worker
        firsts = [(group.first_worker + w) * n for w in range(len(plan.rollout))]
        self.envs_of = {plan.rollout_name(w): f"envs {e}-{e + n - 1} of {cfg.env}" for w, e in enumerate(firsts)}

    def advance(self) -> None:
        """Raise if a child reported a failure or died. A failure brings others down with it (a rollout worker's
        death closes its pipe, which ends its inference worker): the first report that arrives within a second
        names the root cause, unless a child was killed by a signal (a crash in native code cannot report):
        that child is named first.

        Raises:
            ComponentFailed: a child reported a failure (the message holds its traceback).
            ChildDied: a child died without a report.
        """
        try:
            f: spawning.ComponentFailure = self.failures.get_nowait()
        except queue.Empty:
            try:
                reaping.check_children(self.procs)
                return
            except reaping.ChildDied as dead:
                try:
                    f = self.failures.get(timeout=1.0)
                except queue.Empty:
                    raise dead from None
        report = f"{f.component} (pid {f.pid}) failed:\n{f.traceback}"
        killed: list = []
        deadline = time.monotonic() + 0.5  # a crashed child's pipes close just before it can be reaped
        while not killed and time.monotonic() < deadline:
            killed = [p for p in reaping.killed_children(self.procs) if p.pid != f.pid]
            if not killed:
                time.sleep(0.05)
        if killed:
            first = "; ".join(f"{p.name} (pid {p.pid}) {reaping.describe_exit(p)}" for p in killed)
            report = f"{first}; then {report}"
        raise ComponentFailed(report)

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        """Stop; give each worker :data:`~msf.runtime.reaping.STOP_GRACE_S` to close its envs, then kill it with
        what it started (its process group), naming it and its envs in one log line, and remove the files its
        engines' controllers would have removed from /dev/shm."""
        self.stop_event.set()
        killed = reaping.stop_children(self.procs, describe=self._describe)
        remove_engine_files(killed.values())
        for q in self.free_queues:  # slots returned to a worker that is gone: this process must not wait at its exit
            cast(Any, q).cancel_join_thread()  # a feeder thread blocked on a full pipe nobody reads any more

    def _describe(self, p: BaseProcess) -> str:
        """``rollout_worker_1 (pid N; envs 4-7 of CartPole-v1)``; an inference worker by its name and pid."""
        envs = self.envs_of.get(p.name)
        return f"{p.name} (pid {p.pid}{'; ' + envs if envs else ''})"


def _log_pins(cfg: Config, plan: WorkerPlan, cores: tuple[int, ...] | None) -> None:
    """Log which cores the rollout workers are pinned to (``--set_workers_cpu_affinity``), or why none is."""
    pins = [spec.cores for spec in plan.rollout]
    if cores is None:
        log.info("--set_workers_cpu_affinity=False: the rollout workers are not pinned")
    elif pins and pins[0] is None:
        log.info(
            "--set_workers_cpu_affinity: %d rollout workers do not spread evenly over %d cores; none is pinned "
            "(use a multiple of the cores, or at most one worker per core)",
            cfg.num_workers,
            len(cores),
        )
    elif pins:
        log.info("rollout workers pinned to CPU cores: %s", ", ".join(f"{w}: {c}" for w, c in enumerate(pins)))
