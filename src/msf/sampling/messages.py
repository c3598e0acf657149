"""Small messages between processes (queues carry these, never trajectories), and named views over the
counters the workers share with the training loop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class FullTrajectories:
    """Rollout worker -> learner: these slots hold finished trajectories."""

    worker: int
    slots: list[int]


@dataclass(frozen=True)
class SlotsReturned:
    """Learner -> rollout worker: these of its slots were copied out and may be written again."""

    slots: list[int]


@dataclass(frozen=True)
class EpisodeStats:
    """Rollout worker -> learner: finished episodes since the last message (raw env rewards)."""

    worker: int
    returns: list[float]
    lengths: list[int]
    policies: list[int]  # the policy that drove each episode's agent


class _SharedCounters:
    """A ``[SIZE]`` float64 tensor in shared memory with a numpy view (adding to it costs nanoseconds); pickled
    as the tensor, so the view is rebuilt in the process that receives it.

    Args:
        shared: the tensor (None: allocate one in shared memory).
    """

    SIZE = 3

    def __init__(self, shared: torch.Tensor | None = None):
        self.tensor = torch.zeros(self.SIZE, dtype=torch.float64).share_memory_() if shared is None else shared
        self._v: np.ndarray = self.tensor.numpy()

    def __getstate__(self) -> dict:
        return {"tensor": self.tensor}

    def __setstate__(self, state: dict) -> None:
        _SharedCounters.__init__(self, state["tensor"])


class InferenceCounters(_SharedCounters):
    """What one inference worker has done so far, in a ``[3]`` shared tensor (:class:`_SharedCounters`): batches
    served, samples served, seconds spent waiting for requests. The worker adds to them; the training loop reads
    them for the summaries."""

    def add_batch(self, samples: int) -> None:
        self._v[0] += 1
        self._v[1] += samples

    def add_wait(self, seconds: float) -> None:
        self._v[2] += seconds

    @property
    def batches(self) -> float:
        return float(self._v[0])

    @property
    def samples(self) -> float:
        return float(self._v[1])

    @property
    def wait_seconds(self) -> float:
        return float(self._v[2])


class RolloutCounters(_SharedCounters):
    """What one rollout worker has done so far, in a ``[4]`` shared tensor (:class:`_SharedCounters`): seconds
    waiting for actions or a free slot, envs made and started (the start-up's progress, which the training loop
    reports) and split steps."""

    SIZE = 4

    def add_wait(self, seconds: float) -> None:
        self._v[0] += seconds

    @property
    def wait_seconds(self) -> float:
        return float(self._v[0])

    def add_step(self) -> None:
        """One more step of one split (its sign of life: ``--heartbeat_interval``)."""
        self._v[3] += 1

    @property
    def steps(self) -> int:
        return int(self._v[3])

    def add_env(self, stage: str, n: int = 1) -> None:
        """``n`` more envs ``"made"`` or ``"started"`` (first reset done)."""
        self._v[1 if stage == "made" else 2] += n

    @property
    def envs_made(self) -> int:
        return int(self._v[1])

    @property
    def envs_started(self) -> int:
        return int(self._v[2])
