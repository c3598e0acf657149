"""The per-iteration agreement: the vector layout of a proposal, and that the decision is the sum over ranks."""

from __future__ import annotations

import pytest
import torch

from msf.distributed.agreement import Decision, Proposal, agree
from msf.distributed.collectives import Collectives


class TwoRankSum(Collectives):
    """Rank 0 of a two-rank world whose other rank proposed ``other``: the all-reduce adds its vector."""

    world_size = 2

    def __init__(self, other: Proposal):
        self.other = other.pack()
        self.calls = 0

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return t.add_(self.other)


P0 = Proposal(
    stop=True,
    failed=False,
    summary_due=True,
    save_due=False,
    time_spent=False,
    env_steps=4096,
    episodes=17,
    dropped_trajectories=3,
    env_step_calls=2048,
    has_batch=(True, False, True),
    policy_env_steps=(2048, 0, 2048),
    policy_dropped=(1, 0, 2),
)
P1 = Proposal(
    stop=False,
    failed=True,
    summary_due=False,
    save_due=False,
    time_spent=True,
    env_steps=2**40 + 1,  # exact in float64
    episodes=5,
    dropped_trajectories=0,
    env_step_calls=7,
    has_batch=(True, True, False),
    policy_env_steps=(2**40, 1, 0),
    policy_dropped=(0, 0, 0),
)


def test_a_proposal_packs_into_the_documented_layout_and_back():
    v = P0.pack()
    assert v.dtype == torch.float64
    # stop, failed, summary_due, save_due, time_spent, env_steps, episodes, dropped, env_step_calls, then per
    # policy: has a batch, env steps, dropped
    assert v.tolist() == [1, 0, 1, 0, 0, 4096, 17, 3, 2048, 1, 0, 1, 2048, 0, 2048, 1, 0, 2]
    assert Proposal.unpack(v) == P0
    assert Proposal.unpack(P1.pack()) == P1 and Proposal.unpack(P1.pack()).env_steps == 2**40 + 1


def test_a_decision_unpacks_the_summed_vector():
    d = Decision.unpack(torch.tensor([2, 0, 1, 1, 0, 8192, 30, 4, 4096, 2, 0, 8000, 192, 4, 0], dtype=torch.float64))
    assert d == Decision(
        stop=2,
        failed=0,
        summary_due=1,
        save_due=1,
        time_spent=0,
        env_steps=8192,
        episodes=30,
        dropped_trajectories=4,
        env_step_calls=4096,
        has_batch=(2, 0),
        policy_env_steps=(8000, 192),
        policy_dropped=(4, 0),
    )
    assert Decision.unpack(d.pack()) == d


def test_the_decision_of_two_ranks_is_the_sum_of_their_proposals():
    world = TwoRankSum(P1)
    d = agree(P0, world)
    assert world.calls == 1  # one all-reduce per agreement
    assert d == Decision(
        stop=1,
        failed=1,
        summary_due=1,
        save_due=0,
        time_spent=1,
        env_steps=4096 + 2**40 + 1,
        episodes=22,
        dropped_trajectories=3,
        env_step_calls=2055,
        has_batch=(2, 1, 1),
        policy_env_steps=(2048 + 2**40, 1, 2048),
        policy_dropped=(1, 0, 2),
    )


def test_a_proposal_without_per_policy_counts_packs_zeros():
    v = Proposal(env_steps=5, has_batch=(True, False)).pack()
    assert v.tolist()[9:] == [1, 0, 0, 0, 0, 0]


def test_one_rank_decides_what_it_proposed():
    d = agree(P0, Collectives())
    assert (d.stop, d.failed, d.summary_due, d.env_steps, d.has_batch) == (1, 0, 1, 4096, (1, 0, 1))


@pytest.mark.parametrize(
    "bad",
    [torch.zeros(8, dtype=torch.float64), torch.zeros(2, 9, dtype=torch.float64), torch.zeros(10, dtype=torch.float64)],
)
def test_a_vector_of_the_wrong_shape_is_refused(bad):
    with pytest.raises(ValueError, match="9 \\+ 3P entries"):
        Decision.unpack(bad)
