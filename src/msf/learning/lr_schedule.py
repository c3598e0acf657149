"""Learning-rate schedules: constant and Sample Factory's KL-adaptive ones."""

from __future__ import annotations


class KlAdaptiveLR:
    """Divide the lr by 1.5 when the KL exceeds ``2 * threshold``; multiply it by 1.5 when the
    KL is below ``threshold / 2``; keep it in ``[lr_min, lr_max]``.

    Args:
        lr: starting learning rate. threshold: KL target. lr_min, lr_max: bounds.
    """

    def __init__(self, lr: float, threshold: float, lr_min: float, lr_max: float):
        self.lr, self.threshold, self.lr_min, self.lr_max = lr, threshold, lr_min, lr_max

    def update(self, kl: float) -> float:
        """Adjust for the measured ``kl`` and return the new learning rate."""
        if kl > 2.0 * self.threshold:
            self.lr = max(self.lr / 1.5, self.lr_min)
        elif kl < 0.5 * self.threshold:
            self.lr = min(self.lr * 1.5, self.lr_max)
        return self.lr
