"""What the device group reports: rates, waiting shares, TensorBoard points, the status line, ``summary.json``.

Every rank measures its own figures; at a summary (agreed by all ranks, so a collective) they are gathered,
and rank 0 writes them. The reporter owns its windows: the "10 s" FPS (:class:`RecentRate`) and the span
over which waiting shares are measured (from one summary to the next), so nothing else that gathers
statistics (a PBT round) moves them.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

import msf
from msf.cfg.config import Config, Derived
from msf.distributed.collectives import Collectives
from msf.distributed.rank_stats import RankStats, gather_episode_means, gather_rank_stats
from msf.distributed.topology import RankInfo
from msf.envs.device_env import device_env_entry
from msf.learning.learner import Learner
from msf.persistence.summaries import Progress, RecentRate, TensorBoardSummaries
from msf.persistence.train_state import PolicyState, TrainState
from msf.sampling.messages import InferenceCounters, RolloutCounters
from msf.sampling.remote_sampler import tensorboard_scalars

log = logging.getLogger("msf")

_STAGES = ("rollout", "inference", "learner")
STARTUP_NOTE_S = 10.0  # seconds between two notes of the start-up's progress


@dataclass
class IterationCounts:
    """What this replica did since the last agreement: the training loop proposes the counts to the agreement and
    hands the whole value to :meth:`Reporter.agreed`."""

    env_steps: int = 0  # taken by this replica's learners
    episodes: int = 0
    dropped_trajectories: int = 0
    learner_wait: float = 0.0  # seconds the loop found no batch to train on
    # per policy: its env steps and dropped trajectories
    policy_env_steps: collections.Counter = field(default_factory=collections.Counter)
    policy_dropped: collections.Counter = field(default_factory=collections.Counter)


@dataclass
class PolicyReport:
    """One policy on this replica (:meth:`Reporter.trained`): the policy lag of its last batch (versions: min,
    mean, max) and the largest of the run (each sample's at its first SGD step), its last training iteration's
    statistics, and the iterations it joined the policy's collectives with no experience."""

    lag: tuple[float, float, float] = (0.0, 0.0, 0.0)
    lag_max_run: float = 0.0
    train: dict[str, float] = field(default_factory=dict)
    empty_batches: int = 0


class StartUpProgress:
    """The start-up of a device group, from spawning its rollout workers (``start_time``) until every env had started
    (made and reset once: ``envs_started_after_s``) and until the first training step (``startup_s``: the envs'
    start, their decorrelation steps and the first batch), each logged once; until the envs have started, a note
    of how far they are every 10 s (a long start-up would be silent otherwise)."""

    def __init__(self, cfg: Config, counters: Sequence[RolloutCounters], start_time: float):
        self.cfg, self.counters, self.start_time, self.noted = cfg, counters, start_time, start_time
        self.envs_started_after_s: float | None = None
        self.startup_s: float | None = None
        # envs stepped in this process: --serial_mode, or a device-side env (no worker is spawned)
        self.in_process = cfg.serial_mode or device_env_entry(cfg.env) is not None

    def trained(self, now: float) -> None:
        if self.startup_s is None:
            self.startup_s = t = now - self.start_time
            since = "the start of the run (envs in this process)" if self.in_process else "spawning the rollout workers"
            log.info("start-up took %.1f s: from %s to the first training step (startup_s in summary.json)", t, since)

    def progress(self, now: float) -> None:
        if self.envs_started_after_s is not None:
            return
        n, counters = self.cfg.num_envs_per_worker, self.counters
        total, started = n * len(counters), sum(min(c.envs_started, n) for c in counters)
        if started >= total:
            self.envs_started_after_s = t = now - self.start_time
            how = f"of {len(counters)} rollout worker(s) started, {t:.1f} s after the workers were spawned"
            log.info("all %d environments %s", total, "started, in this process" if self.in_process else how)
        elif now - self.noted >= STARTUP_NOTE_S:
            self.noted = now
            log.info(
                "starting the environments: %d of %d made, %d started; %d of %d rollout worker(s) ready "
                "(%.0f s since the workers were spawned)",
                sum(min(c.envs_made, n) for c in counters),
                total,
                started,
                sum(c.envs_started >= n for c in counters),
                len(counters),
                now - self.start_time,
            )


class StallWatch:
    """Sample Factory's heartbeat, mapped onto msf's supervision. A dead or failed worker ends the run at once
    (:func:`msf.runner.training_loop.poll_children`); a worker that is alive but stepping nothing is only seen
    here: once the learner has waited for trajectories for ``interval`` seconds without a break (after the
    start-up), the rollout workers whose split-step count did not move during that wait are stalled, reported at
    most every ``reporting_interval`` seconds.

    Args:
        interval: ``--heartbeat_interval`` (s). reporting_interval: ``--heartbeat_reporting_interval`` (s).
    """

    def __init__(self, interval: float, reporting_interval: float):
        self.interval, self.reporting_interval = interval, reporting_interval
        self.steps: list[int] | None = None  # each worker's count when the learner's wait began
        self.since = 0.0
        self.warned = -float("inf")

    def check(
        self, now: float, steps: list[int], learner_waiting: bool, started: bool
    ) -> tuple[list[int], float] | None:
        """``(stalled workers, seconds the learner has waited)`` when a report is due, else None.

        Args:
            now: the clock (s). steps: each rollout worker's split steps so far. learner_waiting: this pass found
                no batch to train on. started: every env of the device group has started.
        """
        if not learner_waiting or not started or self.steps is None:
            self.steps, self.since = (list(steps) if learner_waiting and started else None), now
            return None
        waited = now - self.since
        if waited < self.interval or now - self.warned < self.reporting_interval:
            return None
        stalled = [i for i, (a, b) in enumerate(zip(steps, self.steps)) if a == b]
        if not stalled:
            return None
        self.warned = now
        return stalled, waited


class Reporter:
    """The device group's reports (see the module docstring).

    Args:
        cfg, derived: the run's config. rank: this device group's rank. state: the run's counters.
        learners: per policy, its learner. rollout_wait, inference_stats: the shared counters of this
            group's rollout and inference workers. tb: rank 0's TensorBoard writer (None elsewhere).
        world: the collectives over all ranks. start_time: the run's start (on ``clock``). clock: seconds, monotonic.

    Attributes:
        policies: per policy, its :class:`PolicyReport` (:meth:`trained`).
        global_stats: the figures of the last summary, over all ranks (empty before the first).
        summary_frames: the frame count of the last summary (None before the first).
        target_reached_frames: the frame count of the summary whose mean return reached
            ``--stop_at_return_mean`` (None: not reached, or no target; :meth:`reached_target`).
        wait_shares: this replica's waiting shares (rollout, inference, learner) over the last summary's window.
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        rank: RankInfo,
        state: TrainState,
        learners: Sequence[Learner],
        rollout_wait: Sequence[RolloutCounters],
        inference_stats: Sequence[InferenceCounters],
        tb: TensorBoardSummaries | None,
        world: Collectives,
        start_time: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cfg, self.derived, self.rank, self.state, self.learners = cfg, derived, rank, state, learners
        self.rollout_wait, self.inference_stats, self.tb, self.world = rollout_wait, inference_stats, tb, world
        self.clock = clock
        self.policies = [PolicyReport() for _ in learners]
        self.start_time, self.start_steps = start_time, state.env_steps
        self.local_steps = 0  # this replica's, for its own FPS
        self.learner_wait = 0.0  # seconds the loop spent without a batch to train on
        self.recent_steps = RecentRate(start_time, state.env_steps)
        self.wait_mark = (start_time, *self._wait_totals())
        self.wait_shares = (0.0, 0.0, 0.0)
        self.global_stats: dict[str, Any] = {}
        self.summary_frames: int | None = None
        self.target_reached_frames: int | None = None
        self.startup = StartUpProgress(cfg, rollout_wait, start_time)
        self.stall_watch = StallWatch(cfg.heartbeat_interval, cfg.heartbeat_reporting_interval)
        self.progress = Progress(cfg.train_for_env_steps, cfg.with_progress_bar and rank.is_main, initial=self.frames)
        # the sampler's sampler nodes: summary.json's sampler_nodes, and the status line's part (the training loop
        # sets them)
        self.sampler_nodes: Callable[[], dict | None] = lambda: None
        self.sampler_note: Callable[[], str] = lambda: ""

    @property
    def frames(self) -> int:
        """Global env steps in the unit of the budget and the curves (frames with summaries_use_frameskip)."""
        return self.state.env_steps * self.derived.frameskip

    # --- measuring ------------------------------------------------------------------------------
    def agreed(self, mine: IterationCounts) -> None:
        """An agreement has added the global counts to ``state`` (a point of the "10 s" FPS); ``mine``: what
        this replica did since the one before."""
        self.local_steps += mine.env_steps
        self.learner_wait += mine.learner_wait
        self.recent_steps.note(self.clock(), self.state.env_steps)

    def trained(self, policy: int, lag: tuple[float, float, float] | None, stats: dict[str, float]) -> None:
        """``policy`` trained an iteration: ``lag`` of its batch's samples (min, mean, max; None: this replica had
        no batch and brought an all-masked one), ``stats`` the learner's statistics."""
        pr = self.policies[policy]
        if lag is None:
            pr.empty_batches += 1
        else:
            pr.lag, pr.lag_max_run = lag, max(pr.lag_max_run, lag[2])
        pr.train = stats
        self.startup.trained(self.clock())

    def reached_target(self, target: float | None) -> bool:
        """Some policy's mean return at the last summary (all-gathered: the same on every replica) reached
        ``target`` (``--stop_at_return_mean``; None: none); its frame count is kept (``target_reached_frames``)."""
        means = map(self.return_mean, range(len(self.policies)))
        if target is None or not any(m is not None and m >= target for m in means):
            return False
        self.target_reached_frames = self.summary_frames
        return True

    def fps(self) -> tuple[float, float]:
        """(global frames per second over the last ~10 s, since the start of this run)."""
        now = self.clock()
        fs = self.derived.frameskip
        recent = self.recent_steps.rate(now, self.state.env_steps) * fs
        total = (self.state.env_steps - self.start_steps) * fs / max(now - self.start_time, 1e-9)
        return recent, total

    def local_fps(self) -> float:
        """This replica's frames per second since the start of this run."""
        return self.local_steps * self.derived.frameskip / max(self.clock() - self.start_time, 1e-9)

    def return_mean(self, policy: int = 0) -> float | None:
        """Mean return of the job's last ``stats_avg`` episodes (``gather_episode_means``; as of the last summary)."""
        ps = self.global_stats.get("policies")
        return ps[policy]["return_mean"] if ps else None

    def _wait_totals(self) -> tuple[float, float, float]:
        """Seconds spent waiting so far, summed over this group's rollout workers, inference workers, learner."""
        return (
            sum(c.wait_seconds for c in self.rollout_wait),
            sum(c.wait_seconds for c in self.inference_stats),
            self.learner_wait,
        )

    def _wait_shares(self) -> tuple[float, float, float]:
        """Share of the time since the last summary that each stage (rollout, inference, learner) spent
        waiting, averaged over its processes: rollout workers wait for actions or a free slot, inference
        workers for observations, the learner for trajectories. Starts the next window."""
        now, totals = self.clock(), self._wait_totals()
        t0, *before = self.wait_mark
        self.wait_mark = (now, *totals)
        dt = max(now - t0, 1e-9)
        counts = (max(len(self.rollout_wait), 1), max(len(self.inference_stats), 1), 1)
        rollout, inference, learner = (min(1.0, (a - b) / (dt * n)) for a, b, n in zip(totals, before, counts))
        return rollout, inference, learner

    def startup_progress(self) -> None:
        """See :meth:`StartUp.progress`."""
        self.startup.progress(self.clock())

    def stalled_workers(self, learner_waiting: bool) -> str | None:
        """Sample Factory's heartbeat on msf's counters (:class:`StallWatch`): log and return the warning that
        names this device group's stalled rollout workers, if one is due."""
        stalled = self.stall_watch.check(
            self.clock(),
            [c.steps for c in self.rollout_wait],
            learner_waiting,
            self.startup.envs_started_after_s is not None,
        )
        if stalled is None:
            return None
        workers, waited = stalled
        sync = " (with --async_rl=False, workers that wrote their share wait for the others)"
        msg = (
            f"rollout worker(s) {', '.join(map(str, workers))} of this device group stepped no env in the last "
            f"{waited:.0f} s, while the learner waited for trajectories (--heartbeat_interval="
            f"{self.cfg.heartbeat_interval}): an env that hangs, or a machine too busy to run them"
            f"{'' if self.cfg.async_rl else sync}"
        )
        log.warning("%s", msg)
        return msg

    def show_progress(self) -> None:
        """Rank 0 moves the progress bar (a terminal only)."""
        if self.rank.is_main:
            rm = self.return_mean()
            self.progress.update(
                self.frames,
                {
                    "fps": f"{self.fps()[1]:.0f}",
                    "return": "n/a" if rm is None else f"{rm:.1f}",
                    "lag": f"{self.policies[0].lag[1]:.1f}",
                },
            )

    # --- summaries ------------------------------------------------------------------------------
    def _gather(self) -> None:
        """Collective: every policy's episode statistics, FPS, policy lag and waiting shares of every replica."""
        self.wait_shares = self._wait_shares()
        episodes = gather_episode_means(
            [ps.returns for ps in self.state.policies],
            [ps.lengths for ps in self.state.policies],
            self.cfg.stats_avg,
            self.world,
        )
        mine = RankStats(
            self.local_fps(),
            self.wait_shares,
            tuple(pr.lag for pr in self.policies),
            tuple(pr.empty_batches for pr in self.policies),
            tuple(pr.lag_max_run for pr in self.policies),
        )
        ranks = gather_rank_stats(mine, self.world)
        policies = []
        for p, (return_mean, length_mean) in enumerate(episodes):
            lag = torch.tensor([r.lag[p] for r in ranks], dtype=torch.float64)  # [ranks, (min, mean, max)]
            policies.append(
                {
                    "return_mean": return_mean,
                    "length_mean": length_mean,
                    "lag_per_rank": lag.tolist(),
                    "lag_mean": float(lag[:, 1].mean()),
                    "lag_max": float(lag[:, 2].max()),
                    "empty_batches": sum(r.empty_batches[p] for r in ranks),
                    "lag_max_run": max(r.lag_max_run[p] for r in ranks),
                }
            )
        self.global_stats = {
            **{
                k: policies[0][k]
                for k in ("return_mean", "length_mean", "lag_per_rank", "lag_mean", "lag_max", "lag_max_run")
            },
            "policies": policies,
            "fps_per_rank": [r.fps for r in ranks],
            # rollout, inference, learner; mean over ranks
            "wait_shares": torch.tensor([r.wait_shares for r in ranks], dtype=torch.float64).mean(0).tolist(),
        }

    def summaries(self, log_status: bool = True) -> None:
        """Collective (every rank at the same agreement): gather the statistics; rank 0 writes TensorBoard's
        points at the current frame count and (``log_status``) the status line."""
        self.summary_frames = self.frames
        self._gather()
        if not self.rank.is_main:
            return
        recent, total = self.fps()
        assert self.tb is not None  # rank 0's
        self.tb.add(self._scalars(recent, total), self.frames)
        if log_status:
            self._log_status(recent, total)

    def _scalars(self, recent: float, total: float) -> dict[str, float | None]:
        gs = self.global_stats
        inf = [c.samples / max(c.batches, 1.0) for c in self.inference_stats]
        scalars = {
            "perf/fps": recent,
            "perf/fps_since_start": total,
            "perf/dropped_trajectories": self.state.dropped_trajectories,
            **{f"perf/wait_share_{k}": v for k, v in zip(_STAGES, gs["wait_shares"])},
            "perf/inference_batch_size": float(np.mean(inf)) if inf else None,
            **tensorboard_scalars(self.sampler_nodes()),
        }
        for p, (learner, pr, ps) in enumerate(zip(self.learners, self.policies, gs["policies"])):
            pre = "" if p == 0 else f"p{p}/"  # policy 0's curves keep the names of a one-policy run
            scalars.update(
                {
                    f"{pre}policy_lag/mean": ps["lag_mean"],
                    f"{pre}policy_lag/max": ps["lag_max"],
                    f"{pre}train/policy_version": learner.policy_version,
                    f"{pre}episode/return_mean": ps["return_mean"],
                    f"{pre}episode/length_mean": ps["length_mean"],
                }
            )
            scalars.update({f"{pre}train/{k}": v for k, v in pr.train.items()})
            if self.cfg.with_pbt:
                scalars.update({f"{pre}pbt/{k}": v for k, v in learner.hyperparameters().items()})
        if self.rank.distributed:
            for r, (fps, lag) in enumerate(zip(gs["fps_per_rank"], gs["lag_per_rank"])):
                scalars[f"perf/fps_rank{r}"] = fps
                scalars.update({f"policy_lag/rank{r}_{k}": v for k, v in zip(("min", "mean", "max"), lag)})
        return scalars

    def _log_status(self, recent: float, total: float) -> None:
        gs = self.global_stats
        rm = gs["return_mean"]
        per_rank = (
            (" | fps per rank " + " ".join(f"{f:.0f}" for f in gs["fps_per_rank"])) if self.rank.distributed else ""
        )
        per_policy = ""
        if len(self.policies) > 1:
            per_policy = " | return_mean per policy " + " ".join(
                "n/a" if ps["return_mean"] is None else f"{ps['return_mean']:.2f}" for ps in gs["policies"]
            )
        # envs in this process take turns with the learner: nobody waits for anybody, so no shares
        waiting = "" if self.startup.in_process else "waiting: rollout {:.0f}% inference {:.0f}% learner {:.0f}% | "
        log.info(
            "frames %d | fps %.0f (10 s) %.0f (run) | return_mean %s | policy_lag mean %.1f max %.0f%s | "
            "%strain_step %d | dropped %d%s%s%s",
            self.frames,
            recent,
            total,
            "n/a" if rm is None else f"{rm:.2f}",
            gs["lag_mean"],
            gs["lag_max"],
            "" if self.cfg.async_rl else " (sync)",
            waiting.format(*(100 * v for v in gs["wait_shares"])),
            self.learners[0].train_step,
            self.state.dropped_trajectories,
            per_rank,
            per_policy,
            self.sampler_note(),
        )

    def close(self) -> None:
        """Close the progress bar."""
        self.progress.close()

    # --- summary.json ---------------------------------------------------------------------------
    def summary(self, status: str, wall: float) -> dict:
        """``summary.json`` (see :func:`run_summary`); ``wall``: the seconds the run took."""
        return run_summary(self, status, wall)


def books(ps: PolicyState) -> dict[str, int]:
    """A policy's books in ``summary.json``: ``env_steps`` (agent steps taken out of the buffers) = trained +
    dropped (too old) + discarded (taken, and the run ended before they were trained on)."""
    return {
        "env_steps": ps.env_steps,
        "env_steps_trained": ps.trained_steps,
        "env_steps_dropped": ps.dropped_steps,
        "env_steps_discarded": ps.discarded_steps,
    }


def run_summary(rep: Reporter, status: str, wall: float) -> dict:
    """``summary.json``: the run's figures (those of policy 0 at the top level) and ``policies``, keyed by
    policy id, each with its return, episode length, train steps, policy version and lag; ``wall``: the
    seconds the run took (its FPS is counted over them)."""
    cfg, c, gs = rep.cfg, rep.state, rep.global_stats
    run_frames = (c.env_steps - rep.start_steps) * cfg.env_frameskip
    per_policy = gs.get("policies") or [{} for _ in rep.policies]
    policies = {
        str(p): {
            "episode_return_mean": ps.get("return_mean"),
            "episode_length_mean": ps.get("length_mean"),
            "train_steps": learner.train_step,
            "policy_version": learner.policy_version,
            "policy_lag_mean": ps.get("lag_mean", pr.lag[1]),
            "policy_lag_max_run": ps.get("lag_max_run", pr.lag_max_run),
            "best_metric": c.policies[p].best_metric,
            # the configured base (a PBT-perturbed one included), and the lr the optimiser holds now, which a
            # kl_adaptive or linear_decay schedule moves away from it (the checkpoint's "lr")
            "hyperparameters": learner.hyperparameters(),
            "learning_rate_current": learner.lr,
            "empty_batches": ps.get("empty_batches", pr.empty_batches),
            **books(c.policies[p]),
        }
        for p, (learner, pr, ps) in enumerate(zip(rep.learners, rep.policies, per_policy))
    }
    lag, learner = rep.policies[0].lag, rep.learners[0]
    return {
        "status": status,
        "env": cfg.env,
        "experiment": cfg.experiment,
        "msf_version": msf.__version__,
        "env_steps": c.env_steps,
        "env_frames": c.env_steps * cfg.env_frameskip,
        "wall_seconds": wall,
        "fps": run_frames / max(wall, 1e-9),
        "train_steps": learner.train_step,
        "policy_version": learner.policy_version,
        "episodes": c.episodes,
        "episode_return_mean": gs.get("return_mean"),
        "episode_length_mean": gs.get("length_mean"),
        "policy_lag_mean": gs.get("lag_mean", lag[1]),
        "policy_lag_max": gs.get("lag_max", lag[2]),
        # the largest policy lag of any sample at its first SGD step, over the run and every rank (0 with
        # --async_rl=False)
        "policy_lag_max_run": gs.get("lag_max_run", rep.policies[0].lag_max_run),
        "async_rl": cfg.async_rl,
        "serial_mode": cfg.serial_mode,
        "dropped_trajectories": c.dropped_trajectories,
        # the agent steps of env_steps trained on, dropped as too old, and discarded at the run's end: summed over
        # the policies (each policy's own, with its env_steps, in policies)
        **{k: sum(p[k] for p in policies.values()) for k in books(c.policies[0]) if k != "env_steps"},
        # env.step calls (a multi-agent env's counts once, env_steps num_agents times) up to the last agreement
        "env_step_calls": c.env_step_calls,
        "world_size": rep.rank.world_size,
        "nproc_per_node": rep.rank.nproc_per_node,
        "nnodes": rep.rank.nnodes,
        "fps_per_rank": gs.get("fps_per_rank"),
        "seed": cfg.seed,
        "num_policies": cfg.num_policies,
        "policies": policies,
        "pbt_replacements": c.pbt_replacements,
        # seconds from spawning the workers until every env of rank 0's device group had started (None:
        # the run ended before)
        "envs_started_after_s": rep.startup.envs_started_after_s,
        # seconds from spawning the workers until this device group's first training step: the envs' start, their
        # decorrelation steps and the first batch (None: the run never trained)
        "startup_s": rep.startup.startup_s,
        # the env steps of the checkpoint this run resumed from (None: it started from scratch)
        "resumed_from_env_steps": c.resumed_env_steps,
        # frames (env steps without summaries_use_frameskip) at which --stop_at_return_mean was reached and the run
        # stopped (None: no target, or not reached)
        "return_target_reached_at": rep.target_reached_frames,
        # with --sampler_port: the sampler nodes and each one's books (msf.sampling.remote_sampler); else None
        "sampler_nodes": rep.sampler_nodes(),
    }
