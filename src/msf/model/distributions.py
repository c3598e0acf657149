"""Action distributions beyond torch's: several independent categorical choices per action."""

from __future__ import annotations

import torch
from torch.distributions import Categorical


class MultiCategorical:
    """Independent categoricals over the dimensions of a ``MultiDiscrete`` (or ``Tuple`` of ``Discrete``)
    action. ``logits`` ``[N, sum(nvec)]`` are split by ``nvec``; actions are ``[N, len(nvec)]`` int64;
    ``log_prob`` and ``entropy`` are ``[N]`` sums over the dimensions (the dimensions are independent, so
    the joint log-probability is the sum)."""

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]):
        self.dists = [Categorical(logits=part, validate_args=False) for part in torch.split(logits, list(nvec), dim=-1)]

    def sample(self) -> torch.Tensor:
        return torch.stack([d.sample() for d in self.dists], dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return torch.stack([d.log_prob(actions[..., i]) for i, d in enumerate(self.dists)], dim=-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        return torch.stack([d.entropy() for d in self.dists], dim=-1).sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return torch.stack([d.probs.argmax(-1) for d in self.dists], dim=-1)
