"""The training state of a run: what a checkpoint holds, written and read in one place.

A checkpoint of policy ``p`` (``checkpoint_p{p}/``) holds that policy's learner state (model with its
normalisers, optimiser, train step, lr, PBT's hyperparameters: the learner's own ``state_dict``) and the
run's counters (:class:`TrainState`): env steps, episodes, dropped trajectories, the policy's last episodes
and best metric, PBT's round and replacements. The counters are global (summed over ranks), so a checkpoint
loads on any world size. :meth:`TrainState.capture` makes the dict that is saved, :meth:`TrainState.restore`
reads it back.

This module knows no learner class (persistence sits below learning): a learner is anything with the
methods of :class:`ResumableLearner`.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import msf
from msf.persistence.checkpoint import load_into, load_latest_checkpoint

log = logging.getLogger("msf")


class ResumableLearner(Protocol):
    """What the training state needs of a learner (:class:`msf.learning.learner.Learner` has it)."""

    @property
    def policy_version(self) -> int: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def set_lr(self, lr: float) -> None: ...


@dataclass
class PolicyState:
    """One policy's part of the counters: this replica's last episodes driven by it (raw returns, lengths
    in agent steps; at most ``--stats_avg`` each), the metric of its best checkpoint so far, and its books (summed
    over the replicas, resumes included): ``env_steps`` taken out of the buffers, of which ``trained_steps`` were
    trained on and ``dropped_steps`` dropped as too old; the rest (:attr:`discarded_steps`) the run ended with
    (a stop, a failure, the end), or its checkpoint was written before they were trained on."""

    returns: collections.deque = field(default_factory=collections.deque)
    lengths: collections.deque = field(default_factory=collections.deque)
    best_metric: float | None = None
    env_steps: int = 0
    trained_steps: int = 0
    dropped_steps: int = 0

    @property
    def discarded_steps(self) -> int:
        return self.env_steps - self.trained_steps - self.dropped_steps


@dataclass
class TrainState:
    """The run's counters, summed over all replicas and policies.

    Attributes:
        env_steps: agent steps of all trajectories the learners took out of their buffers (trained on, or
            dropped as too old). episodes: finished episodes. dropped_trajectories: dropped as too old.
        env_step_calls: the envs' steps the rollout workers made (``env.step`` calls; a multi-agent env's one
            call is ``num_agents`` agent steps of ``env_steps``), as of the last agreement; 0 in a checkpoint
            written before msf counted them.
        policies: per policy, its :class:`PolicyState`.
        pbt_round: PBT rounds so far. pbt_replacements: every PBT replacement of the run (resumes included),
            one dict each, as ``summary.json`` lists them.
        resumed_env_steps: the env steps of the checkpoint policy 0 resumed from (None: a fresh start).
    """

    env_steps: int = 0
    episodes: int = 0
    dropped_trajectories: int = 0
    env_step_calls: int = 0
    policies: list[PolicyState] = field(default_factory=lambda: [PolicyState()])
    pbt_round: int = 0
    pbt_replacements: list[dict] = field(default_factory=list)
    resumed_env_steps: int | None = None

    @classmethod
    def fresh(cls, num_policies: int, stats_avg: int) -> "TrainState":
        """The state of a new run: zero counts, no episodes (each policy keeps at most ``stats_avg``)."""
        return cls(policies=[_policy_state([], [], None, stats_avg) for _ in range(num_policies)])

    def purge_step(self, frameskip: int) -> int | None:
        """The first TensorBoard step a resumed run may write (None: a fresh start, nothing to purge): just after
        the checkpoint's point, which the run that stopped there wrote last (a run that died later wrote more,
        and those events are dropped from the curves)."""
        return None if self.resumed_env_steps is None else self.resumed_env_steps * frameskip + 1

    def capture(self, policy: int, learner: ResumableLearner, config: dict, world_size: int) -> dict:
        """Policy ``policy``'s checkpoint: its learner's state, the counters, the run's ``config`` (``to_dict()``
        of the config) and ``world_size`` (for the record: the state loads on any world size). The tensors
        are the live ones; snapshot them before training goes on."""
        ps = self.policies[policy]
        return {
            **learner.state_dict(),
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "policy": policy,
            "policy_version": learner.policy_version,
            "config": config,
            "world_size": world_size,
            "msf_version": msf.__version__,
            "episode_returns": list(ps.returns),
            "episode_lengths": list(ps.lengths),
            "dropped_trajectories": self.dropped_trajectories,
            "env_step_calls": self.env_step_calls,
            "best_metric": ps.best_metric,
            "books": {"env_steps": ps.env_steps, "trained": ps.trained_steps, "dropped": ps.dropped_steps},
            "pbt_round": self.pbt_round,
            "pbt_replacements": list(self.pbt_replacements),
        }

    @classmethod
    def restore(
        cls,
        learners: Sequence[ResumableLearner],
        exp_dir: str,
        resume: bool,
        learning_rate: float,
        stats_avg: int,
        exchange: Callable[[dict | None], dict | None] = lambda state: state,
    ) -> "TrainState":
        """Load each policy's newest checkpoint into its learner and return the counters it holds.

        Args:
            learners: per policy, its learner (left as it is where no checkpoint is found).
            resume: False: start afresh (``--restart_behavior`` other than ``resume``); nothing is read.
            learning_rate: ``--learning_rate`` now: where it differs from the checkpoint's config, it replaces
                the checkpoint's lr (it was changed on the command line).
            stats_avg: episodes kept per policy.
            exchange: every rank passes the state it found (or None) and gets the one to use: with several
                ranks, the newest of them (:meth:`msf.distributed.collectives.Collectives.newest_state`), so
                no shared file system is needed. Collective: called once per policy, in policy order.

        The counters come from policy 0's checkpoint (every policy's checkpoint holds the same ones); each
        policy's episodes and best metric from its own.

        Raises:
            CheckpointError: a checkpoint does not fit its learner; a policy has checkpoint files and none is
                readable (``msf-train`` refuses that case before it spawns anything; a broken file met here is
                only logged, never moved).
        """
        out = cls.fresh(len(learners), stats_avg)
        for p, learner in enumerate(learners):
            state = exchange(load_latest_checkpoint(exp_dir, policy=p) if resume else None)
            if state is None:
                continue
            load_into(state, learner.load_state_dict)
            saved_lr = state.get("config", {}).get("learning_rate")
            if saved_lr is not None and saved_lr != learning_rate:
                learner.set_lr(learning_rate)
                log.info("learning rate set to %g (--learning_rate changed from %g)", learning_rate, saved_lr)
            out.policies[p] = _policy_state(
                state["episode_returns"], state["episode_lengths"], state.get("best_metric"), stats_avg
            )
            books = state.get("books", {})  # none in a checkpoint of an msf that kept no books: from 0
            ps = out.policies[p]
            ps.env_steps, ps.trained_steps, ps.dropped_steps = (
                int(books.get(k, 0)) for k in ("env_steps", "trained", "dropped")
            )
            if p == 0:
                out.env_steps, out.episodes = state["env_steps"], state["episodes"]
                out.dropped_trajectories = state["dropped_trajectories"]
                out.env_step_calls = int(state.get("env_step_calls", 0))
                out.pbt_round = int(state.get("pbt_round", 0))
                out.pbt_replacements = list(state.get("pbt_replacements", []))
                out.resumed_env_steps = out.env_steps
            log.info(
                "resumed%s from %s at env step %d, policy version %d",
                f" policy {p}" if len(learners) > 1 else "",
                state["path"],
                state["env_steps"],
                learner.policy_version,
            )
        return out


def _policy_state(returns: Sequence[float], lengths: Sequence[int], best: float | None, keep: int) -> PolicyState:
    return PolicyState(collections.deque(returns, maxlen=keep), collections.deque(lengths, maxlen=keep), best)
