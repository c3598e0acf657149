"""Population-based training (Jaderberg et al. 2017, "Population Based Training of Neural Networks"):
the exploit (copy a better policy's weights) and explore (perturb its hyperparameters) steps over the
``num_policies`` policies of one run, with Sample Factory's flags.

The decision is a pure function of the policies' objectives, their hyperparameters and a random generator,
so that it is made once (rank 0) and applied identically everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The hyperparameters PBT perturbs, with the range each is kept in.
PBT_HYPERPARAMETERS: dict[str, tuple[float, float]] = {
    "learning_rate": (1e-7, 1e-1),
    "exploration_loss_coeff": (0.0, 1.0),
    "value_loss_coeff": (1e-3, 10.0),
    "ppo_clip_ratio": (0.01, 1.0),
}
# --pbt_optimize_gamma: the discount too, kept in this range (msf's; Sample Factory only keeps it >= 1e-8,
# and below 1 by construction) and perturbed through 1 - gamma by a factor from this range (Sample Factory's
# perturb_exponential_decay, whatever --pbt_perturb_min/max say: a discount should move slowly)
GAMMA_RANGE = (0.9, 0.9999)
GAMMA_PERTURB_FACTOR = (1.01, 1.2)


def pbt_hyperparameters(optimize_gamma: bool) -> dict[str, tuple[float, float]]:
    """The hyperparameters a run's PBT perturbs, in order, with their ranges: :data:`PBT_HYPERPARAMETERS`,
    then ``gamma`` (:data:`GAMMA_RANGE`) with ``optimize_gamma`` (``--pbt_optimize_gamma``)."""
    return {**PBT_HYPERPARAMETERS, "gamma": GAMMA_RANGE} if optimize_gamma else dict(PBT_HYPERPARAMETERS)


@dataclass(frozen=True)
class Replacement:
    """Policy ``recipient`` takes policy ``donor``'s weights, optimiser state and normalisers, and the
    hyperparameters ``hyperparameters`` (the donor's, perturbed)."""

    recipient: int
    donor: int
    hyperparameters: dict[str, float]


def perturb(hyper: dict[str, float], rng: np.random.Generator, rate: float, lo: float, hi: float) -> dict[str, float]:
    """Each value, with probability ``rate``, multiplied or divided (even odds) by a factor drawn uniformly
    from ``[lo, hi]``, then clipped to its range (:func:`pbt_hyperparameters`). ``gamma``, where ``hyper`` has
    it, is perturbed as Sample Factory perturbs it: ``1 - gamma`` multiplied or divided by a factor drawn from
    :data:`GAMMA_PERTURB_FACTOR`, so that ``gamma = 0.99`` moves to ``1 - 0.01 f^(+-1)`` (an effective horizon
    ``1 / (1 - gamma)`` scaled by at most 1.2), then clipped to :data:`GAMMA_RANGE`. A key outside both
    raises KeyError."""
    ranges = pbt_hyperparameters(True)
    out = {}
    for k, v in hyper.items():
        if rng.random() < rate:
            if k == "gamma":
                f = rng.uniform(*GAMMA_PERTURB_FACTOR)
                v = 1.0 - ((1.0 - v) * f if rng.random() < 0.5 else (1.0 - v) / f)
            else:
                f = rng.uniform(lo, hi)
                v = v * f if rng.random() < 0.5 else v / f
        a, b = ranges[k]
        out[k] = float(min(max(v, a), b))
    return out


def pbt_decision(
    objectives: list[float | None],
    hyper: list[dict[str, float]],
    rng: np.random.Generator,
    replace_fraction: float,
    gap: float,
    gap_absolute: float,
    mutation_rate: float,
    perturb_min: float,
    perturb_max: float,
) -> list[Replacement]:
    """Which policies are replaced, by whom, with which hyperparameters.

    Args:
        objectives: per policy, the objective (higher is better; None: not measured yet, never replaced
            and never a donor). The caller passes the mean episode return whatever ``--pbt_target_objective``
            says (that flag is accepted for Sample Factory's command lines, and read by nothing).
        hyper: per policy, its current values of the hyperparameters :func:`pbt_hyperparameters` lists.
        replace_fraction: the worst ``ceil(P x fraction)`` policies may be replaced, each by one of the best
            ``ceil(P x fraction)`` drawn at random.
        gap, gap_absolute: a replacement happens only if ``donor - recipient > max(gap x |recipient|,
            gap_absolute)``.

    Returns:
        the replacements, in recipient order.
    """
    ranked = sorted((o, p) for p, o in enumerate(objectives) if o is not None)
    measured = {p: o for o, p in ranked}
    k = min(len(ranked) // 2, math.ceil(len(objectives) * replace_fraction))
    if k < 1:
        return []
    worst = [p for _, p in ranked[:k]]
    best = [p for _, p in ranked[-k:]]
    out = []
    for recipient in sorted(worst):
        donor = best[int(rng.integers(len(best)))]
        o_r, o_d = measured[recipient], measured[donor]
        if o_d - o_r > max(gap * abs(o_r), gap_absolute):
            out.append(
                Replacement(recipient, donor, perturb(hyper[donor], rng, mutation_rate, perturb_min, perturb_max))
            )
    return out
