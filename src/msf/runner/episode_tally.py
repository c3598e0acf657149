"""``--deterministic``'s episode statistics: read from the trajectories the learner trains on, in their order."""

from __future__ import annotations

import numpy as np
import torch


class EpisodeTally:
    """The episodes that ended in each batch, from the batch's own rewards and dones.

    Rollout workers report finished episodes on a queue every ~0.25 s, so which episodes a summary or a
    checkpoint holds, and in which order, depends on timing. With ``--deterministic`` the training loop takes
    the episodes from here instead: each batch's trajectories are in job-wide env order (``Taken.keys``), so
    the episodes can be put in the order they ended, (step within the batch, env row), the same on every run
    of the same seed and whether the envs are stepped by worker processes or by ``--serial_mode``; the newest
    are last, as the ``--stats_avg`` window expects. An episode that began in an earlier batch is carried over
    by its env row (a row's trajectories follow each other from batch to batch).

    The sums are over the float32 rewards of the buffer, added in float64 (the same inputs give the same sum on
    every run; the workers' own reports add the env's float64 rewards: the two may differ in the last bits for
    non-integer rewards).
    """

    def __init__(self) -> None:
        self._carry: dict[int, tuple[float, int]] = {}  # env row -> (return so far, length so far)

    def add(self, batch: dict[str, torch.Tensor], keys: torch.Tensor) -> tuple[list[float], list[int]]:
        """The episodes that ended in ``batch``, in the order they ended: by the step within the batch (a row's
        ``j``-th trajectory in it covers steps ``j T .. j T + T - 1``), then by env row.

        Args:
            batch: ``rewards`` ``[B, T]`` float32 (raw env rewards) and ``dones`` ``[B, T]`` uint8, its rows
                ordered by ``keys``.
            keys: ``[B]`` int64 slot keys, ascending: ``row << 32 | that row's trajectory count``.

        Returns:
            (returns, lengths in agent steps) of the episodes that ended, oldest first.
        """
        rewards = batch["rewards"].numpy().astype(np.float64)
        dones = batch["dones"].numpy().astype(bool)
        rows = (keys >> 32).tolist()
        T = rewards.shape[1]
        ended: list[tuple[int, int, float, int]] = []  # (step within the batch, row, return, length)
        seen: dict[int, int] = {}  # row -> its trajectories so far in this batch
        for i, row in enumerate(rows):
            j = seen.get(row, 0)
            seen[row] = j + 1
            ret, length = self._carry.get(row, (0.0, 0))
            start = 0
            for t in np.flatnonzero(dones[i]).tolist():
                ended.append((j * T + t, row, ret + float(rewards[i, start : t + 1].sum()), length + t + 1 - start))
                ret, length, start = 0.0, 0, t + 1
            self._carry[row] = (ret + float(rewards[i, start:].sum()), length + T - start)
        ended.sort(key=lambda e: (e[0], e[1]))
        return [e[2] for e in ended], [e[3] for e in ended]
