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
from msf.distributed.collectives import Collectives, learner_state_tensors, tensor_checksums
from msf.distributed.topology import RankInfo
from msf.learning.learner import Learner
from msf.learning.pbt import pbt_decision
from msf.persistence.checkpoint import BackgroundCheckpointWriter
from msf.persistence.summaries import Progress, RecentRate, TensorBoardSummaries
from msf.runtime.affinity import auto_learner_threads, usable_cores
from msf.runtime.supervision import ChildDied, ComponentFailure, check_children, describe_exit, killed_children
from msf.sampling.messages import EpisodeStats, FullTrajectories, InferenceCounters, RolloutCounters, SlotsReturned
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")


class ComponentFailed(RuntimeError):
    """A child process reported an exception (the message holds its traceback)."""


class PeerFailed(RuntimeError):
    """Another replica reported a failure in the per-iteration agreement."""


# the per-iteration agreement vector, summed over replicas
_STOP, _FAILED, _SUMMARY, _SAVE, _TIME, _STEPS, _EPISODES, _DROPPED = range(8)
_HAVE = 8  # then one entry per policy: the replicas that hold a batch for it


@dataclass
class Channels:
    """The queues and processes the loop talks to (built by :func:`msf.runner.device_group.run_device_group`)."""

    full_queue: Any
    free_queues: list[Any]
    stats_queue: Any
    failures: Any
    procs: list[Any]
    inference_stats: list[InferenceCounters]  # per inference worker
    rollout_wait: list[RolloutCounters]  # per rollout worker


@dataclass
class PolicyCounters:
    """One policy's statistics: this replica's last episodes driven by it, its last batch's policy lag
    (min, mean, max) and the metric of its best checkpoint so far."""

    returns: collections.deque = field(default_factory=collections.deque)
    lengths: collections.deque = field(default_factory=collections.deque)
    lag: tuple[float, float, float] = (0.0, 0.0, 0.0)
    best_metric: float | None = None


@dataclass
class Counters:
    """Progress of the run, summed over all replicas and policies: ``env_steps`` counts the agent steps of
    all trajectories the learners took out of their buffers (trained on, or dropped as too old);
    ``policies`` holds each policy's own statistics."""

    env_steps: int = 0
    episodes: int = 0
    dropped_trajectories: int = 0
    policies: list[PolicyCounters] = field(default_factory=lambda: [PolicyCounters()])
    pbt_round: int = 0
    pbt_replacements: list = field(default_factory=list)  # every PBT replacement of the run, resumes included


@dataclass
class _Policy:
    """The training loop's state for one policy on this replica."""

    learner: Learner
    weights: PublishedWeights
    writer: BackgroundCheckpointWriter
    stats: PolicyCounters
    pending: collections.deque = field(default_factory=collections.deque)  # (worker, slot)
    ready: list = field(default_factory=list)  # copied-out trajectories not yet trained on
    ready_count: int = 0
    last_train_stats: dict = field(default_factory=dict)
    last_best: float = 0.0
    empty_batches: int = 0  # iterations this replica joined the policy's collectives with no experience


class TrainingLoop:
    """Drives one device group's learner until the budget is spent, a stop is requested, or a failure.

    Every iteration the replicas agree, in one all-reduce, on what happens next: stop (a
    signal, the budget, a failure anywhere), write summaries or a checkpoint (rank 0's clock),
    and the global counts. So every replica leaves after the same iteration, performs the
    same SGD steps, and none is left waiting in a collective. With one replica the
    all-reduce is a no-op and the code path is the same.
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        learners: list[Learner],
        buffer: TrajectoryBuffer,
        weights: list[PublishedWeights],
        ch: Channels,
        exp_dir: str,
        counters: Counters,
        tb: TensorBoardSummaries | None,
        rank: RankInfo,
        world: Collectives,
    ):
        self.cfg, self.derived, self.buffer, self.world = cfg, derived, buffer, world
        self.ch, self.exp_dir, self.c, self.tb, self.rank = ch, exp_dir, counters, tb, rank
        self.start_time = time.monotonic()
        self.policies = []
        for p, (learner, w, pc) in enumerate(zip(learners, weights, counters.policies)):
            pc.returns = collections.deque(pc.returns, maxlen=cfg.stats_avg)
            pc.lengths = collections.deque(pc.lengths, maxlen=cfg.stats_avg)
            self.policies.append(
                _Policy(
                    learner,
                    w,
                    BackgroundCheckpointWriter(exp_dir, cfg.keep_checkpoints, cfg.save_best_metric, policy=p),
                    pc,
                    last_best=self.start_time,
                )
            )
        self.learner = learners[0]  # policy 0: the run's top-level figures are its
        self.slot_policy = buffer.slot_policy.numpy()
        self.stop_reason: str | None = None
        self.iteration = 0
        self.start_steps = counters.env_steps
        self.local_steps = 0  # this replica's, for its own FPS
        self.delta = np.zeros(3)  # steps, episodes, dropped since the last agreement
        self.recent_steps = RecentRate(self.start_time, counters.env_steps)
        self.threads_tuned = cfg.learner_threads > 0  # a given number is kept
        self.summary_frames: int | None = None  # the frame count of the last summary
        self.local_waits = [0.0, 0.0, 0.0]
        self.global_stats: dict[str, Any] = {}
        self.progress = Progress(cfg.train_for_env_steps, cfg.with_progress_bar and rank.is_main, initial=self.frames)
        self.last_milestone = self.start_time
        self.learner_wait = 0.0  # seconds the loop spent without a batch to train on
        self.wait_mark = (self.start_time, *self._wait_totals())
        self._empty: dict[str, torch.Tensor] | None = None
        self.pbt_replacements = counters.pbt_replacements
        self.next_pbt = (self.frames // cfg.pbt_period_env_steps + 1) * cfg.pbt_period_env_steps

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
        report that arrives within a second names the root cause, unless a child was killed by a
        signal (a crash in native code cannot report): that child is named first."""
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
        report = f"{f.component} (pid {f.pid}) failed:\n{f.traceback}"
        killed, deadline = [], time.monotonic() + 0.5  # a crashed child's pipes close just before it can be reaped
        while not killed and time.monotonic() < deadline:
            killed = [p for p in killed_children(self.ch.procs) if p.pid != f.pid]
            if not killed:
                time.sleep(0.05)
        if killed:
            first = "; ".join(f"{p.name} (pid {p.pid}) {describe_exit(p)}" for p in killed)
            report = f"{first}; then {report}"
        raise ComponentFailed(report)

    def _drain_stats(self) -> None:
        while True:
            try:
                s: EpisodeStats = self.ch.stats_queue.get_nowait()
            except queue.Empty:
                return
            for ret, length, p in zip(s.returns, s.lengths, s.policies):
                self.c.policies[p].returns.append(ret)
                self.c.policies[p].lengths.append(length)
            self.delta[1] += len(s.returns)

    def _receive(self, timeout: float) -> None:
        """Move announced trajectories to their policy's ``pending`` (waiting at most ``timeout`` for the first)."""
        try:
            msg: FullTrajectories = self.ch.full_queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            for s in msg.slots:
                self.policies[int(self.slot_policy[s])].pending.append((msg.worker, s))
            try:
                msg = self.ch.full_queue.get_nowait()
            except queue.Empty:
                return

    def _copy_out(self, pol: _Policy) -> None:
        """Copy the trajectories the policy's next batch needs out of the buffer, return their slots, drop
        the too-old ones. The rest stay in the buffer, holding their slots: that is the back-pressure
        that keeps rollout workers from running ahead of the learner."""
        need = self.derived.trajectories_per_iteration - pol.ready_count
        if not pol.pending or need <= 0:
            return
        items = [pol.pending.popleft() for _ in range(min(need, len(pol.pending)))]
        # Steps are counted here, when the learner takes them: between two agreements each replica
        # takes at most one iteration's trajectories per policy, so a run ends less than one global
        # iteration past its budget.
        self.delta[0] += len(items) * self.cfg.rollout
        self.local_steps += len(items) * self.cfg.rollout
        slots = torch.tensor([s for _, s in items], dtype=torch.int64)
        batch = self.buffer.gather(slots)
        by_worker: dict[int, list[int]] = collections.defaultdict(list)
        for w, s in items:
            by_worker[w].append(s)
        for w, ss in by_worker.items():
            self.ch.free_queues[w].put(SlotsReturned(ss))
        lag = pol.learner.policy_version - batch["policy_versions"].min(1).values
        keep = lag <= self.cfg.max_policy_lag
        if not bool(keep.all()):
            self.delta[2] += int((~keep).sum())
            batch = {k: v[keep] for k, v in batch.items()}
        if batch["rewards"].shape[0]:
            pol.ready.append(batch)
            pol.ready_count += batch["rewards"].shape[0]

    def _next_batch(self, pol: _Policy) -> dict[str, torch.Tensor] | None:
        n = self.derived.trajectories_per_iteration
        if pol.ready_count < n:
            return None
        allb = {k: torch.cat([b[k] for b in pol.ready]) for k in pol.ready[0]}
        batch = {k: v[:n] for k, v in allb.items()}
        rest = {k: v[n:] for k, v in allb.items()}
        pol.ready = [rest] if rest["rewards"].shape[0] else []
        pol.ready_count -= n
        return batch

    def _empty_batch(self) -> dict[str, torch.Tensor]:
        """A batch of the right shapes whose samples are all masked out (``valids`` 0): what a replica with
        no experience for a policy brings to that policy's collectives, so that it neither hangs the others
        nor takes another SGD step than they do."""
        if self._empty is None:
            n = self.derived.trajectories_per_iteration
            self._empty = self.buffer.gather(torch.zeros(n, dtype=torch.int64))
            self._empty["valids"] = torch.zeros_like(self._empty["rewards"], dtype=torch.uint8)
        return {k: v.clone() for k, v in self._empty.items()}

    # --- agreeing -----------------------------------------------------------------------------
    def _agree(
        self, failed: bool, now: float, last_summary: float, last_save: float, batches: list[dict | None]
    ) -> np.ndarray:
        """One all-reduce: flags and counts summed over replicas, and per policy how many replicas hold a
        batch for it; updates the global counters."""
        v = torch.zeros(_HAVE + len(self.policies), dtype=torch.float64)
        v[_STOP] = self.stop_reason is not None
        v[_FAILED] = failed
        if self.rank.is_main:
            v[_SUMMARY] = now - last_summary >= self.cfg.experiment_summaries_interval
            v[_SAVE] = now - last_save >= self.cfg.save_every_sec
        v[_TIME] = now - self.start_time >= self.cfg.train_for_seconds  # with no batch, the replica enters for this
        v[_STEPS:_HAVE] = torch.from_numpy(self.delta)
        v[_HAVE:] = torch.tensor([b is not None for b in batches], dtype=torch.float64)
        self.delta[:] = 0
        g = self.world.all_reduce_sum_(v).numpy()
        self.c.env_steps += int(g[_STEPS])
        self.recent_steps.note(time.monotonic(), self.c.env_steps)
        self.c.episodes += int(g[_EPISODES])
        self.c.dropped_trajectories += int(g[_DROPPED])
        return g

    # --- training -----------------------------------------------------------------------------
    def _train(self, pol: _Policy, batch: dict[str, torch.Tensor], real: bool) -> None:
        if real:
            lag = (pol.learner.policy_version - batch["policy_versions"]).float()
            pol.stats.lag = (float(lag.min()), float(lag.mean()), float(lag.max()))
        weights = pol.weights
        pol.last_train_stats = pol.learner.train(
            batch, on_sgd_step=lambda model, version: weights.publish(model, version)
        )

    def _pbt(self) -> None:
        """Collective, at the same iteration on every replica (the global frame count crossed a PBT period):
        rank 0 decides from every replica's episode statistics (:func:`msf.learning.pbt.pbt_decision`) and
        broadcasts the decision; every replica then copies the donors' weights into the recipients and sets
        their new hyperparameters, so each policy's replicas stay bit-identical."""
        cfg, P = self.cfg, len(self.policies)
        while self.next_pbt <= self.frames:
            self.next_pbt += cfg.pbt_period_env_steps
        if self.frames < cfg.pbt_start_mutation:
            return
        self._gather_stats()
        self.c.pbt_round += 1
        names = list(self.policies[0].learner.hyperparameters())
        table = torch.full((P, 1 + len(names)), -1.0, dtype=torch.float64)  # donor (-1: kept), hyperparameters
        if self.rank.is_main:
            objectives = [ps["return_mean"] for ps in self.global_stats["policies"]]
            rng = np.random.default_rng([cfg.seed or 0, self.c.pbt_round, 17])
            for r in pbt_decision(
                objectives,
                [pol.learner.hyperparameters() for pol in self.policies],
                rng,
                cfg.pbt_replace_fraction,
                cfg.pbt_replace_reward_gap,
                cfg.pbt_replace_reward_gap_absolute,
                cfg.pbt_mutation_rate,
                cfg.pbt_perturb_min,
                cfg.pbt_perturb_max,
            ):
                table[r.recipient, 0] = r.donor
                table[r.recipient, 1:] = torch.tensor([r.hyperparameters[k] for k in names], dtype=torch.float64)
        self.world.broadcast_(table, src=0)
        objectives = [ps["return_mean"] for ps in self.global_stats["policies"]]
        for recipient in range(P):
            donor = int(table[recipient, 0])
            if donor < 0:
                continue
            pol, src = self.policies[recipient], self.policies[donor]
            pol.learner.copy_from(src.learner)
            hyper = dict(zip(names, table[recipient, 1:].tolist()))
            pol.learner.set_hyperparameters(hyper)
            pol.weights.publish(pol.learner.model, pol.learner.policy_version)
            checksum, donor_sum = (
                int(tensor_checksums(list(x.learner.model.state_dict().values())).sum()) for x in (pol, src)
            )
            record = {
                "frames": self.frames,
                "round": self.c.pbt_round,
                "recipient": recipient,
                "donor": donor,
                "recipient_objective": objectives[recipient],
                "donor_objective": objectives[donor],
                "hyperparameters": hyper,
            }
            self.pbt_replacements.append(record)
            log.info(
                "PBT round %d at frame %d: policy %d (objective %.3f) takes policy %d's weights (objective "
                "%.3f), weights checksum %d (the donor's %d); hyperparameters %s",
                self.c.pbt_round,
                self.frames,
                recipient,
                objectives[recipient],
                donor,
                objectives[donor],
                checksum,
                donor_sum,
                " ".join(f"{k}={v:.6g}" for k, v in hyper.items()),
            )

    def _check_replicas(self) -> None:
        for pol in self.policies:  # the same order on every replica
            self.world.check_identical(learner_state_tensors(pol.learner.model, pol.learner.optimizer))

    # --- reporting ----------------------------------------------------------------------------
    def fps(self) -> tuple[float, float]:
        """(global frames per second over the last ~10 s, since the start of this run)."""
        now = time.monotonic()
        fs = self.derived.frameskip
        recent = self.recent_steps.rate(now, self.c.env_steps) * fs
        total = (self.c.env_steps - self.start_steps) * fs / max(now - self.start_time, 1e-9)
        return recent, total

    def local_fps(self) -> float:
        return self.local_steps * self.derived.frameskip / max(time.monotonic() - self.start_time, 1e-9)

    def return_mean(self) -> float | None:
        """Mean return of the last ``stats_avg`` episodes of every replica (as of the last summary)."""
        return self.global_stats.get("return_mean")

    def _wait_totals(self) -> tuple[float, float, float]:
        """Seconds spent waiting so far, summed over this group's rollout workers, inference workers, learner."""
        return (
            sum(c.wait_seconds for c in self.ch.rollout_wait),
            sum(c.wait_seconds for c in self.ch.inference_stats),
            self.learner_wait,
        )

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
        """Collective: every policy's episode statistics, FPS, policy lag and waiting shares of every replica,
        for rank 0's summaries."""
        n, P = self.cfg.stats_avg, len(self.policies)
        ep = torch.full((P, 2, n), float("nan"), dtype=torch.float64)
        for p, pol in enumerate(self.policies):
            ep[p, 0, : len(pol.stats.returns)] = torch.tensor(list(pol.stats.returns), dtype=torch.float64)
            ep[p, 1, : len(pol.stats.lengths)] = torch.tensor(list(pol.stats.lengths), dtype=torch.float64)
        lags = [x for pol in self.policies for x in pol.stats.lag]
        empty = [pol.empty_batches for pol in self.policies]
        self.local_waits = self._wait_shares()
        per_rank = torch.tensor([self.local_fps(), *self.local_waits, *lags, *empty], dtype=torch.float64)
        g_ep, g_rank = self.world.all_gather(ep), self.world.all_gather(per_rank)
        policies = []
        for p in range(P):
            returns, lengths = g_ep[:, p, 0].flatten(), g_ep[:, p, 1].flatten()
            returns, lengths = returns[~returns.isnan()], lengths[~lengths.isnan()]
            lag = g_rank[:, 4 + 3 * p : 7 + 3 * p]  # [ranks, (min, mean, max)]
            policies.append(
                {
                    "return_mean": float(returns.mean()) if returns.numel() else None,
                    "length_mean": float(lengths.mean()) if lengths.numel() else None,
                    "lag_per_rank": lag.tolist(),
                    "lag_mean": float(lag[:, 1].mean()),
                    "lag_max": float(lag[:, 2].max()),
                    "empty_batches": int(g_rank[:, 4 + 3 * P + p].sum()),
                }
            )
        self.global_stats = {
            **{k: policies[0][k] for k in ("return_mean", "length_mean", "lag_per_rank", "lag_mean", "lag_max")},
            "policies": policies,
            "fps_per_rank": g_rank[:, 0].tolist(),
            "wait_shares": g_rank[:, 1:4].mean(0).tolist(),  # rollout, inference, learner; mean over ranks
        }

    def _tune_learner_threads(self) -> None:
        """``--learner_threads=0``: once, at the first summary 30 s after the start, set this replica's
        torch threads from the measured waiting shares of its workers (:func:`auto_learner_threads`)."""
        if self.threads_tuned or time.monotonic() - self.start_time < 30.0:
            return
        self.threads_tuned = True
        rollout_wait, inference_wait, learner_wait = self.local_waits
        n_r, n_i = len(self.ch.rollout_wait), len(self.ch.inference_stats)
        cores = len(usable_cores()) / self.rank.nproc_per_node
        before = torch.get_num_threads()
        after = auto_learner_threads(cores, n_r, rollout_wait, n_i, inference_wait, learner_wait, before)
        if after != before:
            torch.set_num_threads(after)
        log.info(
            "learner: %d torch thread(s) from now on, was %d (the workers kept %.2f of %.2f cores busy, the "
            "learner waited %.0f%% of the time; --learner_threads=N fixes the number)",
            after,
            before,
            n_r * (1 - rollout_wait) + n_i * (1 - inference_wait),
            cores,
            100 * learner_wait,
        )

    def _summaries(self) -> None:
        """Collective (every rank at the same agreement): gather the statistics; rank 0 writes TensorBoard's
        points at the current frame count and the status line."""
        self.summary_frames = self.frames
        self._gather_stats()
        self._tune_learner_threads()
        if not self.rank.is_main:
            return
        gs = self.global_stats
        recent, total = self.fps()
        inf = [c.samples / max(c.batches, 1.0) for c in self.ch.inference_stats]
        waits = dict(zip(("rollout", "inference", "learner"), gs["wait_shares"]))
        scalars = {
            "perf/fps": recent,
            "perf/fps_since_start": total,
            "perf/dropped_trajectories": self.c.dropped_trajectories,
            **{f"perf/wait_share_{k}": v for k, v in waits.items()},
            "perf/inference_batch_size": float(np.mean(inf)) if inf else None,
        }
        for p, (pol, ps) in enumerate(zip(self.policies, gs["policies"])):
            pre = "" if p == 0 else f"p{p}/"  # policy 0's curves keep the names of a one-policy run
            scalars.update(
                {
                    f"{pre}policy_lag/mean": ps["lag_mean"],
                    f"{pre}policy_lag/max": ps["lag_max"],
                    f"{pre}train/policy_version": pol.learner.policy_version,
                    f"{pre}episode/return_mean": ps["return_mean"],
                    f"{pre}episode/length_mean": ps["length_mean"],
                }
            )
            scalars.update({f"{pre}train/{k}": v for k, v in pol.last_train_stats.items()})
            if self.cfg.with_pbt:
                scalars.update({f"{pre}pbt/{k}": v for k, v in pol.learner.hyperparameters().items()})
        for r, (fps, (lo, mean, hi)) in enumerate(zip(gs["fps_per_rank"], gs["lag_per_rank"])):
            if self.rank.distributed:
                scalars.update(
                    {
                        f"perf/fps_rank{r}": fps,
                        f"policy_lag/rank{r}_min": lo,
                        f"policy_lag/rank{r}_mean": mean,
                        f"policy_lag/rank{r}_max": hi,
                    }
                )
        self.tb.add(scalars, self.frames)
        rm = gs["return_mean"]
        per_rank = (
            (" | fps per rank " + " ".join(f"{f:.0f}" for f in gs["fps_per_rank"])) if self.rank.distributed else ""
        )
        per_policy = ""
        if len(self.policies) > 1:
            per_policy = " | return_mean per policy " + " ".join(
                "n/a" if ps["return_mean"] is None else f"{ps['return_mean']:.2f}" for ps in gs["policies"]
            )
        log.info(
            "frames %d | fps %.0f (10 s) %.0f (run) | return_mean %s | policy_lag mean %.1f max %.0f | "
            "waiting: rollout %.0f%% inference %.0f%% learner %.0f%% | train_step %d | dropped %d%s%s",
            self.frames,
            recent,
            total,
            "n/a" if rm is None else f"{rm:.2f}",
            gs["lag_mean"],
            gs["lag_max"],
            *(100 * v for v in waits.values()),
            self.learner.train_step,
            self.c.dropped_trajectories,
            per_rank,
            per_policy,
        )
        for p in range(len(self.policies)):
            self._maybe_save_best(p)

    def _maybe_save_best(self, p: int) -> None:
        """Rank 0: write policy ``p``'s best checkpoint when its mean return (of every replica's last episodes)
        beats its best so far, after ``save_best_after`` frames and at most every ``save_best_every_sec``."""
        pol = self.policies[p]
        rm, now = self.global_stats["policies"][p]["return_mean"], time.monotonic()
        if rm is None or self.frames < self.cfg.save_best_after or now - pol.last_best < self.cfg.save_best_every_sec:
            return
        if pol.stats.best_metric is not None and rm <= pol.stats.best_metric:
            return
        pol.stats.best_metric, pol.last_best = rm, now
        pol.writer.submit(self.checkpoint_state(p), best=rm)

    def checkpoint_state(self, p: int = 0) -> dict:
        """Policy ``p``'s training state, saved in ``checkpoint_p{p}/`` (global: loads on any world size)."""
        pol = self.policies[p]
        return {
            **pol.learner.state_dict(),
            "env_steps": self.c.env_steps,
            "episodes": self.c.episodes,
            "policy": p,
            "policy_version": pol.learner.policy_version,
            "config": self.cfg.to_dict(),
            "world_size": self.rank.world_size,
            "msf_version": msf.__version__,
            "episode_returns": list(pol.stats.returns),
            "episode_lengths": list(pol.stats.lengths),
            "dropped_trajectories": self.c.dropped_trajectories,
            "best_metric": pol.stats.best_metric,
            "pbt_round": self.c.pbt_round,
            "pbt_replacements": list(self.c.pbt_replacements),
        }

    def save(self, wait: bool = False) -> None:
        """Rank 0 snapshots every policy's state now and writes them in the background (``wait``: and waits
        for the files); other ranks do nothing."""
        if self.rank.is_main:
            now = time.monotonic()
            milestone = 0 < self.cfg.save_milestones_sec <= now - self.last_milestone
            if milestone:
                self.last_milestone = now
            for p, pol in enumerate(self.policies):
                pol.writer.submit(self.checkpoint_state(p), milestone=milestone)
            if wait:
                for pol in self.policies:
                    pol.writer.flush()

    def close_writers(self) -> None:
        """Finish the checkpoint writes in flight (raises the first failure)."""
        errors = []
        for pol in self.policies:
            try:
                pol.writer.close()
            except Exception as e:  # noqa: BLE001 - every writer is closed; the first failure is raised
                errors.append(e)
        if errors:
            raise errors[0]

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
            for pol in self.policies:
                self._copy_out(pol)
            self._drain_stats()
            batches = [self._next_batch(pol) for pol in self.policies]
            if self.rank.is_main:
                rm = self.return_mean()
                self.progress.update(
                    self.frames,
                    {
                        "fps": f"{self.fps()[1]:.0f}",
                        "return": "n/a" if rm is None else f"{rm:.1f}",
                        "lag": f"{self.policies[0].stats.lag[1]:.1f}",
                    },
                )
            now = time.monotonic()
            time_spent = now - self.start_time >= self.cfg.train_for_seconds
            if all(b is None for b in batches) and failure is None and self.stop_reason is None and not time_spent:
                self.learner_wait += time.monotonic() - pass_start
                continue  # nothing to agree on yet: a replica enters the agreement with a batch, or to stop
            g = self._agree(failure is not None, now, last_summary, last_save, batches)
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
            # every replica trains the same policies in the same order: those any replica has a batch for;
            # a replica without one brings an all-masked batch to that policy's collectives
            for p, pol in enumerate(self.policies):
                if g[_HAVE + p] > 0:
                    pol.learner.set_progress(self.frames / self.cfg.train_for_env_steps)
                    real = batches[p] is not None
                    pol.empty_batches += not real
                    self._train(pol, batches[p] if real else self._empty_batch(), real)
            self.iteration += 1
            if self.cfg.with_pbt and self.frames >= self.next_pbt:
                self._pbt()
            if self.cfg.ddp_check_interval and self.iteration % self.cfg.ddp_check_interval == 0:
                self._check_replicas()
        self.progress.close()
        if self.summary_frames != self.frames:  # the stop's agreement may have made one at this step already
            self._summaries()
        return self.stop_reason
