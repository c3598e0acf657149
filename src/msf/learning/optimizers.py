"""The learner's optimiser: ``--optimizer=adam`` (``torch.optim.Adam``) or ``--optimizer=lamb`` (:class:`Lamb`).

Both take ``--learning_rate``, ``--adam_beta1``, ``--adam_beta2`` and ``--adam_eps``. The lr schedules set
``param_group["lr"]``, which both read at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from msf.cfg.config import Config

# Sample Factory 2.1.1 builds its Lamb with lr, betas and eps only, so these are its constructor's defaults.
LAMB_WEIGHT_DECAY = 1e-4
LAMB_MIN_TRUST = 0.01
LAMB_MAX_WEIGHT_NORM = 10.0


class Lamb(torch.optim.Optimizer):
    """LAMB: Adam's update rescaled per parameter tensor by a trust ratio (You et al. 2020, "Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes", Algorithm 2), with the details of Sample
    Factory 2.1.1's ``Lamb`` (``algo/utils/optimizers.py``, itself from bps-nav, Shacklett et al. 2021).

    For each parameter tensor ``w`` with gradient ``g``, at step ``t = 1, 2, ...`` (counted per tensor)::

        m_t = beta1 m_{t-1} + (1 - beta1) g                 v_t = beta2 v_{t-1} + (1 - beta2) g^2
        u   = (m_t / (1 - beta1^t)) / (sqrt(v_t) / sqrt(1 - beta2^t) + eps) + weight_decay w
        r   = clip(min(||w||, max_weight_norm) / ||u||, min_trust, 1 / min_trust)   if ||w|| > 0 and ||u|| > 0
            = 1                                                                      otherwise
        w  <- w - lr r u

    with ``||.||`` the L2 norm of the whole tensor and ``w`` the value before the step. That is Algorithm 2
    with the scaling function ``phi(z) = min(z, max_weight_norm)``, plus Sample Factory's clamp of the
    ratio to ``[min_trust, 1 / min_trust]`` and ratio 1 for a zero-norm tensor (a zero-initialised bias
    takes a plain Adam step). ``eps`` is added to the bias-corrected ``sqrt(v)``, as in ``torch.optim.Adam``.

    The ratio is computed with tensor operations (no host synchronisation); the step count is a CPU int64
    tensor per parameter (``state["step"]``, which ``load_state_dict`` leaves uncast), next to the float
    ``exp_avg`` and ``exp_avg_sq`` of the parameter's shape and dtype. Parameters without a gradient are
    skipped and their step count does not move.

    Args:
        params: parameters or parameter groups. lr: learning rate (``group["lr"]``, read at every step).
        betas: ``(beta1, beta2)`` in ``[0, 1)``. eps: ``>= 0``. weight_decay: ``lambda`` (added to the
        update, not the gradient), ``>= 0``. min_trust: in ``(0, 1]``; 1 turns the ratio off (``r = 1``).
        max_weight_norm: the cap of ``||w||`` in the ratio's numerator.

    Raises:
        ValueError: a hyperparameter out of its range. RuntimeError: a sparse gradient.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = LAMB_WEIGHT_DECAY,
        min_trust: float = LAMB_MIN_TRUST,
        max_weight_norm: float = LAMB_MAX_WEIGHT_NORM,
    ):
        if not lr >= 0.0:
            raise ValueError(f"Lamb: lr must be >= 0, got {lr}")
        if not eps >= 0.0:
            raise ValueError(f"Lamb: eps must be >= 0, got {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Lamb: betas must be in [0, 1), got {betas}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Lamb: weight_decay must be >= 0, got {weight_decay}")
        if not 0.0 < min_trust <= 1.0:
            raise ValueError(f"Lamb: min_trust must be in (0, 1], got {min_trust}")
        if not max_weight_norm > 0.0:
            raise ValueError(f"Lamb: max_weight_norm must be > 0, got {max_weight_norm}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            min_trust=min_trust,
            max_weight_norm=max_weight_norm,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        """One update of every parameter that has a gradient (see the class docstring).

        Args:
            closure: re-evaluates the model and returns the loss (called with gradients enabled).

        Returns:
            the closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            min_trust, cap = group["min_trust"], group["max_weight_norm"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.zeros((), dtype=torch.int64)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = int(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = (v.sqrt() / math.sqrt(1.0 - beta2**t)).add_(eps)
                update = (m / (1.0 - beta1**t)).div_(denom)
                if decay != 0.0:
                    update.add_(p, alpha=decay)
                if min_trust < 1.0:
                    w_norm = torch.linalg.vector_norm(p)
                    u_norm = torch.linalg.vector_norm(update)
                    ratio = (w_norm.clamp(max=cap) / u_norm).clamp(min_trust, 1.0 / min_trust)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))
                    update.mul_(ratio)
                p.add_(update, alpha=-lr)
        return loss


def make_optimizer(cfg: Config, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimiser ``--optimizer`` names, over ``params``, with ``--learning_rate`` (the initial lr; the
    schedules change it later), ``betas = (--adam_beta1, --adam_beta2)`` and ``eps = --adam_eps``; LAMB also
    with Sample Factory's fixed weight decay, trust clamp and weight-norm cap (:data:`LAMB_WEIGHT_DECAY`,
    :data:`LAMB_MIN_TRUST`, :data:`LAMB_MAX_WEIGHT_NORM`).

    Raises:
        ValueError: an ``--optimizer`` other than adam or lamb.
    """
    kwargs: dict[str, Any] = dict(lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, **kwargs)
    if cfg.optimizer == "lamb":
        return Lamb(params, **kwargs)
    raise ValueError(f"unknown --optimizer {cfg.optimizer!r} (adam or lamb)")
