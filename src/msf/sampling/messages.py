"""Small messages between processes (queues carry these, never trajectories)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FullTrajectories:
    """Rollout worker -> learner: these slots hold finished trajectories."""

    worker: int
    slots: list[int]


@dataclass
class EpisodeStats:
    """Rollout worker -> learner: finished episodes since the last message (raw env rewards)."""

    worker: int
    returns: list[float]
    lengths: list[int]
    policies: list[int]  # the policy that drove each episode's agent
