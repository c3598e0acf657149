"""Running mean and variance, for observation and return normalisation.

Statistics are updated explicitly by the learner (:meth:`RunningMeanStd.update`), never
inside ``forward``, so that the forward pass is a pure function of the parameters and
buffers that the learner publishes to the inference workers.

Nothing here communicates: with several replicas, the learner passes ``reduce_sum`` (its process group's
in-place all-reduce, :meth:`msf.distributed.collectives.Collectives.all_reduce_sum_`), which sums the
batch moments over the replicas; without it the moments are this process's own.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

ReduceSum = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over replicas in place and returns it


def moment_sums(x: torch.Tensor, sample_ndim: int = 0) -> torch.Tensor:
    """The sums the moments of ``x``'s samples are made of, packed for one reduction over replicas: float64
    ``[1 + 2k]``, (count, sum, sum of squares) with ``k`` the elements of one sample (see :func:`batch_moments`;
    :func:`moments_of_sums` turns them, summed over replicas or not, into count, mean and variance)."""
    shape = x.shape[x.dim() - sample_ndim :] if sample_ndim else torch.Size()
    flat = x.detach().reshape(-1, *shape)
    # in chunks of at most ~4M elements: a batch of images in float64 would otherwise take gigabytes
    per = max(1, (1 << 22) // max(1, shape.numel()))
    acc = torch.float64
    if flat.dtype == torch.uint8:
        # pixels: float32 sums of at most 256 samples are exact (256 x 255^2 < 2^24), and cheaper than float64
        per, acc = min(per, 256), torch.float32
    s1 = torch.zeros(shape, dtype=torch.float64, device=flat.device)
    s2 = torch.zeros(shape, dtype=torch.float64, device=flat.device)
    for lo in range(0, flat.shape[0], per):
        chunk = flat[lo : lo + per].to(acc)
        s1 += chunk.sum(0)
        s2 += chunk.square_().sum(0)
    n = torch.tensor([float(flat.shape[0])], dtype=torch.float64, device=flat.device)
    return torch.cat([n, s1.reshape(-1), s2.reshape(-1)])


def moments_of_sums(packed: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count (scalar), mean and population variance (``shape``, float64) from :func:`moment_sums`' ``packed``."""
    count = packed[0]
    k = (packed.numel() - 1) // 2
    mean = (packed[1 : 1 + k] / count.clamp(min=1)).reshape(shape)
    var = (packed[1 + k :] / count.clamp(min=1)).reshape(shape) - mean.square()
    return count, mean, var.clamp(min=0.0)


def batch_moments(
    x: torch.Tensor, sample_ndim: int = 0, reduce_sum: ReduceSum | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count, mean and population variance of the samples of ``x``, in float64.

    Args:
        x: ``[..., *sample_shape]``, the leading dimensions are samples.
        sample_ndim: number of trailing dimensions that form one sample.
        reduce_sum: sums the packed (count, sum, sum of squares) over replicas (None: this process only).

    Returns:
        count (scalar), mean and variance (``sample_shape``): with ``reduce_sum``, the moments of the
        samples of every replica, the same values on each.
    """
    shape = x.shape[x.dim() - sample_ndim :] if sample_ndim else torch.Size()
    packed = moment_sums(x, sample_ndim)
    if reduce_sum is not None:
        packed = reduce_sum(packed)
    return moments_of_sums(packed, shape)


class RunningMeanStd(nn.Module):
    """Mean and variance over all samples seen, merged batch by batch.

    The merge is the parallel variance formula of Chan, Golub & LeVeque (1979):
    for counts ``n_a, n_b``, means ``m_a, m_b`` and variances ``v_a, v_b``,
    ``m = m_a + d n_b / n``, ``v = (v_a n_a + v_b n_b + d^2 n_a n_b / n) / n`` with
    ``d = m_b - m_a``, ``n = n_a + n_b``. Statistics are kept in float64.

    Args:
        shape: shape of one sample (``()`` for scalars).
        clip: normalised values are clipped to ``[-clip, clip]`` (None: no clip).
        eps: added to the variance before the square root.
    """

    mean: torch.Tensor  # buffers, float64
    var: torch.Tensor
    count: torch.Tensor
    mean_f32: torch.Tensor
    std_f32: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float | None = 5.0, eps: float = 1e-5):
        super().__init__()
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # float32 copies for the hot path (inference on float32 observations), refreshed by update()
        self.register_buffer("mean_f32", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("std_f32", torch.full(shape, (1.0 + eps) ** 0.5, dtype=torch.float32))

    @torch.no_grad()
    def preset(self, mean: float, var: float) -> None:
        """Statistics to use before the first :meth:`update` (which replaces them: the count stays 0), and their
        float32 copies: ``mean_f32 = mean``, ``std_f32 = sqrt(var + eps)``."""
        self.mean.fill_(mean)
        self.var.fill_(var)
        self.mean_f32.copy_(self.mean)
        self.std_f32.copy_(torch.sqrt(self.var + self.eps))

    @torch.no_grad()
    def update(self, x: torch.Tensor, reduce_sum: ReduceSum | None = None) -> None:
        """Merge a batch ``x`` of shape ``[N, *shape]`` into the statistics.

        With ``reduce_sum`` (a collective: every replica calls it) the batch moments (count, sum, sum of
        squares) are summed over the replicas, so every replica merges the same global moments and
        ``count`` is the true number of samples.
        """
        n_b, m_b, v_b = batch_moments(x.reshape(-1, *self.mean.shape), self.mean.dim(), reduce_sum)
        if n_b == 0:
            return
        n_a = self.count
        n = n_a + n_b
        d = m_b - self.mean
        self.mean.add_(d * n_b / n)
        self.var.copy_((self.var * n_a + v_b * n_b + d.square() * n_a * n_b / n) / n)
        self.count.fill_(n)
        self.mean_f32.copy_(self.mean)
        self.std_f32.copy_(torch.sqrt(self.var + self.eps))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / sqrt(var + eps)``, clipped; same shape and dtype as ``x``."""
        if x.dtype == torch.float32:
            # one fused pass over the batch: x * (1 / std) - mean / std (the [*shape] factors cost nothing)
            inv = 1.0 / self.std_f32
            y = torch.addcmul(-self.mean_f32 * inv, x, inv)
            return y.clamp_(-self.clip, self.clip) if self.clip is not None else y
        else:
            y = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var + self.eps).to(x.dtype)
        if self.clip is not None:
            y = y.clamp(-self.clip, self.clip)
        return y

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`normalize` (without the clip)."""
        if y.dtype == torch.float32:
            return y * self.std_f32 + self.mean_f32
        return y * torch.sqrt(self.var + self.eps).to(y.dtype) + self.mean.to(y.dtype)
