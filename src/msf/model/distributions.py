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


def sample_categorical(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row of the categorical of ``logits`` ``[N, K]``, from torch's default generator: (actions ``[N]``
    int64, their log-probabilities ``[N]``: ``log_softmax(logits, -1)`` at the actions).

    By inversion (Devroye, *Non-Uniform Random Variate Generation*, 1986, section III.2.1), row by row: with ``c``
    the cumulative sums of the probabilities ``p`` and ``u = (1 - r) x c[K - 1]`` for a uniform ``r`` in ``[0, 1)``,
    the action is the number of ``k < K - 1`` with ``c[k] < u``, so action ``j`` is drawn when
    ``c[j - 1] < u <= c[j]``: with probability ``p[j]`` up to the uniform's 2**-24 steps, and never where ``p[j]`` is
    0 (a masked action's logit of -1e9), as ``u`` is in ``(0, c[K - 1]]``. The work runs on ``[K, N]`` (the
    categories as rows): each op is then one pass over ``N`` contiguous values, where the per-row kernels of
    ``torch.multinomial`` and a last-axis ``log_softmax`` cost several times more for the few categories of a
    policy's head.
    """
    log_p = torch.log_softmax(logits.t(), dim=0)  # [K, N]
    c = log_p.exp().cumsum_(0)
    u = torch.rand_like(c[-1]).neg_().add_(1.0).mul_(c[-1])
    actions = (c[:-1] < u).sum(0)
    return actions, log_p.gather(0, actions[None])[0]
