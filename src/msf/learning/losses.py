"""PPO-clip losses, the fixed KL penalty and the exploration terms. Pure tensor functions over ``[N]`` samples."""

from __future__ import annotations

import math

import torch


def _reduce(per_sample: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return per_sample.mean() if weights is None else (per_sample * weights).sum()


def ppo_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Clipped surrogate loss (Schulman et al. 2017, "Proximal policy optimization", eq. 7), with
    the ratio clipped to ``[1 / (1 + eps), 1 + eps]`` as Sample Factory does (symmetric in log space),
    not ``[1 - eps, 1 + eps]``.

    ``loss = -mean(min(r A, clip(r, 1/(1+eps), 1+eps) A))``, ``r = exp(log_probs - old_log_probs)``.

    Args:
        log_probs: ``[N]`` under the policy being trained. old_log_probs: ``[N]`` of the behaviour
        policy. advantages: ``[N]``. weights: ``[N]`` per-sample weights replacing the mean (masks,
        and the scaling that makes DDP's average the global mean); None: the mean.

    Returns:
        scalar loss.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    clipped = ratio.clamp(1.0 / (1.0 + clip_ratio), 1.0 + clip_ratio)
    return _reduce(-torch.min(ratio * advantages, clipped * advantages), weights)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    targets: torch.Tensor,
    clip_value: float,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Clipped value loss as in Sample Factory and OpenAI baselines' PPO2:
    ``mean(max((v - R)^2, (v_old + clip(v - v_old, -c, c) - R)^2))``.

    Args:
        values, old_values, targets: ``[N]`` (all in the value head's units). weights: as in
        :func:`ppo_policy_loss`.

    Returns:
        scalar loss (not yet multiplied by ``value_loss_coeff``).
    """
    clipped = old_values + (values - old_values).clamp(-clip_value, clip_value)
    return _reduce(torch.max((values - targets).square(), (clipped - targets).square()), weights)


def approx_kl(log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """Estimate of ``KL(old || new)`` from log-probabilities of the old policy's actions:
    ``mean((r - 1) - log r)`` (non-negative, unbiased; J. Schulman, "Approximating KL divergence", 2020)."""
    log_r = log_probs - old_log_probs
    return (log_r.exp() - 1.0 - log_r).mean()


def symmetric_kl_to_uniform(logits: torch.Tensor, nvec: tuple[int, ...] | None = None) -> torch.Tensor:
    """Symmetric KL divergence between categorical distributions and the uniform one over their ``n`` actions:
    ``0.5 (KL(pi || U) + KL(U || pi)) = 0.5 (sum_a pi_a (log pi_a + log n) + sum_a (1/n) (-log n - log pi_a))``.

    Sample Factory's ``symmetric_kl`` exploration loss: unlike the entropy (bounded by ``log n``) it grows
    without bound as an action's probability goes to 0, so it keeps every action in play.

    Args:
        logits: ``[N, sum(nvec)]`` unnormalised log-probabilities (``[N, n]`` for one categorical).
        nvec: sizes of independent categoricals (a ``MultiDiscrete`` action), whose divergences are summed;
            None: one categorical.

    Returns:
        ``[N]`` divergences (nats).
    """
    parts = torch.split(logits, list(nvec), dim=-1) if nvec is not None else (logits,)
    total = torch.zeros(logits.shape[:-1], dtype=logits.dtype, device=logits.device)
    for part in parts:
        log_p = torch.log_softmax(part, dim=-1)
        n = part.shape[-1]
        log_u = -math.log(n)
        total = total + 0.5 * ((log_p.exp() * (log_p - log_u)).sum(-1) + ((log_u - log_p) / n).sum(-1))
    return total


def categorical_kl(logits: torch.Tensor, old_logits: torch.Tensor, nvec: tuple[int, ...] | None = None) -> torch.Tensor:
    """``KL(pi || pi_old) = sum_a pi_a (log pi_a - log pi_old_a)`` between the categorical distributions of
    ``logits`` (the policy being trained) and ``old_logits`` (the behaviour policy): the direction Sample
    Factory's fixed KL loss takes (``action_distribution.kl_divergence(old_action_distribution)``).

    Args:
        logits, old_logits: ``[N, sum(nvec)]`` unnormalised log-probabilities (``[N, n]`` for one categorical;
            masked actions at -1e9 in both contribute 0).
        nvec: sizes of independent categoricals (a ``MultiDiscrete`` action), whose divergences are summed;
            None: one categorical.

    Returns:
        ``[N]`` divergences (nats).
    """
    sizes = list(nvec) if nvec is not None else [logits.shape[-1]]
    total = torch.zeros(logits.shape[:-1], dtype=logits.dtype, device=logits.device)
    for new, old in zip(torch.split(logits, sizes, dim=-1), torch.split(old_logits, sizes, dim=-1)):
        log_p, log_q = torch.log_softmax(new, dim=-1), torch.log_softmax(old, dim=-1)
        total = total + (log_p.exp() * (log_p - log_q)).sum(-1)
    return total


def gaussian_kl(
    means: torch.Tensor, log_std: torch.Tensor, old_means: torch.Tensor, old_log_std: torch.Tensor
) -> torch.Tensor:
    """``KL(N(mu, s^2) || N(mu_old, s_old^2))`` of diagonal Gaussians, summed over the action dimensions:
    ``sum_i log(s_old_i / s_i) + (s_i^2 + (mu_i - mu_old_i)^2) / (2 s_old_i^2) - 1/2`` (the current policy
    first, as in :func:`categorical_kl`).

    Args:
        means, old_means: ``[N, A]``. log_std, old_log_std: natural logs of the standard deviations, ``[N, A]``
            or broadcastable to it (a state-independent ``[A]``).

    Returns:
        ``[N]`` divergences (nats).
    """
    var_ratio = torch.exp(2.0 * (log_std - old_log_std))
    mahalanobis = (means - old_means).square() * torch.exp(-2.0 * old_log_std)
    per_dim = (old_log_std - log_std) + 0.5 * (var_ratio + mahalanobis - 1.0)
    return per_dim.sum(-1)


def fixed_kl_loss(kl: torch.Tensor, coeff: float, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The fixed KL penalty of Schulman et al. 2017 ("Proximal Policy Optimization Algorithms", eq. 8 with a
    fixed ``beta = coeff``): ``coeff x mean(KL)`` over the valid samples, as Sample Factory's ``--kl_loss_coeff``
    adds it to the PPO-clip loss (there with the mean over the unmasked samples).

    Args:
        kl: ``[N]`` per-sample divergences (:func:`categorical_kl` / :func:`gaussian_kl`). weights: as in
            :func:`ppo_policy_loss`.

    Returns:
        scalar loss.
    """
    return coeff * _reduce(kl, weights)
