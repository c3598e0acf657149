"""The rollout worker's bookkeeping, in one process, over fake env splits whose observations say where they
come from: cursors, trajectory boundaries, core states, policy draws, episode statistics."""

from __future__ import annotations

import queue
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces
from msf.runtime.spawning import OneLineFailure
from msf.sampling.messages import EpisodeStats, FullTrajectories, RolloutCounters
from msf.sampling.protocol import RolloutWorkerSpec
from msf.sampling.rollout_worker import RolloutWorker, Stopped
from msf.sampling.trajectory_buffer import TrajectoryBuffer

T = 4
# global env -> episode length; env 3's episodes end truncated, the others terminated
LENGTHS = {0: 2, 1: 4, 2: 100, 3: 3}
TRUNCATED = {3}


class FakeSplit:
    """An :class:`~msf.sampling.protocol.EnvSplit` of scripted envs. Observation ``[global env, episode, step
    in the episode, seed]``; reward ``10 * env + step`` (the step after stepping); episode ``k`` of env ``e``
    ends after ``LENGTHS[e]`` steps. Records the actions it was stepped with."""

    def __init__(self, env_indices: list[int], seed: int):
        self.envs = np.array(env_indices)
        self.seed = seed
        self.lengths = np.array([LENGTHS[e] for e in env_indices])
        self.trunc_mask = np.array([e in TRUNCATED for e in env_indices])
        self.episode = np.zeros(len(env_indices), dtype=np.int64)
        self.t = np.zeros(len(env_indices), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(5)
        self.actions: list[np.ndarray] = []
        self.closed = False
        self.autoreset_rows = None

    def _obs(self) -> list[np.ndarray]:
        return [np.array([e, k, t, self.seed], np.float32) for e, k, t in zip(self.envs, self.episode, self.t)]

    def reset(self) -> list[np.ndarray]:
        return self._obs()

    def step(self, actions):
        self.actions.append(np.array(actions))
        self.t += 1
        rew = (10 * self.envs + self.t).astype(np.float32)
        ended = self.t == self.lengths
        self.episode[ended] += 1
        self.t[ended] = 0
        return self._obs(), rew, ended & ~self.trunc_mask, ended & self.trunc_mask

    def close(self) -> None:
        self.closed = True


class Rig:
    """One rollout worker (4 envs in 2 splits, rollout 4) over fake splits, with in-process queues; plays
    the inference worker by hand (:meth:`act`)."""

    def __init__(self, num_policies: int = 1, use_rnn: bool = False):
        self.cfg = Config(
            num_workers=1,
            num_envs_per_worker=4,
            worker_num_splits=2,
            rollout=T,
            batch_size=T * 4,
            seed=11,
            num_policies=num_policies,
            use_rnn=use_rnn,
            rnn_type="gru",
            rnn_size=3,
            rnn_num_layers=1,
        )
        self.derived = Derived.of(self.cfg)
        self.buffer = TrajectoryBuffer.allocate(self.cfg, self.derived, EnvSpaces((4,), np.float32, True, 5))
        self.full, self.free, self.stats = queue.Queue(), queue.Queue(), queue.Queue()
        self.stop = threading.Event()
        self.requests: list[tuple[int, int]] = []
        self.splits: list[FakeSplit] = []
        spec = RolloutWorkerSpec(
            cfg=self.cfg,
            derived=self.derived,
            index=0,
            buffer=self.buffer,
            conns=[],
            full_queue=self.full,
            free_queue=self.free,
            stats_queue=self.stats,
            stop_event=self.stop,
            parent_pid=None,
            counters=RolloutCounters(),
        )
        self.worker = RolloutWorker(spec, make_split=self._make_split, send_request=self._send)
        self.acted = 0

    def _make_split(self, cfg, worker_index, env_indices, seed, device_group=0, on_env=None):
        self.splits.append(FakeSplit(env_indices, seed))
        return self.splits[-1]

    def _send(self, policy: int, split: int) -> None:
        self.requests.append((policy, split))

    def cursors(self, split: int) -> np.ndarray:
        return self.buffer.cursors[0, 2 * split : 2 * split + 2].numpy().copy()

    def act(self, split: int) -> np.ndarray:
        """Write actions (and next core states) at the split's cursors as an inference worker would; return
        the actions."""
        cur = self.cursors(split)
        self.acted += 1
        actions = np.array([(2 * split + i + self.acted) % 5 for i in range(2)])
        self.buffer.actions[cur[:, 0], cur[:, 1]] = torch.from_numpy(actions)
        if self.cfg.use_rnn:
            for i, (s, t) in enumerate(cur):
                self.buffer.rnn_states[s, t + 1] = float(100 * self.acted + 2 * split + i + 1)
        return actions

    def step(self, split: int) -> None:
        self.act(split)
        assert self.worker.on_reply(split)

    def full_messages(self) -> list[FullTrajectories]:
        out = []
        while True:
            try:
                out.append(self.full.get_nowait())
            except queue.Empty:
                return out


def test_start_gives_every_row_a_slot_and_requests_every_split():
    rig = Rig()
    rig.worker.start()
    cur = rig.buffer.cursors[0].numpy()
    assert len(set(cur[:, 0].tolist())) == 4 and (cur[:, 1] == 0).all()
    for e, (s, _) in enumerate(cur):
        np.testing.assert_array_equal(rig.buffer.obs[s, 0].numpy(), [e, 0, 0, 11])
    assert rig.requests == [(0, 0), (0, 1)]


def test_a_step_writes_at_the_cursor_and_advances_it():
    rig = Rig()
    rig.worker.start()
    rig.requests.clear()
    before0, before1 = rig.cursors(0), rig.cursors(1)
    actions = rig.act(0)
    assert rig.worker.on_reply(0)
    np.testing.assert_array_equal(rig.splits[0].actions[-1], actions)  # the env got the actions at the cursor
    after0 = rig.cursors(0)
    np.testing.assert_array_equal(after0[:, 0], before0[:, 0])
    np.testing.assert_array_equal(after0[:, 1], before0[:, 1] + 1)
    np.testing.assert_array_equal(rig.cursors(1), before1)  # the other split did not move
    slots = before0[:, 0]
    np.testing.assert_array_equal(rig.buffer.rewards[slots, 0].numpy(), [1.0, 11.0])
    np.testing.assert_array_equal(rig.buffer.obs[slots[0], 1].numpy(), [0, 0, 1, 11])
    np.testing.assert_array_equal(rig.buffer.obs[slots[1], 1].numpy(), [1, 0, 1, 11])
    assert rig.requests == [(0, 0)]  # asked again for the split it stepped
    assert rig.full_messages() == []


def test_trajectory_boundary_moves_the_bootstrap_row_to_a_new_slot_and_announces_the_old_one():
    rig = Rig()
    rig.worker.start()
    first = [rig.cursors(0)[:, 0], rig.cursors(1)[:, 0]]
    for _ in range(T):
        rig.step(0)
        rig.step(1)
    msgs = rig.full_messages()
    assert msgs == [FullTrajectories(0, first[0].tolist()), FullTrajectories(0, first[1].tolist())]
    for split in (0, 1):
        cur, old = rig.cursors(split), first[split]
        assert (cur[:, 1] == 0).all() and not set(cur[:, 0]) & set(old)
        for new, o in zip(cur[:, 0], old):
            np.testing.assert_array_equal(rig.buffer.obs[new, 0].numpy(), rig.buffer.obs[o, T].numpy())
    # env 0 (episodes of 2) ended at steps 1 and 3, env 1 (4) at 3, env 3 (3, truncated) at 2, env 2 never
    dones = rig.buffer.dones[np.concatenate(first)].numpy()
    np.testing.assert_array_equal(dones, [[0, 1, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0]])
    np.testing.assert_array_equal(rig.buffer.time_outs[np.concatenate(first)].numpy()[3], [0, 0, 1, 0])
    assert rig.buffer.time_outs[np.concatenate(first)[:3]].sum() == 0
    # after an episode end the next observation is the new episode's first
    np.testing.assert_array_equal(rig.buffer.obs[first[0][0], 2].numpy(), [0, 1, 0, 11])
    # one more trajectory: announced again, exactly the slots that filled
    second = [rig.cursors(0)[:, 0], rig.cursors(1)[:, 0]]
    for _ in range(T):
        rig.step(0)
        rig.step(1)
    assert rig.full_messages() == [FullTrajectories(0, s.tolist()) for s in second]


def test_core_state_is_carried_to_the_new_slot_and_zeroed_at_an_episode_end():
    rig = Rig(use_rnn=True)
    rig.worker.start()
    first = rig.cursors(0)[:, 0]  # env 0 ends at steps 1 and 3 (the last), env 1 at step 3 (the last)
    for _ in range(T):
        rig.step(0)
    rnn = rig.buffer.rnn_states
    assert (rnn[first, 0] == 0).all()  # a first episode starts from zeros
    assert (rnn[first[0], 2] == 0).all()  # zeroed after env 0's episode end at step 1
    assert (rnn[first[0], 1] != 0).all() and (rnn[first[0], 3] != 0).all()
    new = rig.cursors(0)[:, 0]
    assert (rnn[new, 0] == 0).all()  # both episodes ended at the last step: the new slots start from zeros
    second = rig.cursors(1)[:, 0]  # env 2 never ends, env 3 ends at step 2: mid-trajectory
    for _ in range(T):
        rig.step(1)
    new = rig.cursors(1)[:, 0]
    assert (rnn[second, T] != 0).all()
    np.testing.assert_array_equal(rnn[new, 0].numpy(), rnn[second, T].numpy())  # carried over


class FixedDraws:
    """Stands in for the worker's random generator: every draw is ``value``; records the sizes drawn."""

    def __init__(self):
        self.value, self.sizes = 0, []

    def integers(self, high, size):
        self.sizes.append(size)
        return np.full(size, self.value, dtype=np.int64)


def test_policies_are_redrawn_only_for_envs_whose_episode_ended_and_a_switch_zeros_the_core_state():
    rig = Rig(num_policies=2, use_rnn=True)
    draws = rig.worker.policies.rng = FixedDraws()
    rig.worker.start()
    assert draws.sizes == [4] and (rig.buffer.slot_policy[rig.buffer.cursors[0, :, 0]] == 0).all()
    draws.value = 1
    old = np.concatenate([rig.cursors(0)[:, 0], rig.cursors(1)[:, 0]])
    for _ in range(T):
        rig.step(0)
        rig.step(1)
    # envs 0, 1 (split 0) and 3 (split 1) had an episode end in their trajectory; env 2 did not
    assert draws.sizes == [4, 2, 1]
    np.testing.assert_array_equal(rig.worker.policies.row, [1, 1, 0, 1])
    new = rig.buffer.cursors[0, :, 0].numpy()
    np.testing.assert_array_equal(rig.buffer.slot_policy[new].numpy(), [1, 1, 0, 1])
    rnn = rig.buffer.rnn_states
    assert (rnn[old[3], T] != 0).all() and (rnn[new[3], 0] == 0).all()  # switched: zeros, not the carry
    np.testing.assert_array_equal(rnn[new[2], 0].numpy(), rnn[old[2], T].numpy())  # same policy: carried
    # the next requests go to every policy of the split, and the split steps once all have answered
    rig.requests.clear()
    rig.act(1)
    assert not rig.worker.on_reply(1)
    assert rig.worker.on_reply(1)
    assert rig.requests == [(0, 1), (1, 1)]


def test_finished_episodes_are_reported_as_episode_stats():
    rig = Rig()
    rig.worker.start()
    for _ in range(T):
        rig.step(0)
        rig.step(1)
    rig.worker.report_stats(rig.worker.episodes.taken_at)  # within the period: nothing yet
    assert rig.stats.empty()
    rig.worker.report_stats(time.monotonic() + 1.0)
    s = rig.stats.get_nowait()
    # in the order they ended: env 0 at step 2, env 3 at step 3, env 0 and env 1 at step 4
    assert s == EpisodeStats(0, [1.0 + 2, 31.0 + 32 + 33, 1.0 + 2, 11.0 + 12 + 13 + 14], [2, 3, 2, 4], [0, 0, 0, 0])
    rig.worker.report_stats(time.monotonic() + 2.0)
    assert rig.stats.empty()  # nothing new


def test_waiting_for_a_free_slot_ends_with_stopped_when_the_stop_event_is_set():
    rig = Rig()
    rig.worker.start()
    rig.worker.slots.free.clear()
    rig.stop.set()
    for _ in range(T - 1):
        rig.step(0)
    rig.act(0)
    with pytest.raises(Stopped):
        rig.worker.on_reply(0)
    rig.worker.close()
    assert all(s.closed for s in rig.splits)


def test_a_non_finite_first_observation_is_named_with_its_env_and_the_reset():
    rig = Rig()
    obs = rig.splits[1].reset()
    obs[1][2] = np.inf
    rig.splits[1].reset = lambda: obs
    with pytest.raises(OneLineFailure) as e:
        rig.worker.start()
    assert str(e.value) == (
        f"{rig.cfg.env} returned a non-finite observation (inf) on rollout worker 0, env 3, at its first reset"
    )
