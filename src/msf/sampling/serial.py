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

import queue
import time
from typing import Any, Sequence

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces
from msf.envs.vector import close_all
from msf.sampling.inference_worker import InferenceWorker
from msf.sampling.messages import InferenceCounters, RolloutCounters
from msf.sampling.protocol import InferenceWorkerSpec, RolloutWorkerSpec
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.rollout_worker import RolloutWorker
from msf.sampling.trajectory_buffer import TrajectoryBuffer


class SerialSampler:
    """A device group's ``num_workers`` rollout workers and ``num_policies x policy_workers_per_policy``
    inference workers, in this process; rollout worker ``w`` is served by inference worker ``w % K`` of each
    policy, as in the parallel run.

    Args:
        cfg, derived, spaces: the device group's config (``cfg.seed`` seeds the envs) and the env's spaces.
        buffer: the device group's trajectory buffer. weights: per policy, its published weights.
        device: where the inference workers run the policy ("cpu", "cuda:0").
        stop_event: set to stop (a rollout worker checks it while its envs are made).
        first_worker, device_group: see :class:`~msf.sampling.protocol.RolloutWorkerSpec`.

    Attributes:
        full_queue, free_queues, stats_queue: the training loop's ends of the channels (:class:`queue.Queue`).
        inference_stats, rollout_wait: the workers' counters, as the parallel run's.

    Raises:
        whatever making an env raises (the envs made so far are closed).
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        spaces: EnvSpaces,
        buffer: TrajectoryBuffer,
        weights: Sequence[PublishedWeights],
        device: str,
        stop_event: Any,
        first_worker: int = 0,
        device_group: int = 0,
    ):
        W, P, K = cfg.num_workers, cfg.num_policies, cfg.policy_workers_per_policy
        self.K = K
        self.full_queue: queue.Queue = queue.Queue()
        self.stats_queue: queue.Queue = queue.Queue()
        self.free_queues: list[queue.Queue] = [queue.Queue() for _ in range(W)]
        self.inference_stats = [InferenceCounters() for _ in range(P * K)]
        self.rollout_wait = [RolloutCounters() for _ in range(W)]
        # per inference worker (policy, k): the (rollout worker, split) requests not yet served
        self.requests: dict[tuple[int, int], list[tuple[int, int]]] = {(p, k): [] for p in range(P) for k in range(K)}
        self.inference = {
            (p, k): InferenceWorker(
                InferenceWorkerSpec(
                    cfg=cfg,
                    derived=derived,
                    spaces=spaces,
                    buffer=buffer,
                    policy=p,
                    conns={},
                    weights=weights[p],
                    device=device,
                    stop_event=stop_event,
                    parent_pid=None,
                    counters=self.inference_stats[p * K + k],
                    first_worker=first_worker,
                )
            )
            for p in range(P)
            for k in range(K)
        }
        self.rollout: list[RolloutWorker] = []
        self.deferred: list[tuple[int, int]] = []  # replies whose step waits for free slots
        try:
            for w in range(W):
                spec = RolloutWorkerSpec(
                    cfg=cfg,
                    derived=derived,
                    index=w,
                    buffer=buffer,
                    conns=[],
                    full_queue=self.full_queue,
                    free_queue=self.free_queues[w],
                    stats_queue=self.stats_queue,
                    stop_event=stop_event,
                    parent_pid=None,
                    counters=self.rollout_wait[w],
                    first_worker=first_worker,
                    device_group=device_group,
                )
                self.rollout.append(RolloutWorker(spec, send_request=lambda p, s, w=w: self._request(w, p, s)))
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
            for w in self.rollout:
                w.start()
            return True
        moved = False
        for w in self.rollout:
            w.take_returned_slots(timeout=None)
            if w.all_parked and w.free_slots:
                moved |= w.resume()
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
        for w in self.rollout:
            w.report_stats(now)
        return moved or bool(replies)

    def close(self) -> None:
        """Close every rollout worker's envs (the first failure is raised after all were tried)."""
        close_all(w.close for w in self.rollout)
