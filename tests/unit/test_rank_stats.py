"""Per-rank statistics: the packed layout of a RankStats, and the gathers over a faked two-rank world."""

from __future__ import annotations

import statistics

import pytest
import torch

from msf.distributed.collectives import Collectives
from msf.distributed.rank_stats import RankStats, gather_episode_means, gather_rank_stats


class Recorder(Collectives):
    """Rank 1 of a two-rank world: records what it would send to the others."""

    world_size = 2

    def __init__(self):
        self.sent: list[torch.Tensor] = []

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        self.sent.append(t.clone())
        return t[None]


class TwoRanks(Collectives):
    """Rank 0 of a two-rank world; ``others`` holds what rank 1 sends at each gather, in order."""

    world_size = 2

    def __init__(self, others: list[torch.Tensor]):
        self.others = list(others)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return torch.stack([t, self.others.pop(0)])


A = RankStats(
    fps=1234.5,
    wait_shares=(0.1, 0.25, 0.5),
    lag=((0.0, 1.5, 3.0), (1.0, 2.0, 4.0)),
    empty_batches=(0, 7),
    lag_max_run=(9.0, 6.0),
)
B = RankStats(
    fps=1000.0,
    wait_shares=(0.2, 0.0, 1.0),
    lag=((2.0, 2.5, 5.0), (0.0, 0.0, 0.0)),
    empty_batches=(3, 1),
    lag_max_run=(5.0, 0.0),
)


def test_rank_stats_pack_into_their_layout_and_back():
    v = A.pack()
    assert v.dtype == torch.float64
    # fps, the three wait shares, each policy's (min, mean, max) lag, each policy's empty batches and run max lag
    assert v.tolist() == [1234.5, 0.1, 0.25, 0.5, 0.0, 1.5, 3.0, 1.0, 2.0, 4.0, 0, 7, 9.0, 6.0]
    assert RankStats.unpack(v) == A


def test_gather_rank_stats_returns_every_rank_in_order():
    assert gather_rank_stats(A, TwoRanks([B.pack()])) == [A, B]
    assert gather_rank_stats(A, Collectives()) == [A]


def test_a_rank_stats_vector_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="4 \\+ 5P"):
        RankStats.unpack(torch.zeros(6, dtype=torch.float64))


def test_episode_means_are_over_every_ranks_last_episodes():
    # rank 1's episodes: policy 0 has two, policy 1 none yet
    rank1 = Recorder()
    gather_episode_means([[10.0, 20.0], []], [[100, 200], []], 4, rank1)
    mine_r, mine_l = [[2.0, 3.0], []], [[8, 9], []]
    means = gather_episode_means(mine_r, mine_l, 4, TwoRanks(rank1.sent))
    assert means[0] == (statistics.mean([2.0, 3.0, 10.0, 20.0]), statistics.mean([8, 9, 100, 200]))
    assert means[1] == (None, None)  # no rank has an episode of policy 1


def test_the_window_holds_stats_avg_episodes_of_the_job_whatever_the_ranks():
    # --stats_avg=5 over 2 ranks: each gives its newest ceil(5/2) = 3 (oldest first in each list), not all 5,
    # so that the window spans as many env steps as one learner's
    rank1 = Recorder()
    gather_episode_means([[1.0, 2.0, 3.0, 4.0, 5.0]], [[1, 2, 3, 4, 5]], 5, rank1)
    assert rank1.sent[0].shape == (1, 2, 3)
    means = gather_episode_means([[10.0, 20.0, 30.0, 40.0, 50.0]], [[10, 20, 30, 40, 50]], 5, TwoRanks(rank1.sent))
    assert means[0] == (statistics.mean([3.0, 4.0, 5.0, 30.0, 40.0, 50.0]), statistics.mean([3, 4, 5, 30, 40, 50]))
    # one rank: the whole window, as before
    assert gather_episode_means([[1.0, 2.0, 3.0]], [[1, 2, 3]], 2, Collectives())[0] == (2.5, 2.5)
