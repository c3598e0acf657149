"""The main loop of a device group: collect trajectories, train, publish, summarise, checkpoint, stop.

It runs in the device group's main process, beside the learner. Every wait in it has a
timeout, and every pass checks the children and the failure queue, so that a dead
component ends the run within a second or so.
"""

from __future__ import annotations

import collections
import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import msf
from msf.cfg.config import Config, Derived
from msf.distributed.collectives import all_gather_tensor, all_reduce_sum_, check_replicas_identical, learner_state_tensors
from msf.distributed.topology import RankInfo
from msf.learning.learner import Learner
from msf.learning.published_weights import PublishedWeights
from msf.persistence.checkpoint import BackgroundCheckpointWriter
from msf.persistence.summaries import Progress, TensorBoardSummaries
from msf.runner.supervision import ChildDied, check_children
from msf.sampling.messages import ComponentFailure, EpisodeStats, FullTrajectories
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")


class ComponentFailed(RuntimeError):
    """A child process reported an exception (the message holds its traceback)."""


class PeerFailed(RuntimeError):
    """Another replica reported a failure in the per-iteration agreement."""


# the per-iteration agreement vector, summed over replicas
_STOP, _FAILED, _SUMMARY, _SAVE, _TIME, _STEPS, _EPISODES, _DROPPED = range(8)


@dataclass
class Channels:
    """The queues and processes the loop talks to (built by :func:`msf.runner.device_group.run_device_group`)."""

    full_queue: Any
    free_queues: list[Any]
    stats_queue: Any
    failures: Any
    procs: list[Any]
    inference_stats: list[torch.Tensor]  # per inference worker: (batches, samples, seconds waiting)
    rollout_wait: list[torch.Tensor]  # per rollout worker: seconds waiting for actions or a free slot


@dataclass
class Counters:
    """Progress of the run, summed over all replicas: ``env_steps`` counts the agent steps of all
    trajectories the learners took out of their buffers (trained on, or dropped as too old). ``returns``/``lengths``/``lag`` are this replica's own."""

    env_steps: int = 0
    episodes: int = 0
    dropped_trajectories: int = 0
    returns: collections.deque = field(default_factory=collections.deque)
    lengths: collections.deque = field(default_factory=collections.deque)
    lag: tuple[float, float, float] = (0.0, 0.0, 0.0)
    best_metric: float | None = None  # of the best checkpoint so far


class TrainingLoop:
    """Drives one device group's learner until the budget is spent, a stop is requested, or a failure.

    Every iteration the replicas agree, in one all-reduce, on what happens next: stop (a
    signal, the budget, a failure anywhere), write summaries or a checkpoint (rank 0's clock),
    and the global counts. So every replica leaves after the same iteration, performs the
    same SGD steps, and none is left waiting in a collective. With one replica the
    all-reduce is a no-op and the code path is the same.
    """

    def __init__(self, cfg: Config, derived: Derived, learner: Learner, buffer: TrajectoryBuffer,
                 weights: PublishedWeights, ch: Channels, exp_dir: str, counters: Counters,
                 tb: TensorBoardSummaries | None, rank: RankInfo):
        self.cfg, self.derived, self.learner, self.buffer = cfg, derived, learner, buffer
        self.weights, self.ch, self.exp_dir, self.c, self.tb, self.rank = weights, ch, exp_dir, counters, tb, rank
        self.c.returns = collections.deque(self.c.returns, maxlen=cfg.stats_avg)
        self.c.lengths = collections.deque(self.c.lengths, maxlen=cfg.stats_avg)
        self.pending: collections.deque[tuple[int, int]] = collections.deque()  # (worker, slot)
        self.ready: list[dict[str, torch.Tensor]] = []  # copied-out trajectories not yet trained on
        self.ready_count = 0
        self.stop_reason: str | None = None
        self.iteration = 0
        self.start_time = time.monotonic()
        self.start_steps = counters.env_steps
        self.local_steps = 0  # this replica's, for its own FPS
        self.delta = np.zeros(3)  # steps, episodes, dropped since the last agreement
        self.fps_window: collections.deque[tuple[float, int]] = collections.deque([(self.start_time, counters.env_steps)])
        self.last_train_stats: dict[str, float] = {}
        self.global_stats: dict[str, Any] = {}
        self.progress = Progress(cfg.train_for_env_steps, cfg.with_progress_bar and rank.is_main, initial=self.frames)
        self.writer = BackgroundCheckpointWriter(exp_dir, cfg.keep_checkpoints, cfg.save_best_metric)
        self.last_milestone = self.last_best = self.start_time
        self.learner_wait = 0.0  # seconds the loop spent without a batch to train on
        self.wait_mark = (self.start_time, *self._wait_totals())

    @property
    def frames(self) -> int:
        """Global env steps in the unit of the budget and the curves (frames with summaries_use_frameskip)."""
        return self.c.env_steps * self.derived.frameskip

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    # --- collecting -------------------------------------------------------------------------
    def _poll_children(self) -> None:
        """Raise if a child reported a failure or died. A failure brings others down with it (a
        rollout worker's death closes its pipe, which ends its inference worker): the first
        report that arrives within a second names the root cause."""
        try:
            dead = None
            f: ComponentFailure = self.ch.failures.get_nowait()
        except queue.Empty:
            try:
                check_children(self.ch.procs)
                return
            except ChildDied as e:
                dead = e
            try:
                f = self.ch.failures.get(timeout=1.0)
            except queue.Empty:
                raise dead from None
        raise ComponentFailed(f"{f.component} (pid {f.pid}) failed:\n{f.traceback}")

    def _drain_stats(self) -> None:
        while True:
            try:
                s: EpisodeStats = self.ch.stats_queue.get_nowait()
            except queue.Empty:
                return
            self.c.returns.extend(s.returns)
            self.c.lengths.extend(s.lengths)
            self.delta[1] += len(s.returns)

    def _receive(self, timeout: float) -> None:
        """Move announced trajectories to ``pending`` (waiting at most ``timeout`` for the first)."""
        try:
            msg: FullTrajectories = self.ch.full_queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self.pending.extend((msg.worker, s) for s in msg.slots)
            try:
                msg = self.ch.full_queue.get_nowait()
            except queue.Empty:
                return

    def _copy_out(self) -> None:
        """Copy the trajectories the next batch needs out of the buffer, return their slots, drop
        the too-old ones. The rest stay in the buffer, holding their slots: that is the back-pressure
        that keeps rollout workers from running ahead of the learner."""
        need = self.derived.trajectories_per_iteration - self.ready_count
        if not self.pending or need <= 0:
            return
        items = [self.pending.popleft() for _ in range(min(need, len(self.pending)))]
        # Steps are counted here, when the learner takes them: between two agreements each replica
        # takes at most one iteration's trajectories, so a run ends less than one global iteration
        # past its budget.
        self.delta[0] += len(items) * self.cfg.rollout
        self.local_steps += len(items) * self.cfg.rollout
        slots = torch.tensor([s for _, s in items], dtype=torch.int64)
        batch = self.buffer.gather(slots)
        by_worker: dict[int, list[int]] = collections.defaultdict(list)
        for w, s in items:
            by_worker[w].append(s)
        for w, ss in by_worker.items():
            self.ch.free_queues[w].put(ss)
        lag = self.learner.policy_version - batch["policy_versions"].min(1).values
        keep = lag <= self.cfg.max_policy_lag
        if not bool(keep.all()):
            self.delta[2] += int((~keep).sum())
            batch = {k: v[keep] for k, v in batch.items()}
        if batch["rewards"].shape[0]:
            self.ready.append(batch)
            self.ready_count += batch["rewards"].shape[0]

    def _next_batch(self) -> dict[str, torch.Tensor] | None:
        n = self.derived.trajectories_per_iteration
        if self.ready_count < n:
            return None
        allb = {k: torch.cat([b[k] for b in self.ready]) for k in self.ready[0]}
        batch = {k: v[:n] for k, v in allb.items()}
        rest = {k: v[n:] for k, v in allb.items()}
        self.ready = [rest] if rest["rewards"].shape[0] else []
        self.ready_count -= n
        return batch

    # --- agreeing -----------------------------------------------------------------------------
    def _agree(self, failed: bool, now: float, last_summary: float, last_save: float) -> np.ndarray:
        """One all-reduce: flags and counts summed over replicas; updates the global counters."""
        v = torch.zeros(8, dtype=torch.float64)
        v[_STOP] = self.stop_reason is not None
        v[_FAILED] = failed
        if self.rank.is_main:
            v[_SUMMARY] = now - last_summary >= self.cfg.experiment_summaries_interval
            v[_SAVE] = now - last_save >= self.cfg.save_every_sec
        v[_TIME] = now - self.start_time >= self.cfg.train_for_seconds  # with no batch, the replica enters for this
        v[_STEPS:] = torch.from_numpy(self.delta)
        self.delta[:] = 0
        g = all_reduce_sum_(v).numpy()
        self.c.env_steps += int(g[_STEPS])
        self.c.episodes += int(g[_EPISODES])
        self.c.dropped_trajectories += int(g[_DROPPED])
        return g

    # --- training -----------------------------------------------------------------------------
    def _train(self, batch: dict[str, torch.Tensor]) -> None:
        lag = (self.learner.policy_version - batch["policy_versions"]).float()
        self.c.lag = (float(lag.min()), float(lag.mean()), float(lag.max()))
        self.last_train_stats = self.learner.train(
            batch, on_sgd_step=lambda model, version: self.weights.publish(model, version))
        self.iteration += 1
        if self.cfg.ddp_check_interval and self.iteration % self.cfg.ddp_check_interval == 0:
            check_replicas_identical(learner_state_tensors(self.learner.model, self.learner.optimizer))

    # --- reporting ----------------------------------------------------------------------------
    def fps(self) -> tuple[float, float]:
        """(global frames per second over the last ~10 s, since the start of this run)."""
        now = time.monotonic()
        self.fps_window.append((now, self.c.env_steps))
        while len(self.fps_window) > 2 and now - self.fps_window[1][0] > 10.0:
            self.fps_window.popleft()
        t0, s0 = self.fps_window[0]
        fs = self.derived.frameskip
        recent = (self.c.env_steps - s0) * fs / max(now - t0, 1e-9)
        total = (self.c.env_steps - self.start_steps) * fs / max(now - self.start_time, 1e-9)
        return recent, total

    def local_fps(self) -> float:
        return self.local_steps * self.derived.frameskip / max(time.monotonic() - self.start_time, 1e-9)

    def return_mean(self) -> float | None:
        """Mean return of the last ``stats_avg`` episodes of every replica (as of the last summary)."""
        return self.global_stats.get("return_mean")

    def _wait_totals(self) -> tuple[float, float, float]:
        """Seconds spent waiting so far, summed over this group's rollout workers, inference workers, learner."""
        return (sum(float(t[0]) for t in self.ch.rollout_wait), sum(float(t[2]) for t in self.ch.inference_stats),
                self.learner_wait)

    def _wait_shares(self) -> list[float]:
        """Share of the time since the last call that each stage (rollout, inference, learner) spent
        waiting, averaged over its processes: rollout workers wait for actions or a free slot, inference
        workers for observations, the learner for trajectories."""
        now, totals = time.monotonic(), self._wait_totals()
        t0, *before = self.wait_mark
        self.wait_mark = (now, *totals)
        dt = max(now - t0, 1e-9)
        counts = (max(len(self.ch.rollout_wait), 1), max(len(self.ch.inference_stats), 1), 1)
        return [min(1.0, (a - b) / (dt * n)) for a, b, n in zip(totals, before, counts)]

    def _gather_stats(self) -> None:
        """Collective: episode statistics, FPS and policy lag of every replica, for rank 0's summaries."""
        n = self.cfg.stats_avg
        ep = torch.full((2, n), float("nan"), dtype=torch.float64)
        ep[0, :len(self.c.returns)] = torch.tensor(list(self.c.returns), dtype=torch.float64)
        ep[1, :len(self.c.lengths)] = torch.tensor(list(self.c.lengths), dtype=torch.float64)
        per_rank = torch.tensor([self.local_fps(), *self.c.lag, *self._wait_shares()], dtype=torch.float64)
        g_ep, g_rank = all_gather_tensor(ep), all_gather_tensor(per_rank)
        returns, lengths = g_ep[:, 0].flatten(), g_ep[:, 1].flatten()
        returns, lengths = returns[~returns.isnan()], lengths[~lengths.isnan()]
        self.global_stats = {
            "return_mean": float(returns.mean()) if returns.numel() else None,
            "length_mean": float(lengths.mean()) if lengths.numel() else None,
            "fps_per_rank": g_rank[:, 0].tolist(),
            "lag_per_rank": g_rank[:, 1:4].tolist(),
            "lag_mean": float(g_rank[:, 2].mean()), "lag_max": float(g_rank[:, 3].max()),
            "wait_shares": g_rank[:, 4:7].mean(0).tolist(),  # rollout, inference, learner; mean over ranks
        }

    def _summaries(self) -> None:
        self._gather_stats()
        if not self.rank.is_main:
            return
        gs = self.global_stats
        recent, total = self.fps()
        inf = [float(s[1]) / max(float(s[0]), 1.0) for s in self.ch.inference_stats]
        waits = dict(zip(("rollout", "inference", "learner"), gs["wait_shares"]))
        scalars = {"perf/fps": recent, "perf/fps_since_start": total,
                   "perf/dropped_trajectories": self.c.dropped_trajectories,
                   **{f"perf/wait_share_{k}": v for k, v in waits.items()},
                   "perf/inference_batch_size": float(np.mean(inf)) if inf else None,
                   "policy_lag/mean": gs["lag_mean"], "policy_lag/max": gs["lag_max"],
                   "train/policy_version": self.learner.policy_version,
                   "episode/return_mean": gs["return_mean"], "episode/length_mean": gs["length_mean"]}
        for r, (fps, (lo, mean, hi)) in enumerate(zip(gs["fps_per_rank"], gs["lag_per_rank"])):
            if self.rank.distributed:
                scalars.update({f"perf/fps_rank{r}": fps, f"policy_lag/rank{r}_min": lo,
                                f"policy_lag/rank{r}_mean": mean, f"policy_lag/rank{r}_max": hi})
        scalars.update({f"train/{k}": v for k, v in self.last_train_stats.items()})
        self.tb.add(scalars, self.frames)
        rm = gs["return_mean"]
        per_rank = (" | fps per rank " + " ".join(f"{f:.0f}" for f in gs["fps_per_rank"])) if self.rank.distributed else ""
        log.info("frames %d | fps %.0f (10 s) %.0f (run) | return_mean %s | policy_lag mean %.1f max %.0f | "
                 "waiting: rollout %.0f%% inference %.0f%% learner %.0f%% | train_step %d | dropped %d%s",
                 self.frames, recent, total, "n/a" if rm is None else f"{rm:.1f}", gs["lag_mean"], gs["lag_max"],
                 *(100 * v for v in waits.values()), self.learner.train_step, self.c.dropped_trajectories, per_rank)
        self._maybe_save_best()

    def _maybe_save_best(self) -> None:
        """Rank 0: write the best checkpoint when the mean return (of every replica's last episodes) beats
        the best so far, after ``save_best_after`` frames and at most every ``save_best_every_sec``."""
        rm, now = self.global_stats.get("return_mean"), time.monotonic()
        if rm is None or self.frames < self.cfg.save_best_after or now - self.last_best < self.cfg.save_best_every_sec:
            return
        if self.c.best_metric is not None and rm <= self.c.best_metric:
            return
        self.c.best_metric, self.last_best = rm, now
        self.writer.submit(self.checkpoint_state(), best=rm)

    def checkpoint_state(self) -> dict:
        """The training state saved in a checkpoint (global: loads on any world size)."""
        return {**self.learner.state_dict(), "env_steps": self.c.env_steps, "episodes": self.c.episodes,
                "policy_version": self.learner.policy_version, "config": self.cfg.to_dict(),
                "world_size": self.rank.world_size, "msf_version": msf.__version__,
                "episode_returns": list(self.c.returns), "episode_lengths": list(self.c.lengths),
                "dropped_trajectories": self.c.dropped_trajectories, "best_metric": self.c.best_metric}

    def save(self, wait: bool = False) -> None:
        """Rank 0 snapshots the state now and writes it in the background (``wait``: and waits for
        the file); other ranks do nothing."""
        if self.rank.is_main:
            now = time.monotonic()
            milestone = 0 < self.cfg.save_milestones_sec <= now - self.last_milestone
            if milestone:
                self.last_milestone = now
            self.writer.submit(self.checkpoint_state(), milestone=milestone)
            if wait:
                self.writer.flush()

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> str:
        """Loop until done; return the status: "done" or "stopped" (raises on a failure)."""
        last_summary = last_save = time.monotonic()
        while True:
            pass_start = time.monotonic()
            failure: Exception | None = None
            try:
                self._poll_children()
            except (ComponentFailed, ChildDied) as e:
                failure = e
            self._receive(timeout=0.05)
            self._copy_out()
            self._drain_stats()
            batch = self._next_batch()
            if self.rank.is_main:
                rm = self.return_mean()
                self.progress.update(self.frames, {"fps": f"{self.fps()[1]:.0f}",
                                                   "return": "n/a" if rm is None else f"{rm:.1f}",
                                                   "lag": f"{self.c.lag[1]:.1f}"})
            now = time.monotonic()
            time_spent = now - self.start_time >= self.cfg.train_for_seconds
            if batch is None and failure is None and self.stop_reason is None and not time_spent:
                self.learner_wait += time.monotonic() - pass_start
                continue  # nothing to agree on yet: a replica enters the agreement with a batch, or to stop
            g = self._agree(failure is not None, now, last_summary, last_save)
            if g[_FAILED]:
                raise failure or PeerFailed("another replica failed (see its log lines)")
            if g[_SUMMARY]:
                last_summary = now
                self._summaries()
            if g[_SAVE]:
                last_save = now
                self.save()
            if g[_STOP]:
                self.request_stop("stopped")
                break
            if self.frames >= self.cfg.train_for_env_steps or g[_TIME]:
                self.request_stop("done")
                break
            self.learner.set_progress(self.frames / self.cfg.train_for_env_steps)
            self._train(batch)
        self.progress.close()
        self._summaries()
        return self.stop_reason
