"""Weights published by a learner to the inference workers of its device group.

A copy of the model's ``state_dict`` (parameters and normaliser buffers) in shared CPU
memory, guarded by a sequence counter (a seqlock): the learner makes the counter odd,
copies, then makes it even again; a reader copies when the counter is even and keeps the
copy only if the counter did not move meanwhile. Neither side ever blocks the other.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class PublishedWeights:
    """Shared-memory weights with a policy version.

    Args:
        model: the model whose ``state_dict`` layout is published (tensors are copied, not aliased).
    """

    def __init__(self, model: nn.Module):
        self.names = list(model.state_dict().keys())
        self.tensors = [t.detach().to("cpu", copy=True).share_memory_() for t in model.state_dict().values()]
        # [seq, version]: seq is odd while the learner writes
        self.header = torch.zeros(2, dtype=torch.int64).share_memory_()

    @property
    def version(self) -> int:
        # through numpy: a tensor index costs microseconds, and inference workers ask before every batch
        return int(self.header.numpy()[1])

    @torch.no_grad()
    def publish(self, model: nn.Module, version: int) -> None:
        """Copy ``model``'s state in, tagged with ``version`` (learner side)."""
        self.header[0] += 1
        for dst, src in zip(self.tensors, model.state_dict().values()):
            dst.copy_(src, non_blocking=False)
        self.header[1] = version
        self.header[0] += 1

    @torch.no_grad()
    def load_into(self, model: nn.Module, timeout_s: float = 10.0) -> int:
        """Copy the newest consistent weights into ``model`` (inference side); return their version.

        Raises:
            TimeoutError: no consistent copy could be read within ``timeout_s`` (the writer died mid-copy).
        """
        state = list(model.state_dict().values())
        deadline = time.monotonic() + timeout_s
        while True:
            seq = int(self.header[0])
            if seq % 2 == 0:
                version = int(self.header[1])
                for dst, src in zip(state, self.tensors):
                    dst.copy_(src)
                if int(self.header[0]) == seq:
                    return version
            if time.monotonic() > deadline:
                raise TimeoutError("published weights stayed inconsistent: the learner stopped mid-publication")
            time.sleep(0.0001)
