"""Advantage estimators: GAE and V-trace. Pure tensor functions, ``[B, T]`` layout.

``B`` trajectories of ``T`` steps. ``values`` has ``T + 1`` columns: the last one is the
value of the observation after the last step (the bootstrap). ``dones[:, t] = 1`` when
the episode ended at step ``t`` (terminated, or truncated), so nothing is bootstrapped
across it; ``values[:, t + 1]`` then belongs to the next episode and is masked out.
"""

from __future__ import annotations

import torch


def apply_value_bootstrap(
    rewards: torch.Tensor, values: torch.Tensor, time_outs: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Sample Factory's ``--value_bootstrap``: on a truncated episode, ``r_t + gamma * V(s_t)``.

    The value of the state after a time-out is not observed by the learner, so the value
    of the last observed state ``s_t`` stands in for it.

    Args:
        rewards: ``[B, T]``.
        values: ``[B, T + 1]`` (or ``[B, T]``), return units.
        time_outs: ``[B, T]``, 1 where the episode was truncated (and not terminated) at ``t``.

    Returns:
        ``[B, T]`` rewards with the bootstrap added.
    """
    T = rewards.shape[1]
    return rewards + gamma * values[:, :T] * time_outs


def gae(
    rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, gamma: float, gae_lambda: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, "High-dimensional continuous
    control using generalized advantage estimation", eq. 16).

    ``delta_t = r_t + gamma (1 - d_t) V_{t+1} - V_t``,
    ``A_t = delta_t + gamma lambda (1 - d_t) A_{t+1}``, ``A_T = 0``.

    Args:
        rewards: ``[B, T]``. values: ``[B, T + 1]``. dones: ``[B, T]`` in {0, 1}.

    Returns:
        advantages ``[B, T]`` and value targets ``A_t + V_t`` ``[B, T]``.
    """
    T = rewards.shape[1]
    not_done = 1.0 - dones.to(rewards.dtype)
    deltas = rewards + gamma * not_done * values[:, 1:] - values[:, :T]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        last = deltas[:, t] + gamma * gae_lambda * not_done[:, t] * last
        adv[:, t] = last
    return adv, adv + values[:, :T]


def vtrace(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    log_rhos: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, "IMPALA", eq. 1
    and section 4.2), with discount ``gamma_t = gamma (1 - d_t)``.

    ``rho_t = min(rho_bar, pi/mu)``, ``c_t = min(c_bar, pi/mu)``,
    ``delta_t = rho_t (r_t + gamma_t V_{t+1} - V_t)``,
    ``v_t = V_t + delta_t + gamma_t c_t (v_{t+1} - V_{t+1})``, ``v_T = V_T``,
    advantage ``rho_t (r_t + gamma_t v_{t+1} - V_t)``.

    Args:
        rewards: ``[B, T]``. values: ``[B, T + 1]`` under the learner's policy.
        dones: ``[B, T]``. log_rhos: ``[B, T]``, ``log pi(a|s) - log mu(a|s)``.

    Returns:
        value targets ``v_t`` ``[B, T]`` and advantages ``[B, T]``.
    """
    T = rewards.shape[1]
    discounts = gamma * (1.0 - dones.to(rewards.dtype))
    ratios = log_rhos.exp()
    rhos = ratios.clamp(max=rho_bar)
    cs = ratios.clamp(max=c_bar)
    deltas = rhos * (rewards + discounts * values[:, 1:] - values[:, :T])
    vs_minus_v = torch.zeros_like(values)
    for t in reversed(range(T)):
        vs_minus_v[:, t] = deltas[:, t] + discounts[:, t] * cs[:, t] * vs_minus_v[:, t + 1]
    vs = vs_minus_v + values
    pg_adv = rhos * (rewards + discounts * vs[:, 1:] - values[:, :T])
    return vs[:, :T], pg_adv
