"""The rollout worker: steps ``num_envs_per_worker`` environments in ``worker_num_splits`` groups.

Double-buffered sampling: the envs are split into groups; when a group has stepped, the
worker writes its observations to the trajectory buffer and asks the inference worker
for actions with one byte on a pipe, then steps whichever group has its actions back.
While the inference worker computes one group's actions, the worker steps another.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import time
from multiprocessing.connection import wait
from typing import Any, Callable

import numpy as np
import torch

from msf.envs.vector import close_all, make_split
from msf.runtime.affinity import ROLLOUT_NICENESS, pin_this_process, raise_niceness
from msf.runtime.spawning import parent_alive
from msf.sampling.messages import EpisodeStats, FullTrajectories
from msf.sampling.protocol import EnvSplit, RolloutWorkerSpec

log = logging.getLogger("msf")

# No actions for this long means the inference worker is gone or stuck.
ACTION_TIMEOUT_S = 120.0
STATS_PERIOD_S = 0.25


class Stopped(Exception):
    """The run is stopping (stop event set or parent gone) while the worker waited for a free slot:
    :meth:`RolloutWorker.run` returns on it; a step driven from outside raises it."""


class RolloutWorker:
    """State of one rollout worker (see module docstring), and its steps.

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
        cfg, derived, index, buffer = spec.cfg, spec.derived, spec.index, spec.buffer
        self.cfg, self.index, self.conns = cfg, index, list(spec.conns)
        self.counters = spec.counters
        self.full_queue, self.free_queue, self.stats_queue = spec.full_queue, spec.free_queue, spec.stats_queue
        self.stop_event, self.parent_pid = spec.stop_event, spec.parent_pid
        self.send_request = self._send_on_pipe if send_request is None else send_request
        self.T = cfg.rollout
        # rows: one per agent of each env (env e's agents are rows e * A .. e * A + A - 1)
        self.E = cfg.num_envs_per_worker * derived.num_agents
        self.eps = derived.agents_per_split
        b = buffer.numpy_views()
        self.obs, self.rewards, self.dones = b["obs"], b["rewards"], b["dones"]
        self.time_outs, self.actions, self.cursors = b["time_outs"], b["actions"], b["cursors"][index]
        self.rnn_states = b["rnn_states"] if b["rnn_states"].shape[-1] else None
        self.slot_policy, self.slot_key = b["slot_policy"], b["slot_key"]
        self.obs_dtype = self.obs.dtype
        first = index * derived.slots_per_worker
        self.free_slots = collections.deque(range(first, first + derived.slots_per_worker))
        seed = cfg.seed if cfg.seed is not None else int(np.random.SeedSequence().entropy % (2**31))
        # One EnvSplit per split: envs [lo, hi) of this worker. The indices the envs see are the job's, not the
        # device group's: every rank used to give its envs worker_index 0.. and env_index 0.., so an env that
        # picks a level or seeds itself from them did the same on every rank.
        n_env, e_split = cfg.num_envs_per_worker, derived.envs_per_split
        job_index = spec.first_worker + index
        self.first_row = job_index * self.E  # job-wide index of row 0 (the same on 1 or N device groups)
        self.trajectories = np.zeros(self.E, dtype=np.int64)  # per row, trajectories started so far
        self.splits: list[EnvSplit] = []
        try:
            for s in range(cfg.worker_num_splits):
                envs = [job_index * n_env + e for e in range(s * e_split, (s + 1) * e_split)]
                self.splits.append(make_split(cfg, job_index, envs, seed, spec.device_group, self._env_made))
        except BaseException:
            self.close()  # the envs made so far (ViZDoom's engines are processes): a stop or failure mid-start
            raise
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
        # --async_rl=False: each split writes `sync` trajectories per row (its quota), then is parked (its quota
        # at 0: it asks for no actions) until the learner has trained on them and returns their slots
        self.sync = derived.sync_rollouts
        self.quota = np.full(cfg.worker_num_splits, self.sync, dtype=np.int64)

    def _env_made(self, stage: str) -> None:
        """After each env is made (``stage`` "made") and after its first reset ("started": a ViZDoom engine
        starts then): count it (the training loop reports the start-up's progress) and stop the start-up if the
        run is stopping. Starting a worker's envs can take minutes (160 ViZDoom games on 2 cores took 5): the
        worker used to check the stop event only once all had started, so a run stopped or ended meanwhile
        waited for them, and killed the worker mid-start when its stop budget ran out, leaving its engines
        behind."""
        self.counters.add_env(stage)
        self._check_stop()

    def _take_slot(self) -> int:
        """A free slot of this worker; blocks (back-pressure from the learner) until one is returned."""
        if not self.free_slots:
            t0 = time.monotonic()
            while not self.take_returned_slots(timeout=0.5):
                self._check_stop()
            self.counters.add_wait(time.monotonic() - t0)
        return self.free_slots.popleft()

    def _give(self, slot: int, row: int) -> None:
        """``slot`` now holds ``row``'s next trajectory: its key (job-wide row, the row's trajectory count),
        by which ``--deterministic`` orders a training batch."""
        self.slot_key[slot] = ((self.first_row + row) << 32) | int(self.trajectories[row])
        self.trajectories[row] += 1

    def take_returned_slots(self, timeout: float | None) -> bool:
        """Take every :class:`~msf.sampling.messages.SlotsReturned` on ``free_queue`` into the free slots,
        waiting up to ``timeout`` seconds for the first (None: not at all). True when any came."""
        got = False
        while True:
            try:
                msg = self.free_queue.get(timeout=timeout) if timeout and not got else self.free_queue.get_nowait()
            except queue.Empty:
                return got
            self.free_slots.extend(msg.slots)
            got = True

    def slots_short(self, split: int) -> int:
        """How many more free slots the next :meth:`step_split` of ``split`` needs than the worker has: the rows
        that reach ``rollout`` steps with it each need a new one (0: it can step without waiting)."""
        lo, hi = split * self.eps, (split + 1) * self.eps
        return max(0, int((self.cursors[lo:hi, 1] == self.T - 1).sum()) - len(self.free_slots))

    @property
    def all_parked(self) -> bool:
        """``--async_rl=False``: every split has written its trajectories of this iteration and waits for the
        learner (:meth:`resume`)."""
        return bool(self.sync) and not self.quota.any()

    def resume(self) -> bool:
        """``--async_rl=False``: once the learner has returned the slots of this iteration's trajectories (it
        trained on them), every parked split asks for actions again, with the weights it published since.
        True when some split was parked."""
        parked = np.nonzero(self.quota == 0)[0].tolist() if self.sync else []
        self.quota[:] = self.sync
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

    def start(self) -> None:
        """Draw every row's policy, reset every env (seeded), give every row a slot with its first
        observation at step 0 (and a zero core state), and request actions for every split.

        Raises:
            Stopped: the stop event was set while waiting for a free slot.
        """
        self._draw_policies(np.arange(self.E))
        for split, envs in enumerate(self.splits):
            for i, obs in enumerate(envs.reset()):
                e = split * self.eps + i
                slot = self._take_slot()
                self._give(slot, e)
                self.cursors[e] = (slot, 0)
                self.slot_policy[slot] = self.row_policy[e]
                self.obs[slot, 0] = obs
                if self.rnn_states is not None:
                    self.rnn_states[slot, 0] = 0.0
        for split in range(self.cfg.worker_num_splits):
            self.request(split)

    def on_reply(self, split: int) -> bool:
        """One policy's inference worker has written the actions of ``split``'s rows: once every policy of
        the split has, step it (:meth:`step_split`) and request its next actions (:meth:`request`).

        Returns:
            True when the split was stepped.

        Raises:
            Stopped: see :meth:`step_split`.
        """
        self.waiting[split] -= 1
        if self.waiting[split]:
            return False
        self.step_split(split)
        if not (self.sync and self.quota[split] == 0):  # a parked split waits for resume()
            self.request(split)
        return True

    def step_split(self, split: int) -> None:
        """Step the envs of ``split`` with the actions at their cursors, and write what they returned.

        For each row at cursor ``(slot, t)``: reward, done and time-out at ``[slot, t]``, the next observation
        at ``obs[slot, t + 1]`` (a zero core state there after an episode end); the cursor moves to ``t + 1``.
        A row that reached ``t = T`` (rollout) is announced on ``full_queue`` (one message per step for all
        such rows), redraws its policy if its env's episode ended during the trajectory (several policies),
        and moves to ``(new slot, 0)``, where it starts with the bootstrap row ``obs[slot, T]`` and the core
        state ``rnn_states[slot, T]`` (zeros if the row's policy changed). Finished episodes are kept for
        :meth:`report_stats`. With ``--async_rl=False``, a split whose rows have written their
        ``sync_rollouts`` trajectories of this iteration is parked (its ``quota`` is 0): :meth:`on_reply` asks for
        no actions for it until :meth:`resume`.

        Raises:
            Stopped: the stop event was set while waiting for a free slot.
        """
        lo, hi = split * self.eps, (split + 1) * self.eps
        cur = self.cursors[lo:hi]
        slots, ts = cur[:, 0].copy(), cur[:, 1].copy()
        actions = self.actions[slots, ts]
        if self.action_bounds is not None:
            actions = np.clip(actions, *self.action_bounds)
        next_obs, rew, term, trunc = self.splits[split].step(actions)
        self.counters.add_step()
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
                self._give(new, lo + i)
                self.obs[new, 0] = self.obs[slots[i], self.T]
                self.slot_policy[new] = self.row_policy[lo + i]
                if self.rnn_states is not None:
                    switched = self.P > 1 and self.row_policy[lo + i] != before[k]
                    # another policy's core state means nothing to this one: it starts from zeros
                    self.rnn_states[new, 0] = 0.0 if switched else self.rnn_states[slots[i], self.T]
                slots[i], ts[i] = new, 0
            if self.sync:  # the split's rows started together, so they reach the boundary together
                self.quota[split] -= 1
        cur[:, 0], cur[:, 1] = slots, ts

    def request(self, split: int) -> None:
        """Ask the inference worker of every policy that drives a row of ``split`` for its actions
        (``send_request``); :meth:`on_reply` steps the split once all of them have answered."""
        lo, hi = split * self.eps, (split + 1) * self.eps
        policies = np.unique(self.row_policy[lo:hi]).tolist() if self.P > 1 else (0,)
        self.waiting[split] = len(policies)
        for p in policies:
            self.send_request(p, split)

    def _send_on_pipe(self, policy: int, split: int) -> None:
        self.conns[policy].send_bytes(bytes([split]))

    def report_stats(self, now: float, period_s: float = STATS_PERIOD_S) -> None:
        """Put the episodes finished since the last report on ``stats_queue`` as one :class:`EpisodeStats`,
        if any finished and the last report is more than ``period_s`` seconds older than ``now``
        (``time.monotonic()`` seconds)."""
        if self.done_returns and now - self.last_stats > period_s:
            self.stats_queue.put(EpisodeStats(self.index, self.done_returns, self.done_lengths, self.done_policies))
            self.done_returns, self.done_lengths, self.done_policies = [], [], []
            self.last_stats = now

    def run(self) -> None:
        """Sample until the stop event is set or the parent process is gone."""
        try:
            self.start()
            last_reply = time.monotonic()
            while True:
                if self.all_parked:  # --async_rl=False: the learner trains on what the splits wrote
                    t0 = time.monotonic()
                    while not self.take_returned_slots(timeout=0.5):
                        self._check_stop()
                    self.counters.add_wait(time.monotonic() - t0)
                    self.resume()
                    last_reply = time.monotonic()
                    continue
                t0 = time.monotonic()
                ready = wait(self.conns, timeout=0.5)
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
        """Close every env, even when one of them fails to (the first failure is raised after)."""
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
