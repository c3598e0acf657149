"""The main loop of a device group: collect trajectories, agree, train, publish, summarise, checkpoint, stop.

It runs in the device group's main process, beside the learners. Each pass: advance the sampler (and check on
its components), receive the announced trajectories, take each policy's next batch
(:class:`~msf.learning.batcher.Batcher`), agree with the other replicas on what happens next
(:func:`~msf.distributed.agreement.agree`), and act on the decision: summaries
(:class:`~msf.runner.reporter.Reporter`), checkpoints (:class:`~msf.runner.checkpoints.Checkpoints`), stop,
train, PBT (:class:`~msf.runner.pbt_round.PbtRounds`), the replica check. Every wait has a timeout, and every
pass checks on the sampler's components, so that a dead component ends the run within a second or so.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

from msf.cfg.config import Config, Derived
from msf.distributed.agreement import Decision, Proposal, agree
from msf.distributed.collectives import Collectives, learner_state_tensors
from msf.distributed.rendezvous import RankProgress
from msf.distributed.topology import RankInfo
from msf.learning.batcher import Batch, Batcher
from msf.learning.learner import Learner
from msf.persistence.summaries import TensorBoardSummaries
from msf.persistence.train_state import TrainState
from msf.runner.checkpoints import Checkpoints
from msf.runner.episode_tally import EpisodeTally
from msf.runner.pbt_round import PbtRounds
from msf.runner.reporter import IterationCounts, Reporter
from msf.runner.run_health import RunHealth
from msf.runtime.affinity import LearnerThreadRetune
from msf.runtime.reaping import ChildDied
from msf.sampling.messages import EpisodeStats
from msf.sampling.protocol import ComponentFailed, Sampler
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")


class PeerFailed(RuntimeError):
    """Another replica reported a failure in the per-iteration agreement."""


class AgreementTimedOut(RuntimeError):
    """This replica waited ``--dist_timeout`` in an agreement that another replica never came to (the message
    names it and what it did last)."""


def check_replicas(learners: list[Learner], world: Collectives) -> None:
    """Collective: compare every learner's parameters, buffers and optimiser state with rank 0's, in policy
    order (the same on every replica).

    Raises:
        ReplicaMismatch: naming the first tensor that differs and the ranks.
    """
    for learner in learners:
        world.check_identical(learner_state_tensors(learner.model, learner.optimizer))


class TrainingLoop:
    """Drives one device group's learners until the budget is spent, a stop is requested, or a failure.

    Every iteration the replicas agree, in one all-reduce, on what happens next: stop (a
    signal, the budget, a failure anywhere), write summaries or a checkpoint (rank 0's clock),
    and the global counts. So every replica leaves after the same iteration, performs the
    same SGD steps, and none is left waiting in a collective. With one replica the
    all-reduce is a no-op and the code path is the same.

    Args:
        cfg, derived: the run's config. learners, weights: per policy, its learner and published weights.
        buffer: the device group's trajectory buffer. sampler: where its trajectories come from. exp_dir: the experiment
            folder. state: the run's counters (restored or fresh). tb: rank 0's TensorBoard writer.
        rank: this device group's rank. world: the collectives over all ranks. heartbeat: this rank's
            :class:`~msf.distributed.rendezvous.Heartbeat` (None: one rank), which publishes the loop's progress
            and explains a timed-out agreement.
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        learners: list[Learner],
        buffer: TrajectoryBuffer,
        weights: list[PublishedWeights],
        sampler: Sampler,
        exp_dir: str,
        state: TrainState,
        tb: TensorBoardSummaries | None,
        rank: RankInfo,
        world: Collectives,
        heartbeat: Any = None,
    ):
        self.cfg, self.derived, self.learners, self.weights = cfg, derived, learners, weights
        self.heartbeat = heartbeat
        self.progress = heartbeat.progress if heartbeat is not None else RankProgress()
        self.sampler, self.state, self.rank, self.world = sampler, state, rank, world
        self.start_time = time.monotonic()
        self.batcher = Batcher(
            buffer,
            sampler.full_queue,
            sampler.free_queues,
            len(learners),
            derived.trajectories_per_iteration,
            cfg.max_policy_lag,
            hold_slots=not cfg.async_rl,
            in_env_order=cfg.deterministic,
        )
        counters = (sampler.rollout_wait, sampler.inference_stats)  # the workers'
        self.reporter = Reporter(cfg, derived, rank, state, learners, *counters, tb, world, self.start_time)
        books = (self.batcher.taken_by_worker, self.batcher.dropped_by_worker, cfg.rollout)
        self.reporter.sampler_nodes = lambda: sampler.sources(*books)
        self.reporter.sampler_note = lambda: sampler.status_note(*books)
        auto_threads = cfg.learner_threads == 0 and cfg.async_rl
        n_workers, n_inference, groups = len(sampler.rollout_wait), len(sampler.inference_stats), rank.nproc_per_node
        self.retune_threads = LearnerThreadRetune(auto_threads, self.start_time, n_workers, n_inference, groups)
        # --deterministic: episodes read from the batches in env order, not from the workers' timed reports
        self.tallies = [EpisodeTally() for _ in learners] if cfg.deterministic else None
        self.checkpoints = Checkpoints(cfg, exp_dir, state, learners, rank, self.start_time)
        self.health = RunHealth(cfg, derived, [learner.train_step for learner in learners])
        self.taken: list[tuple[int, int]] = []  # per policy, the last pass's (trajectories, of them dropped)
        self.pbt = PbtRounds(cfg, state, learners, weights, world, rank.is_main, self.frames)
        self.stop_reason: str | None = None
        # the run failed through an agreement (a worker's failure, on this replica or another), before this pass
        # trained: the learners' state is a whole iteration's, and a checkpoint of it loses nothing (_run_loop)
        self.learners_intact = False
        # SIGUSR1s counted (request_checkpoint) and those a checkpoint has served: a count, not a flag that is
        # reset, so that a signal between the read and the reset is not lost
        self.checkpoint_requests = self.checkpoint_requests_taken = 0
        self.env_step_calls_seen = 0  # the workers' env.step calls counted into an agreement so far
        self.iteration = 0
        self.since_agreement = IterationCounts()
        self.last_summary = self.last_save = self.start_time

    @property
    def frames(self) -> int:
        """Global env steps in the unit of the budget and the curves (frames with summaries_use_frameskip)."""
        return self.state.env_steps * self.derived.frameskip

    def request_checkpoint(self) -> None:
        """Write a checkpoint at the next agreement (on any replica: rank 0 writes it), as when
        ``--save_every_sec`` has passed; the run goes on. (A signal handler's: it only counts the request.)"""
        self.checkpoint_requests += 1

    def untrained(self) -> bool:
        """No policy made an SGD step in this run."""
        return self.health.untrained([learner.train_step for learner in self.learners])

    def request_stop(self, reason: str) -> None:
        """Stop after the current iteration (the first reason given is kept): ``"stopped"`` or ``"done"``."""
        if self.stop_reason is None:
            self.stop_reason = reason

    # --- collecting -------------------------------------------------------------------------
    def _drain_stats(self) -> None:
        while True:
            try:
                s: EpisodeStats = self.sampler.stats_queue.get_nowait()
            except queue.Empty:
                return
            if self.tallies is not None:
                continue  # the same episodes come from the batches (_take_batches), in an order timing cannot change
            for ret, length, p in zip(s.returns, s.lengths, s.policies):
                self._note_episodes(p, [ret], [length])

    def _note_episodes(self, policy: int, returns: list[float], lengths: list[int]) -> None:
        self.state.policies[policy].returns.extend(returns)
        self.state.policies[policy].lengths.extend(lengths)
        self.since_agreement.episodes += len(returns)

    def _take_batches(self) -> list[Batch | None]:
        """Each policy's next batch, or None while it has fewer trajectories than an iteration needs."""
        batches, self.taken = [], []
        for p, learner in enumerate(self.learners):
            taken = self.batcher.take(p, learner.policy_version)
            self.taken.append((taken.trajectories, taken.dropped))
            # Steps are counted here, when the learner takes them: between two agreements each replica
            # takes at most one iteration's trajectories per policy, so a run ends less than one global
            # iteration past its budget.
            self.since_agreement.env_steps += taken.env_steps
            self.since_agreement.dropped_trajectories += taken.dropped
            self.since_agreement.policy_env_steps[p] += taken.env_steps
            self.since_agreement.policy_dropped[p] += taken.dropped
            if self.tallies is not None and taken.batch is not None and taken.keys is not None:
                self._note_episodes(p, *self.tallies[p].add(taken.batch, taken.keys))
            batches.append(taken.batch)
        return batches

    # --- agreeing -----------------------------------------------------------------------------
    def _agree(self, failed: bool, now: float, time_spent: bool, batches: list[Batch | None]) -> Decision:
        """One all-reduce of this replica's :class:`Proposal`; adds the global counts to the counters."""
        c, is_main = self.since_agreement, self.rank.is_main
        proposal = Proposal(
            stop=self.stop_reason is not None,
            failed=failed,
            # --deterministic: every iteration, so that the curves (and a --stop_at_return_mean stop) fall on the
            # same iterations on every run; the status line keeps its interval (_pass)
            summary_due=is_main and (self.cfg.deterministic or self._interval_passed(now)),
            save_due=(is_main and now - self.last_save >= self.cfg.save_every_sec)
            or self.checkpoint_requests > self.checkpoint_requests_taken,
            # with no batch, the replica enters the agreement for this
            time_spent=time_spent,
            env_steps=c.env_steps,
            episodes=c.episodes,
            dropped_trajectories=c.dropped_trajectories,
            env_step_calls=self._new_env_step_calls(),
            has_batch=tuple(b is not None for b in batches),
            policy_env_steps=tuple(c.policy_env_steps[p] for p in range(len(batches))),
            policy_dropped=tuple(c.policy_dropped[p] for p in range(len(batches))),
        )
        self.since_agreement = IterationCounts()
        self.progress.entered += 1
        t0 = time.monotonic()
        try:
            d = agree(proposal, self.world)
        except Exception as e:
            # gloo names the rank that waited, not the one that never came: ask the others' progress records
            waited = time.monotonic() - t0 >= 0.9 * self.cfg.dist_timeout
            absent = self.heartbeat.absent_from_agreement() if waited and self.heartbeat is not None else None
            if absent:
                raise AgreementTimedOut(absent) from e
            raise
        self.progress.agreed += 1
        self.state.env_steps += d.env_steps
        self.state.episodes += d.episodes
        self.state.dropped_trajectories += d.dropped_trajectories
        self.state.env_step_calls += d.env_step_calls
        for ps, steps, dropped in zip(self.state.policies, d.policy_env_steps, d.policy_dropped):
            ps.env_steps += steps
            ps.dropped_steps += dropped * self.cfg.rollout
        self.reporter.agreed(c)
        return d

    def _new_env_step_calls(self) -> int:
        """The envs' steps this replica's rollout workers made since the last call (split steps x envs per split)."""
        calls = sum(c.steps for c in self.sampler.rollout_wait) * self.derived.envs_per_split
        new, self.env_step_calls_seen = calls - self.env_step_calls_seen, calls
        return new

    # --- acting -------------------------------------------------------------------------------
    def _train(self, p: int, batch: Batch, real: bool) -> None:
        learner, lag = self.learners[p], None
        if real:
            lags = (learner.policy_version - batch["policy_versions"]).float()
            lag = (float(lags.min()), float(lags.mean()), float(lags.max()))
        self.reporter.trained(p, lag, learner.train(batch, on_sgd_step=self.weights[p].publish))

    def _train_agreed(self, d: Decision, batches: list[Batch | None]) -> None:
        """Every replica trains the same policies in the same order: those any replica has a batch for; a
        replica without one brings an all-masked batch to that policy's collectives."""
        for p, learner in enumerate(self.learners):
            if d.has_batch[p] > 0:
                learner.set_progress(self.frames / self.cfg.train_for_env_steps)
                batch = batches[p]
                self._train(p, batch if batch is not None else self.batcher.empty_batch(), batch is not None)
                # every replica with a batch trained on it (the others' were all masked)
                self.state.policies[p].trained_steps += (
                    d.has_batch[p] * self.derived.trajectories_per_iteration * self.cfg.rollout
                )
                if batch is not None:  # --async_rl=False: the workers wait for these slots and act with the new weights
                    self.batcher.release(p)

    def _interval_passed(self, now: float) -> bool:
        return now - self.last_summary >= self.cfg.experiment_summaries_interval

    def _target_reached(self) -> bool:
        """``--stop_at_return_mean`` reached by some policy at the last summary (the same on every replica)."""
        return self.reporter.reached_target(self.cfg.stop_at_return_mean)

    def _summaries(self, log_status: bool = True) -> None:
        """Collective: the reporter's summaries (``log_status``: and rank 0's status line), the learner's threads
        retuned once (``--learner_threads=0``); then rank 0 writes each policy's best checkpoint if beaten."""
        self.reporter.summaries(log_status)
        self.retune_threads(time.monotonic(), self.reporter.wait_shares)
        if self.rank.is_main:
            for p in range(len(self.learners)):
                self.checkpoints.save_best(p, self.reporter.return_mean(p), self.frames)

    # --- the loop ------------------------------------------------------------------------------
    def _pass(self) -> bool:
        """One pass: collect, and when there is something to agree on, agree and act. True: the loop ends."""
        pass_start = time.monotonic()
        failure: Exception | None = None
        try:
            self.sampler.advance()
        except (ComponentFailed, ChildDied) as e:
            failure = e
        self.batcher.receive(timeout=self.sampler.receive_timeout_s)
        if self.batcher.received != self.progress.trajectories:
            self.progress.trajectories, self.progress.last_trajectory = self.batcher.received, time.time()
        batches = self._take_batches()
        self._drain_stats()
        self.reporter.show_progress()
        self.reporter.startup_progress()
        now = time.monotonic()
        started = self.reporter.startup.envs_started_after_s is not None
        self.health.observe(now, started, self.taken, [learner.train_step for learner in self.learners])
        time_spent = now - self.start_time >= self.cfg.train_for_seconds
        idle = all(b is None for b in batches)
        self.reporter.stalled_workers(learner_waiting=idle)
        if idle and failure is None and self.stop_reason is None and not time_spent:
            self.since_agreement.learner_wait += time.monotonic() - pass_start
            return False  # nothing to agree on yet: a replica enters the agreement with a batch, or to stop
        d = self._agree(failure is not None, now, time_spent, batches)
        if d.failed:
            # a child of some replica failed; every learner is between two iterations, the same on every replica
            self.learners_intact = True
            raise failure or PeerFailed("another replica failed (see its log lines)")
        if d.summary_due:
            log_status = self._interval_passed(now)
            if log_status:
                self.last_summary = now
            self._summaries(log_status)
        if d.save_due:
            # every request counted by now is served by this checkpoint, also one whose handler ran only as the
            # agreement returned (a signal sent to every rank at once makes one checkpoint, not two)
            self.checkpoint_requests_taken = self.checkpoint_requests
            self.last_save = now
            self.checkpoints.save()
        if d.stop:
            self.request_stop("stopped")
            return True
        # The batches just agreed on are counted in the budget, so they are trained on before the budget ends the
        # run (a run of less than one iteration still trains once and writes a checkpoint).
        self._train_agreed(d, batches)
        self.iteration += 1
        self.progress.iteration = self.iteration
        if self.frames >= self.cfg.train_for_env_steps or d.time_spent or self._target_reached():
            self.request_stop("done")
            return True
        if self.pbt.due(self.frames):
            self.pbt.run(self.frames)
        if self.cfg.ddp_check_interval and self.iteration % self.cfg.ddp_check_interval == 0:
            check_replicas(self.learners, self.world)
        return False

    def run(self) -> str:
        """Loop until done; return the status: "done" or "stopped".

        Raises:
            ComponentFailed, ChildDied: a component of this replica's sampler failed. PeerFailed: another did.
        """
        self.last_summary = self.last_save = time.monotonic()
        while not self._pass():
            pass
        self.reporter.close()
        if self.reporter.summary_frames != self.frames:  # the stop's agreement may have made one at this step
            self._summaries()
        assert self.stop_reason is not None, "_pass ends the loop through request_stop"
        return self.stop_reason
