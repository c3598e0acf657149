"""The batcher: from announced trajectory-buffer slots to the learner's batches, one policy at a time.

Rollout workers announce finished trajectories (:class:`~msf.sampling.messages.FullTrajectories`, slot
indices) on the full queue. The batcher files each slot under the policy whose trajectory it holds
(``slot_policy``), and when a policy's learner asks for its next batch it copies out exactly the
trajectories that batch still needs, hands their slots back to their workers
(:class:`~msf.sampling.messages.SlotsReturned` on the worker's free queue) and drops those older than
``max_policy_lag``. Trajectories not yet needed stay in the buffer and keep their slots: that is the
back-pressure that keeps rollout workers from running ahead of the learner (a worker with no free slot
waits).

No processes here: the queues are anything with ``get(timeout=)`` / ``get_nowait()`` / ``put()`` raising
:class:`queue.Empty` (``multiprocessing`` queues in a run, ``queue.Queue`` in tests).
"""

from __future__ import annotations

import collections
import queue
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from msf.sampling.messages import FullTrajectories, SlotsReturned
from msf.sampling.trajectory_buffer import TrajectoryBuffer

Batch = dict[str, torch.Tensor]
_KEY = "_slot_key"  # with in_env_order: each copied-out trajectory's key, until the batch is sorted by it


@dataclass(frozen=True)
class Taken:
    """What one :meth:`Batcher.take` did.

    Attributes:
        batch: the policy's next batch, exactly ``trajectories_per_iteration`` trajectories
            (``[B, T(+1), ...]`` tensors as :meth:`TrajectoryBuffer.gather` returns them), or None while
            fewer are ready.
        trajectories: taken out of the buffer by this call (their slots were returned), kept or dropped.
        dropped: of those, how many were dropped as too old (policy lag above ``max_policy_lag``).
        env_steps: agent steps of the ``trajectories`` (``trajectories x rollout``).
        keys: with ``in_env_order`` and a batch: ``[B]`` int64, each trajectory's ``slot_key`` (job-wide env row
            x 2**32 + that row's trajectory count), ascending as the batch's rows are; else None.
    """

    batch: Batch | None
    trajectories: int
    dropped: int
    env_steps: int
    keys: torch.Tensor | None = None


class Batcher:
    """Per policy: announced trajectories still in the buffer (``pending``) and copied-out ones not yet
    trained on (``ready``).

    Args:
        buffer: the device group's trajectory buffer.
        full_queue: where rollout workers announce :class:`FullTrajectories`.
        free_queues: per rollout worker, where its copied-out slots go back (:class:`SlotsReturned`).
        num_policies: policies whose trajectories share the buffer.
        trajectories_per_iteration: the size of one batch (``Derived.trajectories_per_iteration``).
        max_policy_lag: trajectories whose oldest step is more than this many policy versions behind the
            learner are dropped when copied out.
        hold_slots: ``--async_rl=False``: the slots of a copied-out batch go back to their workers only when
            :meth:`release` says that the learner has trained on it (the workers wait until then, so that they
            act with the weights that training gave); False: as soon as they are copied out.
        in_env_order: ``--deterministic``: a batch's trajectories in job-wide env order (each env's in the order
            it wrote them: ``buffer.slot_key``), whatever order the workers announced them in.
    """

    def __init__(
        self,
        buffer: TrajectoryBuffer,
        full_queue: Any,
        free_queues: Sequence[Any],
        num_policies: int,
        trajectories_per_iteration: int,
        max_policy_lag: int,
        hold_slots: bool = False,
        in_env_order: bool = False,
    ):
        self.buffer, self.full_queue, self.free_queues = buffer, full_queue, free_queues
        self.hold_slots, self.in_env_order = hold_slots, in_env_order
        self._held: list[list[tuple[int, int]]] = [[] for _ in range(num_policies)]
        self.batch_size, self.max_policy_lag = trajectories_per_iteration, max_policy_lag
        self._slot_policy = buffer.slot_policy.numpy()  # a view: workers write it before they announce
        self._pending: list[collections.deque[tuple[int, int]]] = [collections.deque() for _ in range(num_policies)]
        self._ready: list[list[Batch]] = [[] for _ in range(num_policies)]
        self._ready_count = [0] * num_policies
        self._empty: Batch | None = None
        self.received = 0  # trajectories announced so far (the rank's progress record reports it)
        # trajectories copied out, and of them dropped as too old, by the worker that announced them (a sampler
        # node's are under its virtual worker index: msf.sampling.remote_sampler)
        self.taken_by_worker: collections.Counter[int] = collections.Counter()
        self.dropped_by_worker: collections.Counter[int] = collections.Counter()

    def pending(self, policy: int) -> int:
        """Announced trajectories of ``policy`` still in the buffer, holding their slots."""
        return len(self._pending[policy])

    def ready(self, policy: int) -> int:
        """Copied-out trajectories of ``policy`` not yet handed out in a batch."""
        return self._ready_count[policy]

    def receive(self, timeout: float) -> None:
        """File every announced trajectory under its policy: those already queued, after waiting at most ``timeout``
        seconds for the first announcement when no policy has a whole batch's trajectories announced or copied out
        (one that has trains now: workers that finish their trajectories in bursts, thousands of vector envs or a
        sampler node's message, would otherwise cost the learner a wait per batch)."""
        if any(len(q) + self._ready_count[p] >= self.batch_size for p, q in enumerate(self._pending)):
            timeout = 0.0
        try:
            msg: FullTrajectories = self.full_queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self.received += len(msg.slots)
            for s in msg.slots:
                self._pending[int(self._slot_policy[s])].append((msg.worker, s))
            try:
                msg = self.full_queue.get_nowait()
            except queue.Empty:
                return

    def take(self, policy: int, policy_version: int) -> Taken:
        """Copy out what ``policy``'s next batch still needs and return that batch once it is complete.

        Args:
            policy_version: the policy's learner's version now; a trajectory's lag is this minus the oldest
                version that acted in it.
        """
        trajectories, dropped = self._copy_out(policy, policy_version)
        batch = self._next_batch(policy)
        keys = None if batch is None else batch.pop(_KEY, None)
        return Taken(batch, trajectories, dropped, trajectories * self.buffer.rollout, keys)

    def _copy_out(self, policy: int, policy_version: int) -> tuple[int, int]:
        pending = self._pending[policy]
        need = self.batch_size - self._ready_count[policy]
        if not pending or need <= 0:
            return 0, 0
        items = [pending.popleft() for _ in range(min(need, len(pending)))]
        slots = torch.tensor([s for _, s in items], dtype=torch.int64)
        batch = self.buffer.gather(slots)
        if self.in_env_order:
            batch[_KEY] = self.buffer.slot_key.index_select(0, slots)
        if self.hold_slots:
            self._held[policy].extend(items)
        else:  # the slots are free as soon as the copy is made
            self._return(items)
        keep = policy_version - batch["policy_versions"].min(1).values <= self.max_policy_lag
        dropped = int((~keep).sum())
        for (w, _), kept in zip(items, keep.tolist()):
            self.taken_by_worker[w] += 1
            self.dropped_by_worker[w] += not kept
        if dropped:
            batch = {k: v[keep.to(v.device)] for k, v in batch.items()}
        if batch["rewards"].shape[0]:
            self._ready[policy].append(batch)
            self._ready_count[policy] += batch["rewards"].shape[0]
        return len(items), dropped

    def release(self, policy: int) -> int:
        """With ``hold_slots``: the learner has trained on ``policy``'s batch; hand the slots held since it was
        copied out back to their workers. Returns how many."""
        items, self._held[policy] = self._held[policy], []
        self._return(items)
        return len(items)

    def _return(self, items: list[tuple[int, int]]) -> None:
        """``(worker, slot)`` pairs back to their workers, one message per worker."""
        by_worker: dict[int, list[int]] = collections.defaultdict(list)
        for w, s in items:
            by_worker[w].append(s)
        for w, slots in by_worker.items():
            self.free_queues[w].put(SlotsReturned(slots))

    def _next_batch(self, policy: int) -> Batch | None:
        n = self.batch_size
        if self._ready_count[policy] < n:
            return None
        ready = self._ready[policy]
        joined = {k: torch.cat([b[k] for b in ready]) for k in ready[0]}
        if self.in_env_order:
            order = torch.argsort(joined[_KEY])
            joined = {k: v.index_select(0, order.to(v.device)) for k, v in joined.items()}
        rest = {k: v[n:] for k, v in joined.items()}
        self._ready[policy] = [rest] if rest["rewards"].shape[0] else []
        self._ready_count[policy] -= n
        return {k: v[:n] for k, v in joined.items()}

    def empty_batch(self) -> Batch:
        """A batch of a real one's shapes and dtypes (``trajectories_per_iteration`` trajectories) whose samples
        are all masked out (``valids`` ``[B, T]`` uint8, all 0): what a replica with no experience for a policy
        brings to that policy's collectives, so that it neither hangs the others nor takes another SGD step
        than they do. A fresh copy each call (the learner may change it in place)."""
        if self._empty is None:
            self._empty = self.buffer.gather(torch.zeros(self.batch_size, dtype=torch.int64))
            self._empty["valids"] = torch.zeros_like(self._empty["rewards"], dtype=torch.uint8)
        return {k: v.clone() for k, v in self._empty.items()}
