"""A rollout worker's state as values: its free slots, running episodes, each row's policy, the synchronous quota.
Rows: one per agent of each env (env ``e``'s agents are rows ``e * A .. e * A + A - 1``)."""

from __future__ import annotations

import collections
import queue
from typing import Any

import numpy as np


class SlotPool:
    """A worker's free ``slots`` of the trajectory buffer, in the order they came back on ``free_queue``
    (:class:`~msf.sampling.messages.SlotsReturned`), and the key of each trajectory started in one, in the buffer's
    int64 ``slot_key``: ``(job-wide row << 32) | the row's trajectory count`` (``--deterministic`` orders a batch by
    it). ``first_row``: the job-wide index of the worker's row 0 of ``rows``."""

    def __init__(self, slots: range, slot_key: np.ndarray, free_queue: Any, first_row: int, rows: int):
        self.free = collections.deque(slots)
        self.slot_key, self.free_queue, self.first_row = slot_key, free_queue, first_row
        self.trajectories = np.zeros(rows, dtype=np.int64)  # per row, trajectories started so far

    def take(self, row: int) -> int:
        """The first free slot, its key now that of ``row``'s next trajectory. IndexError: none is free."""
        return int(self.take_many(np.array([row]))[0])

    def take_many(self, rows: np.ndarray) -> np.ndarray:
        """The first ``len(rows)`` free slots, in order, one for each of ``rows`` (distinct), their keys now those of
        the rows' next trajectories. IndexError: too few are free (none taken)."""
        if len(rows) > len(self.free):
            raise IndexError(f"{len(rows)} slots wanted, {len(self.free)} free")
        slots = np.array([self.free.popleft() for _ in range(len(rows))], dtype=np.int64)
        self.slot_key[slots] = ((self.first_row + rows) << 32) | self.trajectories[rows]
        self.trajectories[rows] += 1
        return slots

    def take_returned(self, timeout: float | None) -> bool:
        """Take every message on ``free_queue`` into the free slots, waiting up to ``timeout`` seconds for the
        first (None: not at all). True when any came."""
        got = False
        while True:
            try:
                msg = self.free_queue.get(timeout=timeout) if timeout and not got else self.free_queue.get_nowait()
            except queue.Empty:
                return got
            self.free.extend(msg.slots)
            got = True


class RunningEpisodes:
    """Per row, the return (float64) and length of its running episode; and the episodes finished since the last
    :meth:`take`, in the order they ended, each with the policy that drove its row."""

    def __init__(self, rows: int, now: float):
        self.ret = np.zeros(rows, dtype=np.float64)
        self.len = np.zeros(rows, dtype=np.int64)
        self.done: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (returns, lengths, policies) per add
        self.taken_at = now

    def add(
        self, lo: int, rew: np.ndarray, ended: np.ndarray, row_policy: np.ndarray, stepped: np.ndarray | bool = True
    ) -> None:
        """Rows ``lo .. lo + len(rew) - 1`` stepped: ``rew`` their rewards, ``ended`` (bool) whose episode ended;
        ``stepped`` (bool, or one per row): which of them made a transition (a next-step autoreset does not: its
        length stays; its reward is 0)."""
        hi = lo + len(rew)
        self.ret[lo:hi] += rew
        self.len[lo:hi] += stepped
        if ended.any():
            rows = lo + np.nonzero(ended)[0]
            self.done.append((self.ret[rows], self.len[rows], row_policy[rows]))  # copies (fancy indexing)
        self.ret[lo:hi][ended] = 0.0
        self.len[lo:hi][ended] = 0

    def take(self, now: float, period_s: float) -> tuple[list[float], list[int], list[int]] | None:
        """(returns, lengths, policies) of the finished episodes, and start afresh, if any finished and the last
        take is more than ``period_s`` seconds older than ``now``; else None."""
        if not self.done or now - self.taken_at <= period_s:
            return None
        done, self.done, self.taken_at = self.done, [], now
        returns, lengths, policies = (np.concatenate(x).tolist() for x in zip(*done))
        return returns, lengths, policies


class PolicyDraw:
    """Which of ``policies`` drives each of ``rows`` (``row``): drawn at the start, and again at the first trajectory
    boundary after an episode of the row's env ended, so that a trajectory is one policy's. One draw (``rng``'s
    ``integers``) per agent with ``mix`` (``--pbt_mix_policies_in_one_env``), else one per env of ``agents``."""

    def __init__(self, policies: int, agents: int, rows: int, mix: bool, rng: Any):
        self.P, self.A, self.mix, self.rng = policies, agents, mix, rng
        self.row = np.zeros(rows, dtype=np.int64)
        self.episode_ended = np.zeros(rows, dtype=bool)  # since the row's trajectory started

    def draw(self, rows: np.ndarray) -> None:
        """New policies for ``rows`` (whole envs' rows; none with one policy)."""
        if self.P == 1 or not len(rows):
            return
        if self.mix:
            self.row[rows] = self.rng.integers(self.P, size=len(rows))
        else:
            envs = np.unique(rows // self.A)
            drawn = dict(zip(envs.tolist(), self.rng.integers(self.P, size=len(envs)).tolist()))
            self.row[rows] = [drawn[r // self.A] for r in rows.tolist()]

    def at_boundary(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (whole envs', which step together) start a trajectory: those whose env's episode ended during
        the last one redraw. Returns, per row, whether its policy changed (bool)."""
        if self.P == 1:
            return np.zeros(len(rows), dtype=bool)
        before = self.row[rows]
        self.draw(rows[self.episode_ended[rows]])
        self.episode_ended[rows] = False
        return self.row[rows] != before

    def of_rows(self, lo: int, hi: int) -> list[int]:
        """The policies that drive rows ``lo .. hi - 1``, ascending."""
        return np.unique(self.row[lo:hi]).tolist() if self.P > 1 else [0]


class SyncQuota:
    """``--async_rl=False``: each row writes ``per_iteration`` trajectories (its quota); a split whose rows have all
    written theirs is parked (it asks for no actions) until the learner has trained on them and returns their slots.
    ``per_iteration`` 0: asynchronous, never parked.

    The rows of a split step together but need not end their trajectories together: a next-step autoreset costs
    its row a step that writes nothing. A row whose quota is spent while others of its split still write idles
    (:meth:`idle`): its env steps with the split, its episode goes on, and the row's next trajectory starts from
    the observation it reaches, so that every row writes exactly its quota and the iteration completes."""

    def __init__(self, per_iteration: int, rows: int, splits: int):
        self.per_iteration, self.eps = per_iteration, rows // splits
        self.left = np.full(rows, per_iteration, dtype=np.int64)

    def spend(self, rows: np.ndarray) -> None:
        """Each of ``rows`` (row indices) wrote a trajectory."""
        if self.per_iteration:
            self.left[rows] -= 1

    def idle(self, split: int) -> np.ndarray | None:
        """Per row of ``split`` (bool), whether its quota is spent; None when asynchronous."""
        return self.left[split * self.eps : (split + 1) * self.eps] == 0 if self.per_iteration else None

    def parked(self, split: int) -> bool:
        """Every row of ``split`` has written its quota: the split waits for :meth:`resume`."""
        return bool(self.per_iteration) and not self.left[split * self.eps : (split + 1) * self.eps].any()

    @property
    def all_parked(self) -> bool:
        """Every split waits for :meth:`resume`."""
        return bool(self.per_iteration) and not self.left.any()

    def resume(self) -> list[int]:
        """A new iteration: every quota full again. Returns the splits that were parked."""
        parked = [s for s in range(len(self.left) // self.eps) if self.parked(s)] if self.per_iteration else []
        self.left[:] = self.per_iteration
        return parked
