"""The rollout worker: steps ``num_envs_per_worker`` environments in ``worker_num_splits`` groups.

Double-buffered sampling: the envs are split into groups; when a group has stepped, the
worker writes its observations to the trajectory buffer and asks the inference worker
for actions with one byte on a pipe, then steps whichever group has its actions back.
While the inference worker computes one group's actions, the worker steps another.
"""

from __future__ import annotations

import collections
import logging
import queue
import time
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from msf.cfg.config import Config, Derived
from msf.envs.vector import make_split
from msf.runtime.affinity import ROLLOUT_NICENESS, pin_this_process, raise_niceness
from msf.runtime.supervision import parent_alive
from msf.sampling.messages import EpisodeStats, FullTrajectories, RolloutCounters
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")

# No actions for this long means the inference worker is gone or stuck.
ACTION_TIMEOUT_S = 120.0
STATS_PERIOD_S = 0.25


class _Stop(Exception):
    """The run is stopping (stop event set or parent gone)."""


class RolloutWorker:
    """State of one rollout worker (see module docstring).

    Args:
        cfg, derived: the run's configuration.
        index: worker index ``w`` in ``[0, num_workers)``.
        buffer: the device group's trajectory buffer.
        conns: this worker's pipe ends, one per policy, to the inference worker of that policy that
            serves it.
        full_queue: where finished trajectories are announced (:class:`FullTrajectories`).
        free_queue: where the learner returns this worker's slots once copied out.
        stats_queue: where finished episodes are reported (:class:`EpisodeStats`).
        stop_event: set by the main process to stop.
        wait_seconds: the shared counter this worker adds its waiting time to (seconds
            blocked on actions or on a free slot), for the summaries' share of time spent waiting.
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        index: int,
        buffer: TrajectoryBuffer,
        conns: list[Connection],
        full_queue: Any,
        free_queue: Any,
        stats_queue: Any,
        stop_event: Any,
        parent_pid: int,
        wait_seconds: RolloutCounters,
    ):
        self.cfg, self.index, self.conns = cfg, index, conns
        self.wait_seconds = wait_seconds
        self.full_queue, self.free_queue, self.stats_queue = full_queue, free_queue, stats_queue
        self.stop_event, self.parent_pid = stop_event, parent_pid
        self.T = cfg.rollout
        # rows: one per agent of each env (env e's agents are rows e * A .. e * A + A - 1)
        self.E = cfg.num_envs_per_worker * derived.num_agents
        self.eps = derived.agents_per_split
        b = buffer.numpy_views()
        self.obs, self.rewards, self.dones = b["obs"], b["rewards"], b["dones"]
        self.time_outs, self.actions, self.cursors = b["time_outs"], b["actions"], b["cursors"][index]
        self.rnn_states = b["rnn_states"] if b["rnn_states"].shape[-1] else None
        self.slot_policy = b["slot_policy"]
        self.obs_dtype = self.obs.dtype
        first = index * derived.slots_per_worker
        self.free_slots = collections.deque(range(first, first + derived.slots_per_worker))
        seed = cfg.seed if cfg.seed is not None else int(np.random.SeedSequence().entropy % (2**31))
        # one EnvSplit per split: envs [lo, hi) of this worker, global env index index * E + e
        n_env, e_split = cfg.num_envs_per_worker, derived.envs_per_split
        self.splits = [
            make_split(cfg, index, [index * n_env + e for e in range(s * e_split, (s + 1) * e_split)], seed)
            for s in range(cfg.worker_num_splits)
        ]
        space = self.splits[0].action_space
        self.action_bounds = (space.low, space.high) if hasattr(space, "low") else None
        self.ep_return = np.zeros(self.E, dtype=np.float64)
        self.ep_len = np.zeros(self.E, dtype=np.int64)
        self.done_returns: list[float] = []
        self.done_lengths: list[int] = []
        self.done_policies: list[int] = []
        self.last_stats = time.monotonic()
        # which policy drives each row: drawn at the start, and again at the first trajectory boundary
        # after an episode of the row's env ended (so a trajectory is one policy's)
        self.P = cfg.num_policies
        self.A = derived.num_agents
        self.rng = np.random.default_rng([seed, index, 7])
        self.row_policy = np.zeros(self.E, dtype=np.int64)
        self.episode_ended = np.zeros(self.E, dtype=bool)  # since the row's trajectory started
        self.waiting = np.zeros(cfg.worker_num_splits, dtype=np.int64)  # replies still due per split

    def _take_slot(self) -> int:
        """A free slot of this worker; blocks (back-pressure from the learner) until one is returned."""
        if not self.free_slots:
            t0 = time.monotonic()
            while not self.free_slots:
                try:
                    self.free_slots.extend(self.free_queue.get(timeout=0.5).slots)
                except queue.Empty:
                    self._check_stop()
            self.wait_seconds.add_wait(time.monotonic() - t0)
        return self.free_slots.popleft()

    def _check_stop(self) -> None:
        if self.stop_event.is_set() or not parent_alive(self.parent_pid):
            raise _Stop

    def _draw_policies(self, rows: np.ndarray) -> None:
        """New policies for ``rows`` (whole envs' rows): one per agent with ``pbt_mix_policies_in_one_env``,
        else one per env (Sample Factory's mapping)."""
        if self.P == 1 or not len(rows):
            return
        if self.cfg.pbt_mix_policies_in_one_env:
            self.row_policy[rows] = self.rng.integers(self.P, size=len(rows))
        else:
            envs = np.unique(rows // self.A)
            drawn = dict(zip(envs.tolist(), self.rng.integers(self.P, size=len(envs)).tolist()))
            self.row_policy[rows] = [drawn[r // self.A] for r in rows.tolist()]

    def _reset_all(self) -> None:
        self._draw_policies(np.arange(self.E))
        for split, envs in enumerate(self.splits):
            for i, obs in enumerate(envs.reset()):
                e = split * self.eps + i
                slot = self._take_slot()
                self.cursors[e] = (slot, 0)
                self.slot_policy[slot] = self.row_policy[e]
                self.obs[slot, 0] = obs
                if self.rnn_states is not None:
                    self.rnn_states[slot, 0] = 0.0

    def _step_split(self, split: int) -> None:
        lo, hi = split * self.eps, (split + 1) * self.eps
        cur = self.cursors[lo:hi]
        slots, ts = cur[:, 0].copy(), cur[:, 1].copy()
        actions = self.actions[slots, ts]
        if self.action_bounds is not None:
            actions = np.clip(actions, *self.action_bounds)
        next_obs, rew, term, trunc = self.splits[split].step(actions)
        ended = term | trunc
        done = ended.astype(np.uint8)
        tout = (trunc & ~term).astype(np.uint8)
        self.ep_return[lo:hi] += rew
        self.ep_len[lo:hi] += 1
        for i in np.nonzero(ended)[0]:
            self.done_returns.append(float(self.ep_return[lo + i]))
            self.done_lengths.append(int(self.ep_len[lo + i]))
            self.done_policies.append(int(self.row_policy[lo + i]))
        self.episode_ended[lo:hi] |= ended
        self.ep_return[lo:hi][ended] = 0.0
        self.ep_len[lo:hi][ended] = 0
        self.rewards[slots, ts] = rew
        self.dones[slots, ts] = done
        self.time_outs[slots, ts] = tout
        ts += 1
        self.obs[slots, ts] = np.asarray(next_obs, dtype=self.obs_dtype)
        if self.rnn_states is not None:
            ended = np.nonzero(done)[0]
            if len(ended):
                # a new episode starts with a zero state (the inference worker wrote the old one's)
                self.rnn_states[slots[ended], ts[ended]] = 0.0
        full = np.nonzero(ts == self.T)[0]
        if len(full):
            self.full_queue.put(FullTrajectories(self.index, slots[full].tolist()))
            if self.P > 1:
                # rows of one env reach the boundary together (they step together), so whole envs redraw
                redraw = lo + full[self.episode_ended[lo + full]]
                before = self.row_policy[lo + full].copy()
                self._draw_policies(redraw)
                self.episode_ended[lo + full] = False
            for k, i in enumerate(full):
                new = self._take_slot()
                self.obs[new, 0] = self.obs[slots[i], self.T]
                self.slot_policy[new] = self.row_policy[lo + i]
                if self.rnn_states is not None:
                    switched = self.P > 1 and self.row_policy[lo + i] != before[k]
                    # another policy's core state means nothing to this one: it starts from zeros
                    self.rnn_states[new, 0] = 0.0 if switched else self.rnn_states[slots[i], self.T]
                slots[i], ts[i] = new, 0
        cur[:, 0], cur[:, 1] = slots, ts

    def _request(self, split: int) -> None:
        """Ask the inference worker of every policy that drives a row of ``split`` for its actions."""
        lo, hi = split * self.eps, (split + 1) * self.eps
        policies = np.unique(self.row_policy[lo:hi]) if self.P > 1 else (0,)
        self.waiting[split] = len(policies)
        for p in policies:
            self.conns[p].send_bytes(bytes([split]))

    def _report_stats(self, now: float) -> None:
        if self.done_returns and now - self.last_stats > STATS_PERIOD_S:
            self.stats_queue.put(EpisodeStats(self.index, self.done_returns, self.done_lengths, self.done_policies))
            self.done_returns, self.done_lengths, self.done_policies = [], [], []
            self.last_stats = now

    def run(self) -> None:
        """Sample until the stop event is set or the parent process is gone."""
        try:
            self._reset_all()
            for split in range(self.cfg.worker_num_splits):
                self._request(split)
            last_reply = time.monotonic()
            while True:
                t0 = time.monotonic()
                ready = wait(self.conns, timeout=0.5)
                self.wait_seconds.add_wait(time.monotonic() - t0)
                if not ready:
                    self._check_stop()
                    if time.monotonic() - last_reply > ACTION_TIMEOUT_S:
                        raise TimeoutError(f"no actions from the inference worker for {ACTION_TIMEOUT_S:.0f} s")
                    continue
                for conn in ready:
                    while conn.poll():
                        for split in conn.recv_bytes():
                            self.waiting[split] -= 1
                            if self.waiting[split] == 0:  # every policy of the split has answered
                                self._step_split(split)
                                self._request(split)
                now = last_reply = time.monotonic()
                self._report_stats(now)
                if self.stop_event.is_set():
                    return
        except _Stop:
            return
        finally:
            for envs in self.splits:
                envs.close()


def rollout_worker_main(cores: list[int] | None, *args: Any) -> None:
    """Process entry point: pin this process to ``cores`` (None: leave it floating), then run a
    :class:`RolloutWorker` with ``args``."""
    pinned = pin_this_process(cores)
    if pinned is not None:
        log.info("rollout worker %d uses CPU cores %s", args[2], pinned)
    if args[0].num_workers > 1:  # the envs it starts (ViZDoom's engine processes) inherit the niceness
        log.info("rollout worker %d runs at niceness %d", args[2], raise_niceness(ROLLOUT_NICENESS))
    torch.set_num_threads(1)
    RolloutWorker(*args).run()
