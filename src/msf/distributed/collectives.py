"""The collectives of one process group, as an object: sums, gathers, broadcasts, replica checksums.

Code that communicates holds a :class:`Collectives` and calls it visibly (``self.collectives.all_reduce_sum_``):
a reader of the loss code sees which lines block on the other replicas. :class:`Collectives` itself is the
one-rank version (every method a local computation), which is also what unit tests pass;
:class:`ProcessGroupCollectives` runs the same methods on a ``torch.distributed`` process group. Every rank
of the group must call the same methods in the same order.
"""

from __future__ import annotations

import io
from typing import Any

import torch
import torch.distributed as dist


class ReplicaMismatch(RuntimeError):
    """Replicas that should be bit-identical are not."""


def tensor_checksums(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``[len(tensors)]`` int64: one checksum per tensor, of its exact bytes (position-weighted, so swaps show)."""
    sums = []
    for t in tensors:
        b = t.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
        w = torch.arange(1, b.numel() + 1, dtype=torch.int64, device=b.device) % 65521 + 1
        sums.append((b * w).sum())
    return torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.int64)


def learner_state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Parameters, buffers (normalisers) and optimiser state of a learner, by name."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        for k, v in state.items():
            if torch.is_tensor(v):
                out[f"optimizer.{i}.{k}"] = v
    return out


class Collectives:
    """One rank's collectives when it is the whole world: every method is local (the test fake too).

    Attributes:
        world_size: ranks in the group. rank: this process's rank in it. distributed: ``world_size > 1``.
    """

    world_size = 1
    rank = 0
    group: Any = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over ranks, in place; return it."""
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """``[world_size, *t.shape]``: ``t`` from every rank, in rank order."""
        return t[None]

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``t`` on every rank, in place; return it."""
        return t

    def check_identical(self, named: dict[str, torch.Tensor]) -> None:
        """Compare the checksums of ``named`` tensors across ranks.

        Raises:
            ReplicaMismatch: naming the first tensor whose checksum differs from rank 0's, and the ranks.
        """
        if not self.distributed:
            return
        names = list(named)
        gathered = self.all_gather(tensor_checksums([named[n] for n in names]))
        for i, name in enumerate(names):
            bad = [r for r in range(self.world_size) if gathered[r, i] != gathered[0, i]]
            if bad:
                raise ReplicaMismatch(f"replicas differ: {name!r} on rank(s) {bad} differs from rank 0")

    def newest_state(self, state: dict | None) -> dict | None:
        """Every rank passes the checkpoint it found on its own disk (or None); all return the newest of them
        (most env steps; the lowest rank on a tie), sent by the rank that holds it. So a resumed job needs
        no shared file system, and a rank 0 on another node still resumes.

        The state travels as the bytes of ``torch.save`` and is read back with ``weights_only=True``, the
        same safe path as a file.
        """
        if not self.distributed:
            return state
        steps = torch.tensor([float(state["env_steps"]) if state is not None else -1.0], dtype=torch.float64)
        all_steps = self.all_gather(steps).flatten()
        src = int(torch.argmax(all_steps))  # the first maximum
        if float(all_steps[src]) < 0:
            return None
        if self.rank == src:
            assert state is not None  # its env steps are the maximum, not -1
            buf = io.BytesIO()
            torch.save({k: v for k, v in state.items() if k != "path"}, buf)
            payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self.broadcast_(size, src)
        if self.rank != src:
            payload = torch.empty(int(size), dtype=torch.uint8)
        self.broadcast_(payload, src)
        if self.rank == src:
            return state
        out = torch.load(io.BytesIO(payload.numpy().tobytes()), map_location="cpu", weights_only=True)
        out["path"] = f"rank {src}'s checkpoint (env steps {int(all_steps[src])})"
        return out


class ProcessGroupCollectives(Collectives):
    """The collectives of a ``torch.distributed`` process group (``group=None``: the default group).

    With the NCCL backend, tensors travel through the GPU (NCCL reduces device tensors only) and come back
    to the device they came from.

    Raises:
        RuntimeError: no process group is initialised.
    """

    def __init__(self, group: Any = None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ProcessGroupCollectives needs an initialised torch.distributed process group")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._wire = torch.device("cuda") if dist.get_backend(group) == "nccl" else None

    def _on_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._wire is None or t.device.type == "cuda" else t.to(self._wire)

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        local = self._on_wire(t)
        dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.group)
        if local is not t:
            t.copy_(local)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        local = self._on_wire(t.contiguous())
        out = [torch.zeros_like(local) for _ in range(self.world_size)]
        dist.all_gather(out, local, group=self.group)
        return torch.stack(out).to(t.device)

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        local = self._on_wire(t)
        dist.broadcast(
            local, dist.get_global_rank(self.group, src) if self.group is not None else src, group=self.group
        )
        if local is not t:
            t.copy_(local)
        return t


def collectives_of(group: Any = None) -> Collectives:
    """:class:`ProcessGroupCollectives` of ``group`` when a process group of more than one rank is initialised,
    else the one-rank :class:`Collectives`."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        return ProcessGroupCollectives(group)
    return Collectives()
