"""The batcher against a real trajectory buffer and in-process queues: batch size, back-pressure (slots held
until copied out, then returned to their worker), lag dropping, routing by policy, the all-masked batch."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import torch

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces
from msf.learning.batcher import Batcher
from msf.sampling.messages import FullTrajectories, SlotsReturned
from msf.sampling.trajectory_buffer import TrajectoryBuffer

SPACES = EnvSpaces(obs_shape=(3,), obs_dtype=np.float32, discrete=True, num_actions=2)
T = 4  # rollout


def _setup(num_policies: int = 1, max_policy_lag: int = 100):
    # batch_size 8 of rollout 4: two trajectories per iteration; two workers of two envs each
    cfg = Config(rollout=T, batch_size=8, num_batches_per_epoch=1, num_workers=2, num_envs_per_worker=2)
    derived = Derived.of(cfg)
    assert derived.trajectories_per_iteration == 2
    buffer = TrajectoryBuffer.allocate(cfg, derived, SPACES)
    full, free = queue.Queue(), [queue.Queue() for _ in range(cfg.num_workers)]
    batcher = Batcher(buffer, full, free, num_policies, derived.trajectories_per_iteration, max_policy_lag)
    return batcher, buffer, full, free, derived.slots_per_worker


def _write(buffer: TrajectoryBuffer, slot: int, versions: list[int] | int = 0, policy: int = 0) -> None:
    """A trajectory that names its slot: rewards = slot, obs = 10 x slot."""
    buffer.rewards[slot] = float(slot)
    buffer.obs[slot] = 10.0 * slot
    buffer.policy_versions[slot] = torch.tensor(versions, dtype=torch.int64)
    buffer.slot_policy[slot] = policy


def _returned(q: queue.Queue) -> list[list[int]]:
    out = []
    while not q.empty():
        msg = q.get_nowait()
        assert isinstance(msg, SlotsReturned)
        out.append(msg.slots)
    return out


def test_a_batch_is_exactly_one_iteration_in_announcement_order():
    batcher, buffer, full, free, spw = _setup()
    a, b, c, d = 0, 1, spw, spw + 1  # two slots of worker 0, two of worker 1
    for s in (a, b, c, d):
        _write(buffer, s)
    full.put(FullTrajectories(worker=0, slots=[a, b]))
    full.put(FullTrajectories(worker=1, slots=[c]))
    batcher.receive(timeout=0.1)
    taken = batcher.take(0, policy_version=0)
    assert taken.batch["rewards"].shape == (2, T) and taken.batch["obs"].shape == (2, T + 1, 3)
    assert taken.batch["rewards"][:, 0].tolist() == [a, b]
    assert torch.equal(
        taken.batch["obs"], 10.0 * torch.tensor([a, b], dtype=torch.float32).view(2, 1, 1).expand(2, T + 1, 3)
    )
    assert (taken.trajectories, taken.dropped, taken.env_steps) == (2, 0, 2 * T)
    # one trajectory left: copied out, but not a batch yet
    taken = batcher.take(0, policy_version=0)
    assert taken.batch is None and (taken.trajectories, taken.env_steps) == (1, T)
    assert batcher.ready(0) == 1 and batcher.pending(0) == 0
    full.put(FullTrajectories(worker=1, slots=[d]))
    batcher.receive(timeout=0.1)
    taken = batcher.take(0, policy_version=0)
    assert taken.batch["rewards"][:, 0].tolist() == [c, d] and batcher.ready(0) == 0


def test_slots_are_held_until_copied_out_then_returned_to_their_worker():
    batcher, buffer, full, free, spw = _setup()
    slots0, slots1 = [0, 1, 2], [spw, spw + 1]
    for s in slots0 + slots1:
        _write(buffer, s)
    full.put(FullTrajectories(worker=0, slots=slots0))
    full.put(FullTrajectories(worker=1, slots=slots1))
    batcher.receive(timeout=0.1)
    assert batcher.pending(0) == 5
    assert _returned(free[0]) == [] and _returned(free[1]) == []  # announced is not free
    assert batcher.take(0, policy_version=0).batch is not None  # needs two: worker 0's first two slots
    assert _returned(free[0]) == [[0, 1]] and _returned(free[1]) == []  # the other three stay held
    assert batcher.pending(0) == 3
    assert batcher.take(0, policy_version=0).batch is not None  # worker 0's last slot and worker 1's first
    assert _returned(free[0]) == [[2]] and _returned(free[1]) == [[spw]]
    assert batcher.pending(0) == 1


def test_too_old_trajectories_are_dropped_counted_and_their_slots_returned():
    batcher, buffer, full, free, spw = _setup(max_policy_lag=2)
    # the learner is at version 10: a trajectory's lag is 10 minus the oldest version that acted in it
    _write(buffer, 0, versions=7)  # lag 3: dropped
    _write(buffer, 1, versions=8)  # lag 2: kept
    _write(buffer, 2, versions=[10, 10, 7, 10])  # one old step: lag 3, dropped
    _write(buffer, 3, versions=[8, 9, 10, 10])  # lag 2: kept
    full.put(FullTrajectories(worker=0, slots=[0, 1, 2, 3]))
    batcher.receive(timeout=0.1)
    first = batcher.take(0, policy_version=10)
    assert first.batch is None and (first.trajectories, first.dropped, first.env_steps) == (2, 1, 2 * T)
    second = batcher.take(0, policy_version=10)  # one more needed: slot 2, dropped
    assert second.batch is None and (second.trajectories, second.dropped) == (1, 1)
    third = batcher.take(0, policy_version=10)
    assert (third.trajectories, third.dropped) == (1, 0)
    assert third.batch["rewards"][:, 0].tolist() == [1, 3]
    assert _returned(free[0]) == [[0, 1], [2], [3]]  # dropped or not, every copied-out slot is free again


def test_trajectories_go_to_the_policy_their_slot_names():
    batcher, buffer, full, free, spw = _setup(num_policies=2)
    for s, p in ((0, 1), (1, 0), (2, 1), (spw, 0)):
        _write(buffer, s, policy=p)
    full.put(FullTrajectories(worker=0, slots=[0, 1, 2]))
    full.put(FullTrajectories(worker=1, slots=[spw]))
    batcher.receive(timeout=0.1)
    assert (batcher.pending(0), batcher.pending(1)) == (2, 2)
    assert batcher.take(1, policy_version=0).batch["rewards"][:, 0].tolist() == [0, 2]
    assert batcher.take(0, policy_version=0).batch["rewards"][:, 0].tolist() == [1, spw]


def test_receive_waits_at_most_its_timeout():
    batcher, *_ = _setup()
    batcher.receive(timeout=0.01)  # nothing announced: returns
    assert batcher.pending(0) == 0


class _RecordingQueue(queue.Queue):
    """A queue that records the timeout of every ``get``."""

    def __init__(self):
        super().__init__()
        self.timeouts: list[float | None] = []

    def get(self, block=True, timeout=None):
        self.timeouts.append(timeout)
        return super().get(block, timeout)


def test_receive_waits_only_while_no_policy_has_a_whole_batch():
    batcher, buffer, _, free, spw = _setup(num_policies=2)
    batcher.full_queue = full = _RecordingQueue()
    for s, p in ((0, 0), (1, 1), (2, 1)):
        _write(buffer, s, policy=p)
    full.put(FullTrajectories(worker=0, slots=[0, 1]))  # one each: neither policy has its two
    batcher.receive(timeout=0.5)
    assert full.timeouts == [0.5, None]  # waited for the first message, then took what was queued
    batcher.receive(timeout=0.5)
    assert full.timeouts[2] == 0.5  # still no whole batch: it waits
    full.put(FullTrajectories(worker=0, slots=[2]))
    batcher.receive(timeout=0.5)  # policy 1 now has two announced
    full.timeouts.clear()
    batcher.receive(timeout=0.5)
    assert full.timeouts == [0.0]  # a batch is there to train on: no wait
    assert batcher.take(1, policy_version=0).batch["rewards"][:, 0].tolist() == [1, 2]
    batcher.receive(timeout=0.5)
    assert full.timeouts[-1] == 0.5  # trained: policy 0's one trajectory is not a batch, so it waits again


@pytest.mark.parametrize("use_rnn", [False, True])
def test_the_empty_batch_has_a_real_batchs_shapes_and_is_all_masked(use_rnn):
    cfg = Config(rollout=T, batch_size=8, num_workers=2, num_envs_per_worker=2, use_rnn=use_rnn, rnn_size=5)
    derived = Derived.of(cfg)
    buffer = TrajectoryBuffer.allocate(cfg, derived, SPACES)
    buffer.rewards.fill_(1.0)
    batcher = Batcher(buffer, queue.Queue(), [queue.Queue()] * 2, 1, derived.trajectories_per_iteration, 100)
    real = buffer.gather(torch.arange(derived.trajectories_per_iteration))
    empty = batcher.empty_batch()
    assert set(empty) == set(real) | {"valids"} and ("rnn_states" in empty) == use_rnn
    for k, v in real.items():
        assert empty[k].shape == v.shape and empty[k].dtype == v.dtype, k
    assert empty["valids"].shape == (derived.trajectories_per_iteration, T)
    assert empty["valids"].dtype == torch.uint8 and int(empty["valids"].sum()) == 0
    empty["valids"].fill_(1)  # a learner may change it in place: the next one is still all masked
    assert int(batcher.empty_batch()["valids"].sum()) == 0
