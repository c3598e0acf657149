"""``--serial_mode``: one device group's rollout and inference workers in the calling process.

The same components as the parallel run (:class:`~msf.sampling.rollout_worker.RolloutWorker`,
:class:`~msf.sampling.inference_worker.InferenceWorker`, the trajectory buffer, the published weights), with
the pipes replaced by lists and the queues by :class:`queue.Queue`, stepped one after the other by
:meth:`SerialSampler.advance`, which the training loop calls at the start of each of its passes. The order of
work is the parallel run's: the rollout workers ask for actions, each inference worker answers everything
asked of it in one batch, the rollout workers step the splits that have their actions and ask again. A step
that would need a free slot the learner still holds (the back-pressure a rollout worker process waits on) is
put off until the learner has returned slots, instead of blocking the one process.

A breakpoint in an env, pdb or py-spy then sees the whole device group in one process.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces
from msf.envs.vector import close_all
from msf.sampling.inference_worker import InferenceWorker
from msf.sampling.plan import DeviceGroup, plan_workers
from msf.sampling.protocol import OwnSamples
from msf.sampling.rollout_worker import RolloutWorker

log = logging.getLogger("msf")


class SerialSampler(OwnSamples):
    """A :class:`~msf.sampling.protocol.Sampler`: a device group's workers (:func:`~msf.sampling.plan.plan_workers`)
    in this process, wired as in the parallel run. Its envs are made here, now.

    Args:
        cfg, derived, spaces, group: see :func:`~msf.sampling.plan.plan_workers`.

    Raises:
        whatever making an env raises (the envs made so far are closed).
    """

    receive_timeout_s = 0.0  # trajectories are announced in advance() only
    logs_tracebacks = True  # a failure is this process's own, and serial mode is for debugging it

    def __init__(self, cfg: Config, derived: Derived, spaces: EnvSpaces, group: DeviceGroup):
        log.info("--serial_mode: the rollout and inference workers run in this process, stepped by the training loop")
        self.K = cfg.policy_workers_per_policy
        self.stop_event = threading.Event()  # a rollout worker checks it while its envs are made
        plan = plan_workers(cfg, derived, spaces, group, self.stop_event)
        self.full_queue, self.free_queues, self.stats_queue = plan.full_queue, plan.free_queues, plan.stats_queue
        self.inference_stats, self.rollout_wait = plan.inference_stats, plan.rollout_wait
        # per inference worker (policy, k): the (rollout worker, split) requests not yet served
        self.requests: dict[tuple[int, int], list[tuple[int, int]]] = {key: [] for key in plan.inference}
        self.inference = {key: InferenceWorker(spec) for key, spec in plan.inference.items()}
        self.rollout: list[RolloutWorker] = []
        self.deferred: list[tuple[int, int]] = []  # replies whose step waits for free slots
        try:
            for w, spec in enumerate(plan.rollout):
                self.rollout.append(RolloutWorker(spec, send_request=functools.partial(self._request, w)))
        except BaseException:
            self.close()
            raise
        self.started = False

    def _request(self, worker: int, policy: int, split: int) -> None:
        self.requests[(policy, worker % self.K)].append((worker, split))

    def advance(self) -> bool:
        """One round of sampling: start the workers (the first call); take the slots the learner returned (and,
        with ``--async_rl=False``, resume the workers whose splits all wait for it); serve every request, one
        batch per inference worker; step every split that has all its actions and a free slot if it needs one.

        Returns:
            True when anything moved (False: every split waits for the learner).

        Raises:
            whatever an env or the policy raises.
        """
        if not self.started:
            self.started = True
            for r in self.rollout:
                r.start()
            return True
        moved = False
        for r in self.rollout:
            r.slots.take_returned(timeout=None)
            if r.quota.all_parked and r.slots.free:
                moved |= r.resume()
        replies = []
        for key, requests in self.requests.items():
            if requests:
                self.requests[key] = []
                self.inference[key].serve(requests)
                replies.extend(requests)
        pending, self.deferred = self.deferred + replies, []
        for w, split in pending:
            worker = self.rollout[w]
            if worker.waiting[split] == 1 and worker.slots_short(split):
                self.deferred.append((w, split))  # the learner holds the slots it needs: after its next take
                continue
            worker.on_reply(split)
            moved = True
        now = time.monotonic()
        for r in self.rollout:
            r.report_stats(now)
        return moved or bool(replies)

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        """Close every rollout worker's envs (the first failure is raised after all were tried)."""
        close_all(w.close for w in self.rollout)
