"""Cross-rank agreement: sums, global moments, replica checksums.

Every function here is a collective when the default process group is initialised
with more than one rank (every rank must call it, in the same order), and a local
computation otherwise, so the learner's code is the same for one replica and for many.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_GROUP: list = [None]  # the process group of the learner that is training now (None: the default group)


@contextlib.contextmanager
def policy_group(group: Any) -> Iterator[None]:
    """Within the block, :func:`all_reduce_sum_`, :func:`all_reduce_max_` and :func:`global_moments` run on
    ``group`` (a policy's own process group; None: the default group). Every learner trains inside its
    policy's group, so the collectives of different policies stay on their own communicators."""
    _GROUP.append(group)
    try:
        yield
    finally:
        _GROUP.pop()


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks, in place; return it."""
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_GROUP[-1])
    return t


def all_reduce_max_(t: torch.Tensor) -> torch.Tensor:
    """Maximum of ``t`` over ranks, in place; return it."""
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_GROUP[-1])
    return t


def global_moments(x: torch.Tensor, sample_ndim: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count, mean and population variance of the samples of ``x`` on all ranks, in float64.

    Args:
        x: ``[..., *sample_shape]``, the leading dimensions are samples.
        sample_ndim: number of trailing dimensions that form one sample.

    Returns:
        count (scalar), mean and variance (``sample_shape``), from all-reduced
        (count, sum, sum of squares): every rank gets the same values.
    """
    shape = x.shape[x.dim() - sample_ndim:] if sample_ndim else torch.Size()
    flat = x.detach().reshape(-1, *shape)
    # in chunks of at most ~4M elements: a batch of images in float64 would otherwise take gigabytes
    per = max(1, (1 << 22) // max(1, shape.numel()))
    acc = torch.float64
    if flat.dtype == torch.uint8:
        # pixels: float32 sums of at most 256 samples are exact (256 x 255^2 < 2^24) and 3x faster
        per, acc = min(per, 256), torch.float32
    s1 = torch.zeros(shape, dtype=torch.float64, device=flat.device)
    s2 = torch.zeros(shape, dtype=torch.float64, device=flat.device)
    for lo in range(0, flat.shape[0], per):
        chunk = flat[lo:lo + per].to(acc)
        s1 += chunk.sum(0)
        s2 += chunk.square_().sum(0)
    n = torch.tensor([float(flat.shape[0])], dtype=torch.float64, device=flat.device)
    packed = torch.cat([n, s1.reshape(-1), s2.reshape(-1)])
    all_reduce_sum_(packed)
    count = packed[0]
    k = (packed.numel() - 1) // 2
    mean = (packed[1:1 + k] / count.clamp(min=1)).reshape(shape)
    var = (packed[1 + k:] / count.clamp(min=1)).reshape(shape) - mean.square()
    return count, mean, var.clamp(min=0.0)


def tensor_checksums(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One int64 checksum per tensor, of its exact bytes (position-weighted, so swaps show)."""
    sums = []
    for t in tensors:
        b = t.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
        w = torch.arange(1, b.numel() + 1, dtype=torch.int64, device=b.device) % 65521 + 1
        sums.append((b * w).sum())
    return torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.int64)


class ReplicaMismatch(RuntimeError):
    """Replicas that should be bit-identical are not."""


def check_replicas_identical(named: dict[str, torch.Tensor]) -> None:
    """Compare the checksums of ``named`` tensors across ranks.

    Raises:
        ReplicaMismatch: naming the first tensor whose checksum differs from rank 0's, and the ranks.
    """
    if not is_distributed():
        return
    names = list(named)
    local = tensor_checksums([named[n] for n in names])
    if dist.get_backend() == "nccl":
        local = local.cuda()  # NCCL gathers device tensors only
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    for i, name in enumerate(names):
        bad = [r for r, g in enumerate(gathered) if g[i] != gathered[0][i]]
        if bad:
            raise ReplicaMismatch(f"replicas differ: {name!r} on rank(s) {bad} differs from rank 0")


def learner_state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Parameters, buffers (normalisers) and optimiser state of a learner, by name."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        for k, v in state.items():
            if torch.is_tensor(v):
                out[f"optimizer.{i}.{k}"] = v
    return out


def broadcast_(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``t`` on every rank, in place (default group); return it."""
    if is_distributed():
        dev = torch.device("cuda") if dist.get_backend() == "nccl" else t.device
        local = t.to(dev)
        dist.broadcast(local, src)
        t.copy_(local)
    return t


def all_gather_tensor(t: torch.Tensor) -> torch.Tensor:
    """``[world_size, *t.shape]``: ``t`` from every rank, in rank order (``t[None]`` with one rank)."""
    if not is_distributed():
        return t[None]
    dev = torch.device("cuda") if dist.get_backend() == "nccl" else t.device
    local = t.to(dev)
    out = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return torch.stack(out).to(t.device)


def load_newest_state(state: dict | None) -> dict | None:
    """Collective: every rank passes the checkpoint it found on its own disk (or None); all return the
    newest of them (most env steps; the lowest rank on a tie), sent by the rank that holds it. So a
    resumed job needs no shared file system, and a rank 0 on another node still resumes.

    The state travels as the bytes of ``torch.save`` and is read back with ``weights_only=True``,
    the same safe path as a file.
    """
    import io

    steps = torch.tensor([float(state["env_steps"]) if state is not None else -1.0], dtype=torch.float64)
    all_steps = all_gather_tensor(steps).flatten()
    src = int(torch.argmax(all_steps))  # the first maximum
    if float(all_steps[src]) < 0:
        return None
    dev = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    if dist.get_rank() == src:
        buf = io.BytesIO()
        torch.save({k: v for k, v in state.items() if k != "path"}, buf)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    size = size.to(dev)
    dist.broadcast(size, src)
    if dist.get_rank() != src:
        payload = torch.empty(int(size), dtype=torch.uint8)
    data = payload.to(dev)
    dist.broadcast(data, src)
    if dist.get_rank() == src:
        return state
    out = torch.load(io.BytesIO(data.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
    out["path"] = f"rank {src}'s checkpoint (env steps {int(all_steps[src])})"
    return out
