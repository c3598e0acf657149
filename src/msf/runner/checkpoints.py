"""When the device group writes checkpoints: periodic ones (with milestone copies) and the best one, on rank 0.

What a checkpoint holds is :meth:`msf.persistence.train_state.TrainState.capture`'s; how it reaches the disk
(a snapshot, a background thread, an atomic rename) is :class:`msf.persistence.checkpoint.BackgroundCheckpointWriter`'s.
"""

from __future__ import annotations

import time
from typing import Sequence

from msf.cfg.config import Config
from msf.distributed.topology import RankInfo
from msf.learning.learner import Learner
from msf.persistence.checkpoint import BackgroundCheckpointWriter, best_on_disk
from msf.persistence.sf2_checkpoint import sf2_files
from msf.persistence.train_state import TrainState


class Checkpoints:
    """One background writer per policy (``checkpoint_p{p}/``); only rank 0 submits anything.

    Args:
        cfg: the run's config (``keep_checkpoints``, ``save_best_metric``, ``save_milestones_sec``,
            ``save_best_after``, ``save_best_every_sec``). exp_dir: the experiment folder.
        state: the run's counters. learners: per policy, its learner. rank: this device group's rank.
        start_time: the run's start (``time.monotonic()``), from which the milestone and best-checkpoint
            intervals count.
    """

    def __init__(
        self,
        cfg: Config,
        exp_dir: str,
        state: TrainState,
        learners: Sequence[Learner],
        rank: RankInfo,
        start_time: float,
    ):
        self.cfg, self.state, self.learners, self.rank = cfg, state, learners, rank
        # beside Sample Factory's checkpoints, a writer that never deletes or overwrites them
        self.writers = [
            BackgroundCheckpointWriter(exp_dir, cfg.keep_checkpoints, cfg.save_best_metric, p, sf2_files(exp_dir, p))
            for p in range(len(learners))
        ]
        self.last_milestone = start_time
        self.last_best = [start_time] * len(learners)
        if rank.is_main:
            # a best checkpoint written after the state this run starts from (an earlier attempt that failed before
            # its next periodic checkpoint, or before its first) stays the one to beat
            for p, ps in enumerate(state.policies):
                earlier = best_on_disk(exp_dir, cfg.save_best_metric, p)
                if earlier is not None and (ps.best_metric is None or earlier > ps.best_metric):
                    ps.best_metric = earlier

    def capture(self, policy: int) -> dict:
        """Policy ``policy``'s training state now (see :meth:`TrainState.capture`)."""
        return self.state.capture(policy, self.learners[policy], self.cfg.to_dict(), self.rank.world_size)

    def save(self, wait: bool = False) -> None:
        """Rank 0 snapshots every policy's state now and writes them in the background (``wait``: and waits
        for the files); other ranks do nothing."""
        if not self.rank.is_main:
            return
        now = time.monotonic()
        milestone = 0 < self.cfg.save_milestones_sec <= now - self.last_milestone
        if milestone:
            self.last_milestone = now
        for p, writer in enumerate(self.writers):
            writer.submit(self.capture(p), milestone=milestone)
        if wait:
            for writer in self.writers:
                writer.flush()

    def save_best(self, policy: int, return_mean: float | None, frames: int) -> None:
        """Rank 0: write ``policy``'s best checkpoint when ``return_mean`` (of every replica's last episodes)
        beats its best so far, after ``save_best_after`` frames and at most every ``save_best_every_sec``."""
        cfg, ps, now = self.cfg, self.state.policies[policy], time.monotonic()
        if (
            not self.rank.is_main
            or return_mean is None
            or frames < cfg.save_best_after
            or now - self.last_best[policy] < cfg.save_best_every_sec
        ):
            return
        if ps.best_metric is not None and return_mean <= ps.best_metric:
            return
        ps.best_metric, self.last_best[policy] = return_mean, now
        self.writers[policy].submit(self.capture(policy), best=return_mean)

    def close(self) -> None:
        """Finish the checkpoint writes in flight (raises the first failure, after closing every writer)."""
        errors = []
        for writer in self.writers:
            try:
                writer.close()
            except Exception as e:  # noqa: BLE001 - every writer is closed; the first failure is raised
                errors.append(e)
        if errors:
            raise errors[0]
