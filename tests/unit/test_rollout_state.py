"""The rollout worker's state values, each on its own: slots and their keys, running episodes, policy draws, the
synchronous quota."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from msf.sampling.messages import SlotsReturned
from msf.sampling.rollout_state import PolicyDraw, RunningEpisodes, SlotPool, SyncQuota


def test_slots_are_taken_in_order_and_keyed_by_job_wide_row_and_trajectory_count():
    keys = np.zeros(10, dtype=np.int64)
    pool = SlotPool(range(4, 7), keys, queue.Queue(), first_row=8, rows=2)
    assert [pool.take(0), pool.take(1), pool.take(0)] == [4, 5, 6]
    assert keys[4:7].tolist() == [8 << 32, 9 << 32, (8 << 32) | 1]
    np.testing.assert_array_equal(pool.trajectories, [2, 1])
    with pytest.raises(IndexError):
        pool.take(1)


def test_returned_slots_are_taken_back_in_the_order_they_came():
    q = queue.Queue()
    pool = SlotPool(range(0), np.zeros(8, dtype=np.int64), q, first_row=0, rows=1)
    assert not pool.take_returned(timeout=None)
    q.put(SlotsReturned([3, 1]))
    q.put(SlotsReturned([2]))
    assert pool.take_returned(timeout=None)
    assert list(pool.free) == [3, 1, 2]
    assert not pool.take_returned(timeout=0.01)  # waited, nothing came


def test_running_episodes_add_up_per_row_and_are_taken_once_the_period_has_passed():
    ep = RunningEpisodes(rows=4, now=100.0)
    policy = np.array([0, 1, 1, 0])
    ep.add(0, np.array([1.0, 2.0]), np.array([False, False]), policy)
    ep.add(2, np.array([5.0, 7.0]), np.array([True, False]), policy)
    ep.add(0, np.array([0.5, 3.0]), np.array([True, True]), policy)
    assert ep.take(100.2, period_s=0.25) is None  # within the period
    assert ep.take(100.3, period_s=0.25) == ([5.0, 1.5, 5.0], [1, 2, 2], [1, 0, 1])
    np.testing.assert_array_equal(ep.ret, [0.0, 0.0, 0.0, 7.0])
    np.testing.assert_array_equal(ep.len, [0, 0, 0, 1])
    assert ep.take(200.0, period_s=0.25) is None  # nothing new


class Draws:
    """A generator whose draws are 1, 2, 3, ...; records the sizes drawn."""

    def __init__(self):
        self.next, self.sizes = 1, []

    def integers(self, high, size):
        self.sizes.append(size)
        out = np.arange(self.next, self.next + size) % high
        self.next += size
        return out


def test_one_policy_is_drawn_per_env_unless_mixed():
    per_env = PolicyDraw(policies=4, agents=2, rows=6, mix=False, rng=Draws())
    per_env.draw(np.arange(6))
    np.testing.assert_array_equal(per_env.row, [1, 1, 2, 2, 3, 3])
    mixed = PolicyDraw(policies=4, agents=2, rows=6, mix=True, rng=Draws())
    mixed.draw(np.arange(6))
    np.testing.assert_array_equal(mixed.row, [1, 2, 3, 0, 1, 2])
    assert mixed.of_rows(0, 4) == [0, 1, 2, 3] and mixed.of_rows(4, 6) == [1, 2]


def test_at_a_boundary_only_rows_whose_episode_ended_redraw():
    draw = PolicyDraw(policies=3, agents=1, rows=3, mix=False, rng=Draws())
    draw.draw(np.arange(3))  # 1, 2, 0
    draw.episode_ended[[0, 2]] = True
    # rows 0 and 2 redraw (1 -> 1: the same policy, not a switch; 0 -> 2), row 1 keeps its policy
    np.testing.assert_array_equal(draw.at_boundary(np.arange(3)), [False, False, True])
    np.testing.assert_array_equal(draw.row, [1, 2, 2])
    assert draw.rng.sizes == [3, 2] and not draw.episode_ended.any()
    draw.episode_ended[1] = True
    np.testing.assert_array_equal(draw.at_boundary(np.arange(3)), [False, True, False])  # 2 -> 0
    np.testing.assert_array_equal(draw.row, [1, 0, 2])


def test_one_policy_never_draws():
    draw = PolicyDraw(policies=1, agents=1, rows=2, mix=False, rng=None)
    draw.draw(np.arange(2))
    draw.episode_ended[:] = True
    np.testing.assert_array_equal(draw.at_boundary(np.arange(2)), [False, False])
    assert draw.of_rows(0, 2) == [0] and draw.row.tolist() == [0, 0]


def test_a_split_is_parked_once_its_quota_is_spent_and_resumed_with_a_full_one():
    q = SyncQuota(per_iteration=2, rows=4, splits=2)  # rows 0, 1: split 0; rows 2, 3: split 1
    q.spend(np.array([0, 1]))
    assert not q.parked(0) and not q.all_parked
    q.spend(np.array([0, 1]))
    assert q.parked(0) and not q.parked(1) and not q.all_parked
    q.spend(np.array([2, 3]))
    q.spend(np.array([2, 3]))
    assert q.all_parked
    assert q.resume() == [0, 1]
    assert q.left.tolist() == [2, 2, 2, 2] and q.resume() == []


def test_rows_of_a_split_that_end_apart_idle_until_the_last_has_written_its_quota():
    """Next-step autoresets put rows of one split out of step: the first to spend its quota idles, the split is
    parked only when the last one has spent its."""
    q = SyncQuota(per_iteration=1, rows=4, splits=2)
    q.spend(np.array([1]))
    assert q.idle(0).tolist() == [False, True] and not q.parked(0)
    q.spend(np.array([0]))
    assert q.idle(0).tolist() == [True, True] and q.parked(0) and q.idle(1).tolist() == [False, False]


def test_asynchronous_never_parks():
    q = SyncQuota(per_iteration=0, rows=4, splits=2)
    for _ in range(3):
        q.spend(np.array([0, 1]))
    assert q.idle(0) is None
    assert not q.parked(0) and not q.all_parked and q.resume() == []
