"""PBT rounds of a run: when the global frame count crosses a period, exploit and explore on every replica.

The decision itself is :func:`msf.learning.pbt.pbt_decision`, a pure function made once (rank 0) and
broadcast; every replica then applies it to its own learners, so each policy's replicas stay bit-identical.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch

from msf.cfg.config import Config
from msf.distributed.collectives import Collectives, tensor_checksums
from msf.distributed.rank_stats import gather_episode_means
from msf.learning.learner import Learner
from msf.learning.pbt import pbt_decision
from msf.persistence.train_state import TrainState
from msf.sampling.published_weights import PublishedWeights

log = logging.getLogger("msf")


def weights_checksum(learner: Learner) -> int:
    """One number for the exact bytes of a learner's model state (weights and normalisers): the sum of the
    per-tensor checksums of :func:`msf.distributed.collectives.tensor_checksums`."""
    return int(tensor_checksums(list(learner.model.state_dict().values())).sum())


class PbtRounds:
    """The run's PBT rounds, one every ``--pbt_period_env_steps`` frames.

    Args:
        cfg: the run's config. state: the run's counters (the round number and the replacements are kept
            there, so that a resumed run goes on with them). learners, weights: per policy, its learner and
            its published weights. world: the collectives over all ranks. is_main: this is rank 0, which
            decides. frames: the frame count now (the first round is at the next multiple of the period).
    """

    def __init__(
        self,
        cfg: Config,
        state: TrainState,
        learners: Sequence[Learner],
        weights: Sequence[PublishedWeights],
        world: Collectives,
        is_main: bool,
        frames: int,
    ):
        self.cfg, self.state, self.learners, self.weights, self.world = cfg, state, learners, weights, world
        self.is_main = is_main
        self.next_round = (frames // cfg.pbt_period_env_steps + 1) * cfg.pbt_period_env_steps

    def due(self, frames: int) -> bool:
        """PBT is on and ``frames`` (the global count: the same on every replica) reached the next period."""
        return self.cfg.with_pbt and frames >= self.next_round

    def run(self, frames: int) -> None:
        """Collective, at the same iteration on every replica: rank 0 decides from every replica's episode
        statistics and broadcasts the decision; every replica then copies the donors' weights into the
        recipients and sets their new hyperparameters. Before ``--pbt_start_mutation`` frames, only the
        next period is set."""
        while self.next_round <= frames:
            self.next_round += self.cfg.pbt_period_env_steps
        if frames < self.cfg.pbt_start_mutation:
            return
        # the returns of every replica's last episodes: a gather of its own, which leaves the reporter's
        # windows (FPS, waiting shares) alone
        objectives = [
            r
            for r, _ in gather_episode_means(
                [ps.returns for ps in self.state.policies],
                [ps.lengths for ps in self.state.policies],
                self.cfg.stats_avg,
                self.world,
            )
        ]
        self.state.pbt_round += 1
        names = list(self.learners[0].hyperparameters())
        table = self._decide(objectives, names) if self.is_main else self._no_replacement(names)
        self.world.broadcast_(table, src=0)
        for recipient in range(len(self.learners)):
            donor = int(table[recipient, 0])
            if donor >= 0:
                hyper = dict(zip(names, table[recipient, 1:].tolist()))
                self._replace(recipient, donor, hyper, objectives, frames)

    def _no_replacement(self, names: list[str]) -> torch.Tensor:
        """``[P, 1 + H]`` float64: per recipient, the donor (-1: kept) and the new hyperparameters."""
        return torch.full((len(self.learners), 1 + len(names)), -1.0, dtype=torch.float64)

    def _decide(self, objectives: list[float | None], names: list[str]) -> torch.Tensor:
        """Rank 0: this round's table (see :meth:`_no_replacement`), drawn from a generator seeded by the run's
        seed and the round, so that a resumed run draws what the uninterrupted one would have."""
        cfg, table = self.cfg, self._no_replacement(names)
        rng = np.random.default_rng([cfg.seed or 0, self.state.pbt_round, 17])
        for r in pbt_decision(
            objectives,
            [learner.hyperparameters() for learner in self.learners],
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
        return table

    def _replace(
        self, recipient: int, donor: int, hyper: dict[str, float], objectives: list[float | None], frames: int
    ) -> None:
        """Policy ``recipient`` takes ``donor``'s weights, normalisers and optimiser state and ``hyper``, and
        publishes the new weights; the replacement is recorded (with both weights checksums) and logged."""
        learner, src = self.learners[recipient], self.learners[donor]
        learner.copy_from(src)
        learner.set_hyperparameters(hyper)
        self.weights[recipient].publish(learner.model, learner.policy_version)
        checksum, donor_sum = weights_checksum(learner), weights_checksum(src)
        self.state.pbt_replacements.append(
            {
                "frames": frames,
                "round": self.state.pbt_round,
                "recipient": recipient,
                "donor": donor,
                "recipient_objective": objectives[recipient],
                "donor_objective": objectives[donor],
                "hyperparameters": hyper,
                "weights_checksum": checksum,  # the recipient's, after the copy
                "donor_weights_checksum": donor_sum,
            }
        )
        log.info(
            "PBT round %d at frame %d: policy %d (objective %.3f) takes policy %d's weights (objective "
            "%.3f), weights checksum %d (the donor's %d); hyperparameters %s",
            self.state.pbt_round,
            frames,
            recipient,
            objectives[recipient],
            donor,
            objectives[donor],
            checksum,
            donor_sum,
            " ".join(f"{k}={v:.6g}" for k, v in hyper.items()),
        )
