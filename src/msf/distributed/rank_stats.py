"""Statistics every rank contributes to rank 0's summaries and to PBT's decision, and their all-gathers.

Unlike the per-iteration agreement (:mod:`msf.distributed.agreement`), these are gathered, not summed:
rank 0 shows them per rank (FPS, policy lag) or averages them itself (waiting shares, episode returns over
every rank's last episodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from msf.distributed.collectives import Collectives


@dataclass(frozen=True)
class RankStats:
    """One rank's figures at a summary.

    Attributes:
        fps: this rank's env frames per second since the run (re)started.
        wait_shares: share of the time since the last summary that this rank's rollout workers, inference
            workers and learner spent waiting, each in ``[0, 1]``.
        lag: per policy, the policy lag (in versions) of its last batch here: (min, mean, max).
        empty_batches: per policy, iterations this rank joined the policy's collectives with no experience.
        lag_max_run: per policy, the largest policy lag of any sample at its first SGD step here, over the run.

    The packed vector (:meth:`pack`) is ``[4 + 5P]`` float64: fps, the three wait shares, the ``P`` lag triples,
    the ``P`` empty-batch counts, the ``P`` run maxima of the lag.
    """

    fps: float
    wait_shares: tuple[float, float, float]
    lag: tuple[tuple[float, float, float], ...]
    empty_batches: tuple[int, ...]
    lag_max_run: tuple[float, ...]

    def pack(self) -> torch.Tensor:
        """``[4 + 5P]`` float64 (see the class docstring)."""
        lags = [x for triple in self.lag for x in triple]
        return torch.tensor(
            [self.fps, *self.wait_shares, *lags, *self.empty_batches, *self.lag_max_run], dtype=torch.float64
        )

    @classmethod
    def unpack(cls, v: torch.Tensor) -> "RankStats":
        """The record :meth:`pack` made ``v`` from.

        Raises:
            ValueError: ``v`` is not a vector of ``4 + 5P`` entries.
        """
        if v.dim() != 1 or v.numel() < 4 or (v.numel() - 4) % 5:
            raise ValueError(f"a RankStats vector has 4 + 5P entries, got shape {tuple(v.shape)}")
        x = v.tolist()
        P = (len(x) - 4) // 5
        fps, waits, lags = x[0], x[1:4], x[4 : 4 + 3 * P]
        empty, run_max = x[4 + 3 * P : 4 + 4 * P], x[4 + 4 * P :]
        lag = tuple((lags[i], lags[i + 1], lags[i + 2]) for i in range(0, 3 * P, 3))
        return cls(fps, (waits[0], waits[1], waits[2]), lag, tuple(int(e) for e in empty), tuple(run_max))


def gather_rank_stats(mine: RankStats, collectives: Collectives) -> list[RankStats]:
    """Collective: every rank's :class:`RankStats`, in rank order (every rank passes the same number of
    policies)."""
    return [RankStats.unpack(row) for row in collectives.all_gather(mine.pack())]


def gather_episode_means(
    returns: Sequence[Sequence[float]], lengths: Sequence[Sequence[float]], capacity: int, collectives: Collectives
) -> list[tuple[float | None, float | None]]:
    """Collective: per policy, the mean return and mean length of the job's last ``capacity`` episodes.

    Each of the ``W`` ranks gives its last ``ceil(capacity / W)`` episodes, so that the window holds about
    ``capacity`` episodes whatever the number of ranks, as one learner's ``--stats_avg`` window does (Sample
    Factory's meaning of the flag). The ranks advance in lockstep (one all-reduce per iteration, each rank
    training the same number of trajectories in it), so equal shares are the job's most recent episodes up to
    one iteration. Taking every rank's whole ``capacity`` would make the window ``W`` times longer in env steps
    and the mean lag behind the policy by as much (a return target, --stop_at_return_mean, then stops late).

    Args:
        returns, lengths: per policy, this rank's last episodes (raw env rewards summed; agent steps), at most
            ``capacity`` each, oldest first.
        capacity: the most episodes any rank keeps per policy (``--stats_avg``), the same on every rank.

    Returns:
        per policy, (mean return, mean length) over the window; None where no rank has an episode yet.
    """
    P = len(returns)
    share = -(-capacity // collectives.world_size)
    ep = torch.full((P, 2, share), float("nan"), dtype=torch.float64)  # NaN: no episode in that place
    for p in range(P):
        rs, ns = list(returns[p])[-share:], list(lengths[p])[-share:]
        ep[p, 0, : len(rs)] = torch.tensor(rs, dtype=torch.float64)
        ep[p, 1, : len(ns)] = torch.tensor(ns, dtype=torch.float64)
    g = collectives.all_gather(ep)  # [ranks, P, 2, share]
    out = []
    for p in range(P):
        r, n = g[:, p, 0].flatten(), g[:, p, 1].flatten()
        r, n = r[~r.isnan()], n[~n.isnan()]
        out.append((float(r.mean()) if r.numel() else None, float(n.mean()) if n.numel() else None))
    return out
