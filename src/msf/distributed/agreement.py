"""The per-iteration agreement of the replicas: one all-reduce of one float64 vector.

Each rank packs what it proposes (a :class:`Proposal`: flags and the counts it gathered since the last
agreement) into a vector; the vectors are summed over ranks, and every rank unpacks the same
:class:`Decision`. So every rank takes the same control-flow decision (stop, write summaries, save, which
policies train) from the same numbers, and none is left waiting in a collective for a peer that has gone
(invariant 3 of the design). With one rank the all-reduce is a no-op and the code path is the same.

Layout of the vector (``[9 + 3P]`` float64, ``P`` policies): stop, failed, summary_due, save_due,
time_spent, env_steps, episodes, dropped_trajectories, env_step_calls, then per policy: has a batch for it; then
per policy its env steps; then per policy its dropped trajectories.
Counts travel as float64, exact up to 2**53.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from msf.distributed.collectives import Collectives

# the scalar fields, in vector order (then one entry per policy)
_SCALARS = (
    "stop",
    "failed",
    "summary_due",
    "save_due",
    "time_spent",
    "env_steps",
    "episodes",
    "dropped_trajectories",
    "env_step_calls",
)


@dataclass(frozen=True)
class Proposal:
    """What this rank proposes at one agreement.

    Attributes:
        stop: a stop was requested here (a signal, a stop request).
        failed: a child of this rank failed.
        summary_due, save_due: rank 0's clock says summaries / a checkpoint are due (other ranks: False).
        time_spent: this rank's clock says ``--train_for_seconds`` is spent.
        env_steps, episodes, dropped_trajectories: counted here since the last agreement (agent steps taken
            out of the buffer, finished episodes, trajectories dropped as too old).
        env_step_calls: the envs' steps (``env.step`` calls) the rollout workers made here since the last
            agreement (a multi-agent env's call is ``num_agents`` agent steps).
        has_batch: per policy, whether this rank holds a batch for it.
        policy_env_steps, policy_dropped: per policy, its share of ``env_steps`` and ``dropped_trajectories``
            (empty: zeros).
    """

    stop: bool = False
    failed: bool = False
    summary_due: bool = False
    save_due: bool = False
    time_spent: bool = False
    env_steps: int = 0
    episodes: int = 0
    dropped_trajectories: int = 0
    env_step_calls: int = 0
    has_batch: tuple[bool, ...] = ()
    policy_env_steps: tuple[int, ...] = ()
    policy_dropped: tuple[int, ...] = ()

    def pack(self) -> torch.Tensor:
        """``[9 + 3P]`` float64, in the layout of the module docstring."""
        return _pack(self)

    @classmethod
    def unpack(cls, v: torch.Tensor) -> "Proposal":
        """The proposal that :meth:`pack` made ``v`` from.

        Raises:
            ValueError: ``v`` is not a vector of 9 + 3P entries.
        """
        scalars, (has, steps, dropped) = _split(v)
        flags = {k: bool(x) for k, x in zip(_SCALARS[:5], scalars[:5])}
        counts: dict[str, Any] = {k: int(x) for k, x in zip(_SCALARS[5:], scalars[5:])}
        return cls(
            **flags, **counts, has_batch=tuple(bool(x) for x in has), policy_env_steps=steps, policy_dropped=dropped
        )


@dataclass(frozen=True)
class Decision:
    """The sum of every rank's :class:`Proposal`, field by field: the same on every rank.

    Attributes:
        stop, failed, summary_due, save_due, time_spent: how many ranks proposed each (act on ``> 0``).
        env_steps, episodes, dropped_trajectories, env_step_calls: the global counts since the last agreement.
        has_batch: per policy, how many ranks hold a batch for it (every rank trains the policies with ``> 0``;
            one without a batch brings an all-masked one).
        policy_env_steps, policy_dropped: per policy, the global counts since the last agreement.
    """

    stop: int = 0
    failed: int = 0
    summary_due: int = 0
    save_due: int = 0
    time_spent: int = 0
    env_steps: int = 0
    episodes: int = 0
    dropped_trajectories: int = 0
    env_step_calls: int = 0
    has_batch: tuple[int, ...] = ()
    policy_env_steps: tuple[int, ...] = ()
    policy_dropped: tuple[int, ...] = ()

    def pack(self) -> torch.Tensor:
        """``[9 + 3P]`` float64, in the layout of the module docstring."""
        return _pack(self)

    @classmethod
    def unpack(cls, v: torch.Tensor) -> "Decision":
        """The decision held in a summed vector ``v`` (see :meth:`pack`).

        Raises:
            ValueError: ``v`` is not a vector of 9 + 3P entries.
        """
        scalars, (has, steps, dropped) = _split(v)
        counts = {k: int(x) for k, x in zip(_SCALARS, scalars)}
        return cls(**counts, has_batch=has, policy_env_steps=steps, policy_dropped=dropped)


def _pack(record: Proposal | Decision) -> torch.Tensor:
    P = len(record.has_batch)
    values = [float(getattr(record, k)) for k in _SCALARS] + [float(h) for h in record.has_batch]
    for counts in (record.policy_env_steps, record.policy_dropped):
        values += [float(x) for x in counts] if counts else [0.0] * P
    return torch.tensor(values, dtype=torch.float64)


def _split(v: torch.Tensor) -> tuple[list[float], tuple[tuple[int, ...], ...]]:
    """The scalars, and the three per-policy blocks (as ints)."""
    n = len(_SCALARS)
    if v.dim() != 1 or v.numel() < n or (v.numel() - n) % 3:
        raise ValueError(f"an agreement vector has {n} + 3P entries, got shape {tuple(v.shape)}")
    values = v.tolist()
    P = (len(values) - n) // 3
    blocks = tuple(tuple(int(x) for x in values[n + i * P : n + (i + 1) * P]) for i in range(3))
    return values[:n], blocks


def agree(proposal: Proposal, collectives: Collectives) -> Decision:
    """Collective (every rank of ``collectives`` calls it with a proposal of the same number of policies):
    the sum of all ranks' proposals."""
    return Decision.unpack(collectives.all_reduce_sum_(proposal.pack()))
