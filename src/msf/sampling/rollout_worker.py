"""The rollout worker: steps ``num_envs_per_worker`` environments in ``worker_num_splits`` groups.

Double-buffered sampling: the envs are split into groups; when a group has stepped, the
worker writes its observations to the trajectory buffer and asks the inference worker
for actions with one byte on a pipe, then steps whichever group has its actions back.
While the inference worker computes one group's actions, the worker steps another.
"""

from __future__ import annotations

import logging
import os
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, cast

import numpy as np
import torch

from msf.envs.vector import close_all, make_split
from msf.runtime.affinity import ROLLOUT_NICENESS, pin_this_process, raise_niceness
from msf.runtime.spawning import OneLineFailure, parent_alive
from msf.sampling.messages import EpisodeStats, FullTrajectories
from msf.sampling.protocol import EnvSplit, RolloutWorkerSpec
from msf.sampling.rollout_state import PolicyDraw, RunningEpisodes, SlotPool, SyncQuota

log = logging.getLogger("msf")

# No actions for this long means the inference worker is gone or stuck.
ACTION_TIMEOUT_S = 120.0
STATS_PERIOD_S = 0.25


class Stopped(Exception):
    """The run is stopping (stop event set or parent gone) while the worker waited for a free slot:
    :meth:`RolloutWorker.run` returns on it; a step driven from outside raises it."""


class RolloutWorker:
    """One rollout worker (see the module docstring): it moves data between its envs and the trajectory buffer;
    its values (:mod:`msf.sampling.rollout_state`) say where and when: ``slots``, ``episodes``, ``policies``, ``quota``.

    Driven by :meth:`run` in its own process (pipes to the inference workers), or step by step from
    outside, in one process: :meth:`start`, then :meth:`on_reply` for each answer an inference worker
    gave (see ``tests/unit/test_serial_core.py``). In one process, return slots (``free_queue``) before
    a step that needs them: a step that finds no free slot waits on ``free_queue`` until ``stop_event``.

    Args:
        spec: what the worker is given (see :class:`~msf.sampling.protocol.RolloutWorkerSpec`).
        make_split: builds the env split of ``(cfg, job-wide worker index, job-wide env indices, seed,
            device_group, on_env)`` (see :class:`~msf.sampling.protocol.EnvSplit` and
            :class:`~msf.envs.vector.GymSplit`); tests inject fakes here.
        send_request: ``(policy, split)``: ask that policy's inference worker for the split's actions.
            None: one byte on ``spec.conns[policy]``.
    """

    def __init__(
        self,
        spec: RolloutWorkerSpec,
        make_split: Callable[..., EnvSplit] = make_split,
        send_request: Callable[[int, int], None] | None = None,
    ):
        cfg, derived, index = spec.cfg, spec.derived, spec.index
        self.index, self.conns, self.counters = index, list(spec.conns), spec.counters
        self.full_queue, self.stats_queue = spec.full_queue, spec.stats_queue
        self.stop_event, self.parent_pid = spec.stop_event, spec.parent_pid
        self.send_request = self._send_on_pipe if send_request is None else send_request
        self.T, self.E, self.eps = cfg.rollout, cfg.num_envs_per_worker * derived.num_agents, derived.agents_per_split
        b = spec.buffer.numpy_views()
        self.obs, self.rewards, self.dones = b["obs"], b["rewards"], b["dones"]
        self.time_outs, self.actions, self.cursors = b["time_outs"], b["actions"], b["cursors"][index]
        self.rnn_states = b["rnn_states"] if b["rnn_states"].shape[-1] else None
        self.slot_policy, self.obs_dtype = b["slot_policy"], self.obs.dtype
        self.float_obs = self.obs_dtype != np.uint8  # uint8 observations (images) cannot be non-finite
        seed = cfg.seed if cfg.seed is not None else int(cast(int, np.random.SeedSequence().entropy) % (2**31))
        # The indices the envs see are the job's, not the device group's, so that an env that picks a level or
        # seeds itself from them differs from rank to rank.
        job_index, n_env, e_split = spec.first_worker + index, cfg.num_envs_per_worker, derived.envs_per_split
        first = index * derived.slots_per_worker
        self.env_name, self.job_index, self.first_env, self.A = (
            cfg.env,
            job_index,
            job_index * n_env,
            derived.num_agents,
        )
        self.slots = SlotPool(
            range(first, first + derived.slots_per_worker), b["slot_key"], spec.free_queue, job_index * self.E, self.E
        )
        self.episodes = RunningEpisodes(self.E, time.monotonic())
        rng = np.random.default_rng([seed, index, 7])
        self.policies = PolicyDraw(cfg.num_policies, derived.num_agents, self.E, cfg.pbt_mix_policies_in_one_env, rng)
        self.quota = SyncQuota(derived.sync_rollouts, self.E, cfg.worker_num_splits)
        self.waiting = np.zeros(cfg.worker_num_splits, dtype=np.int64)  # replies still due per split
        self.splits: list[EnvSplit] = []  # one per split: envs [lo, hi) of this worker
        try:
            for s in range(cfg.worker_num_splits):
                envs = [job_index * n_env + e for e in range(s * e_split, (s + 1) * e_split)]
                self.splits.append(make_split(cfg, job_index, envs, seed, spec.device_group, self._env_made))
        except BaseException:
            self.close()  # the envs made so far (ViZDoom's engines are processes): a stop or failure mid-start
            raise
        space = self.splits[0].action_space
        self.action_bounds = (space.low, space.high) if hasattr(space, "low") else None

    def _env_made(self, stage: str) -> None:
        """After each env is made (``stage`` "made") and after its first reset ("started": a ViZDoom engine
        starts then): count it (the training loop reports the start-up's progress) and stop the start-up if the
        run is stopping, so that a run stopped during a long start-up does not wait for every env."""
        self.counters.add_env(stage)
        self._check_stop()

    def _take_slot(self, row: int) -> int:
        """A free slot for ``row``'s next trajectory, once there is one (:meth:`_wait_for_slots`)."""
        if not self.slots.free:
            self._wait_for_slots()
        return self.slots.take(row)

    def _wait_for_slots(self) -> None:
        """Block until the learner returns slots (back-pressure), counted as waiting. Raises :class:`Stopped`."""
        t0 = time.monotonic()
        while not self.slots.take_returned(timeout=0.5):
            self._check_stop()
        self.counters.add_wait(time.monotonic() - t0)

    def slots_short(self, split: int) -> int:
        """How many more free slots the next :meth:`step_split` of ``split`` needs than the worker has: the rows
        that reach ``rollout`` steps with it each need a new one (0: it can step without waiting)."""
        lo, hi = split * self.eps, (split + 1) * self.eps
        return max(0, int((self.cursors[lo:hi, 1] == self.T - 1).sum()) - len(self.slots.free))

    def resume(self) -> bool:
        """``--async_rl=False``: once the learner has returned the slots of this iteration's trajectories (it
        trained on them), every parked split asks for actions again, with the weights it published since.
        True when some split was parked."""
        parked = self.quota.resume()
        for split in parked:
            self.request(split)
        return bool(parked)

    def wait_or_stop(self, seconds: float) -> bool:
        """Wait ``seconds`` (before the first step); False, at once, when the run stops meanwhile."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.stop_event.wait(min(0.5, left)) or not parent_alive(self.parent_pid):
                return False
        return True

    def _check_stop(self) -> None:
        if self.stop_event.is_set() or not parent_alive(self.parent_pid):
            raise Stopped

    def start(self) -> None:
        """Draw every row's policy, reset every env (seeded), give every row a slot with its first
        observation at step 0 (and a zero core state), and request actions for every split.

        Raises:
            Stopped: the stop event was set while waiting for a free slot.
        """
        self.policies.draw(np.arange(self.E))
        for split, envs in enumerate(self.splits):
            firsts = np.asarray(envs.reset(), dtype=self.obs_dtype)
            self._check_finite(split * self.eps, firsts)
            for i, obs in enumerate(firsts):
                e = split * self.eps + i
                slot = self._take_slot(e)
                self.cursors[e] = (slot, 0)
                self.slot_policy[slot] = self.policies.row[e]
                self.obs[slot, 0] = obs
                if self.rnn_states is not None:
                    self.rnn_states[slot, 0] = 0.0
        for split in range(len(self.splits)):
            self.request(split)

    def on_reply(self, split: int) -> bool:
        """One policy's inference worker has written the actions of ``split``'s rows: once every policy of
        the split has, step it (:meth:`step_split`) and request its next actions (:meth:`request`), unless it
        is parked (:meth:`resume`).

        Returns:
            True when the split was stepped.

        Raises:
            Stopped: see :meth:`step_split`.
        """
        self.waiting[split] -= 1
        if self.waiting[split]:
            return False
        self.step_split(split)
        if not self.quota.parked(split):
            self.request(split)
        return True

    def step_split(self, split: int) -> None:
        """Step the envs of ``split`` with the actions at their cursors, and write what they returned.

        For each row at cursor ``(slot, t)``: reward, done and time-out at ``[slot, t]``, the next observation
        at ``obs[slot, t + 1]`` (a zero core state there after an episode end); the cursor moves to ``t + 1``. A row
        whose step was a next-step autoreset (``EnvSplit.autoreset_rows``) writes its observation at ``obs[slot, t]``
        and stays; so does a row that has written its ``--async_rl=False`` quota while others of its split still
        write (:meth:`SyncQuota.idle`: its next trajectory starts from the observation it reaches).
        Rows that reach ``t = T`` (rollout) start their next trajectories (:meth:`_next_trajectories`).
        Finished episodes are kept for :meth:`report_stats`.

        Raises:
            Stopped: the stop event was set while waiting for a free slot.
        """
        lo, hi = split * self.eps, (split + 1) * self.eps
        cur = self.cursors[lo:hi]
        slots, ts = cur[:, 0].copy(), cur[:, 1].copy()
        actions = self.actions[slots, ts]
        if self.action_bounds is not None:
            actions = np.clip(actions, *self.action_bounds)
        env_split = self.splits[split]
        next_obs, rew, term, trunc = env_split.step(actions)
        self.counters.add_step()
        obs = np.asarray(next_obs, dtype=self.obs_dtype)
        self._check_finite(lo, obs, rew)
        ended = term | trunc
        # rows of a next-step autoreset made no transition: their cursor stays, their new first observation
        # replaces the placeholder there (what they write at [slot, t] is written again at their next step)
        skip = env_split.autoreset_rows
        stepped: np.ndarray | bool = True if skip is None else ~skip
        self.episodes.add(lo, rew, ended, self.policies.row, stepped)
        idle = self.quota.idle(split)  # --async_rl=False: rows that wrote their quota start from where they are
        moved = stepped if idle is None or not idle.any() else np.logical_and(stepped, ~idle)
        self.policies.episode_ended[lo:hi] |= ended
        self.rewards[slots, ts] = rew
        self.dones[slots, ts] = ended
        self.time_outs[slots, ts] = trunc & ~term
        ts += moved
        self.obs[slots, ts] = obs
        if self.rnn_states is not None and ended.any():
            # a new episode starts with a zero state (the inference worker wrote the old one's)
            self.rnn_states[slots[ended], ts[ended]] = 0.0
        full = np.nonzero(ts == self.T)[0]
        if len(full):
            self._next_trajectories(split, slots, ts, full)
        cur[:, 0], cur[:, 1] = slots, ts

    def _check_finite(self, lo: int, obs: np.ndarray, rew: np.ndarray | None = None) -> None:
        """Raise :class:`~msf.runtime.spawning.OneLineFailure`, one line naming the env, this worker, the env
        (job-wide index) and its episode step (or its first reset: ``rew`` None) and the field, when rows ``lo ..``
        got a NaN or infinite observation or reward: the inference worker would fail on it with torch's sampling
        error. One ``np.isfinite`` per array."""
        for field, x in (("observation", obs if self.float_obs else None), ("reward", rew)):
            if x is None or np.isfinite(x).all():
                continue
            bad = ~np.isfinite(x.reshape(len(x), -1))
            i = int(np.nonzero(bad.any(axis=1))[0][0])
            row, value = lo + i, x.reshape(len(x), -1)[i][bad[i]][0]
            agent = f" (agent {row % self.A})" if self.A > 1 else ""
            when = "its first reset" if rew is None else f"episode step {self.episodes.len[row] + 1}"
            raise OneLineFailure(
                f"{self.env_name} returned a non-finite {field} ({value}) on rollout worker {self.job_index}, "
                f"env {self.first_env + row // self.A}{agent}, at {when}"
            )

    def _next_trajectories(self, split: int, slots: np.ndarray, ts: np.ndarray, full: np.ndarray) -> None:
        """The rows ``full`` of ``split`` (indices into its ``slots`` and ``ts``) reached ``t = T``: announce their
        slots on ``full_queue`` (one message), redraw their policies (:meth:`PolicyDraw.at_boundary`), spend the
        split's quota, and move each to ``(new slot, 0)``, where it starts with the bootstrap row
        ``obs[slot, T]`` and the core state ``rnn_states[slot, T]`` (zeros if the row's policy changed: another
        policy's core state means nothing to this one)."""
        old = slots[full]
        self.full_queue.put(FullTrajectories(self.index, old.tolist()))
        rows = split * self.eps + full
        switched = self.policies.at_boundary(rows)
        while len(self.slots.free) < len(full):
            self._wait_for_slots()
        new = self.slots.take_many(rows)
        self.obs[new, 0] = self.obs[old, self.T]
        self.slot_policy[new] = self.policies.row[rows]
        if self.rnn_states is not None:
            kept = self.rnn_states[old, self.T]
            self.rnn_states[new, 0] = np.where(switched.reshape(-1, *[1] * (kept.ndim - 1)), 0.0, kept)
        slots[full], ts[full] = new, 0
        self.quota.spend(rows)

    def request(self, split: int) -> None:
        """Ask the inference worker of every policy that drives a row of ``split`` for its actions
        (``send_request``); :meth:`on_reply` steps the split once all of them have answered."""
        policies = self.policies.of_rows(split * self.eps, (split + 1) * self.eps)
        self.waiting[split] = len(policies)
        for p in policies:
            self.send_request(p, split)

    def _send_on_pipe(self, policy: int, split: int) -> None:
        self.conns[policy].send_bytes(bytes([split]))

    def report_stats(self, now: float, period_s: float = STATS_PERIOD_S) -> None:
        """Put the episodes finished since the last report on ``stats_queue`` as one :class:`EpisodeStats`,
        if any finished and the last report is more than ``period_s`` seconds older than ``now``
        (``time.monotonic()`` seconds)."""
        done = self.episodes.take(now, period_s)
        if done is not None:
            self.stats_queue.put(EpisodeStats(self.index, *done))

    def run(self) -> None:
        """Sample until the stop event is set or the parent process is gone."""
        try:
            self.start()
            last_reply = time.monotonic()
            while True:
                if self.quota.all_parked:  # --async_rl=False: the learner trains on what the splits wrote
                    self._wait_for_slots()
                    self.resume()
                    last_reply = time.monotonic()
                    continue
                t0 = time.monotonic()
                ready = cast(list[Connection], wait(self.conns, timeout=0.5))  # some of self.conns
                self.counters.add_wait(time.monotonic() - t0)
                if not ready:
                    self._check_stop()
                    if time.monotonic() - last_reply > ACTION_TIMEOUT_S:
                        raise TimeoutError(f"no actions from the inference worker for {ACTION_TIMEOUT_S:.0f} s")
                    continue
                for conn in ready:
                    while conn.poll():
                        for split in conn.recv_bytes():
                            self.on_reply(split)
                now = last_reply = time.monotonic()
                self.report_stats(now)
                if self.stop_event.is_set():
                    return
        except Stopped:
            return
        finally:
            self.close()

    def close(self) -> None:
        """Close every env, even when one of them fails to (the first failure is raised after). What this worker
        still has to send is dropped at its exit rather than waited for: its reader may be gone or have stopped
        reading, and a feeder thread blocked on a full pipe would keep the process alive."""
        for q in (self.full_queue, self.stats_queue):
            getattr(q, "cancel_join_thread", lambda: None)()  # a multiprocessing queue (not in one process)
        close_all(envs.close for envs in self.splits)


def rollout_worker_main(spec: RolloutWorkerSpec) -> None:
    """Process entry point: pin this process to ``spec.cores`` (None: leave it floating), then run a
    :class:`RolloutWorker` of ``spec``."""
    pinned = pin_this_process(spec.cores)
    if pinned is not None:
        log.info("rollout worker %d uses CPU cores %s", spec.index, pinned)
    if spec.cfg.num_workers > 1:  # the envs it starts (ViZDoom's engine processes) inherit the niceness
        log.info("rollout worker %d runs at niceness %d", spec.index, raise_niceness(ROLLOUT_NICENESS))
    torch.set_num_threads(1)
    cfg = spec.cfg
    if cfg.force_envs_single_thread:  # the libraries the envs load from here on start with one thread each
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
    try:
        worker = RolloutWorker(spec)
    except Stopped:  # the run stopped while the envs were being made (they are closed)
        return
    delay = decorrelation_delay(cfg, spec.first_worker + spec.index)
    if delay > 0:
        log.info(
            "rollout worker %d waits %.1f s before its first step (--decorrelate_experience_max_seconds)",
            spec.index,
            delay,
        )
        if not worker.wait_or_stop(delay):
            worker.close()
            return
    if cfg.force_envs_single_thread:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # and those already loaded (OpenMP, BLAS) are limited too
            worker.run()
    else:
        worker.run()


def decorrelation_delay(cfg: Any, job_worker: int) -> float:
    """Seconds job-wide rollout worker ``job_worker`` waits before its first step: ``i / n x
    --decorrelate_experience_max_seconds`` of ``n`` workers in the job (Sample Factory's rule); 0 with
    ``--benchmark``."""
    if cfg.benchmark or cfg.decorrelate_experience_max_seconds <= 0:
        return 0.0
    total = cfg.num_workers * max(1, int(getattr(cfg, "nnodes", 1)))
    return job_worker / total * cfg.decorrelate_experience_max_seconds
