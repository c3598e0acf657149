"""Weights published by a learner to the inference workers of its device group.

A copy of the model's ``state_dict`` (parameters and normaliser buffers) in shared CPU
memory, guarded by a sequence counter (a seqlock): the learner makes the counter odd,
copies, then makes it even again; a reader copies when the counter is even and keeps the
copy only if the counter did not move meanwhile. Neither side ever blocks the other.

Memory ordering: this is correct on x86-64 only because of its total store order: stores become visible
to other cores in program order (the odd counter before the data, the data before the even counter) and
loads are not reordered with other loads (the reader's first counter read before the data, the data before
its second counter read). The 8-byte counter and version are aligned, so each read and write is atomic.
On a weakly ordered CPU (ARM: Grace, Graviton, Apple silicon) either side may be reordered and a reader
could keep a torn copy; it would need a store-store (release) fence in :meth:`PublishedWeights.publish`
after making the counter odd and again between the data copy and the final bump, and load-load (acquire)
fences in :meth:`PublishedWeights.load_into` after the first counter read and before the second: C++'s
``std::atomic_thread_fence(std::memory_order_release / acquire)``, ``dmb ish`` on ARM. Neither torch
nor numpy offers a fence in Python: it would take a few lines of C++ (a torch C++ extension or a ctypes
library calling ``__atomic_thread_fence``), or an uncontended lock (``multiprocessing.Lock``, whose
atomic instructions are full barriers) taken around the counter accesses on both sides.
"""

from __future__ import annotations

import time

import torch
from torch import nn

HEADER_BYTES = 16  # [seq, version], int64
ALIGN = 64  # bytes: every tensor of the block starts on a cache line


def _layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """(The byte offset of each tensor in the shared block, the block's size): the header first, then the
    tensors in order, each at a multiple of :data:`ALIGN`."""
    offsets, end = [], HEADER_BYTES
    for t in tensors:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + t.numel() * t.element_size()
    return offsets, end


class PublishedWeights:
    """Shared-memory weights with a policy version.

    Args:
        model: the model whose ``state_dict`` layout is published (tensors are copied, not aliased).
    """

    def __init__(self, model: nn.Module):
        state = model.state_dict()
        self.names = list(state.keys())
        offsets, total = _layout(list(state.values()))
        # one shared block holds the header and every tensor (views into it): a process it is handed to receives
        # one file descriptor, whatever the model's size (a fork server passes at most ~250 to a child)
        block = torch.zeros(total, dtype=torch.uint8).share_memory_()
        # [seq, version]: seq is odd while the learner writes
        self.header = block[:HEADER_BYTES].view(torch.int64)
        self.tensors = [
            block[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape).copy_(t.detach().cpu())
            for o, t in zip(offsets, state.values())
        ]

    @staticmethod
    def tensor_bytes(model: nn.Module) -> list[int]:
        """The bytes of the shared memory that publishing ``model`` allocates (one block: its state, the header
        and the alignment between them)."""
        return [_layout(list(model.state_dict().values()))[1]]

    @property
    def version(self) -> int:
        # through numpy: a tensor index costs microseconds, and inference workers ask before every batch
        return int(self.header.numpy()[1])

    @torch.no_grad()
    def publish(self, model: nn.Module, version: int) -> None:
        """Copy ``model``'s state in, tagged with ``version`` (learner side).

        The copy is blocking (``non_blocking=False``): a CUDA tensor's bytes have arrived before the counter
        is made even again. (x86 store order: see the module docstring.)"""
        self.header[0] += 1  # odd: readers that start now wait, readers already copying will retry
        for dst, src in zip(self.tensors, model.state_dict().values()):
            dst.copy_(src, non_blocking=False)
        self.header[1] = version
        self.header[0] += 1  # on ARM a release fence is needed before this store (module docstring)

    @torch.no_grad()
    def load_into(self, model: nn.Module, timeout_s: float = 10.0) -> int:
        """Copy the newest consistent weights into ``model`` (inference side); return their version.

        Raises:
            TimeoutError: no consistent copy could be read within ``timeout_s`` (the writer died mid-copy).
        """
        return self._copy_into(list(model.state_dict().values()), timeout_s)

    def snapshot(self, timeout_s: float = 10.0) -> tuple[int, list[torch.Tensor]]:
        """``(version, tensors)``: a consistent copy of the newest weights, in ``state_dict`` order (what a job
        sends its sampler nodes). Raises TimeoutError as :meth:`load_into` does."""
        copies = [torch.empty_like(t) for t in self.tensors]
        return self._copy_into(copies, timeout_s), copies

    @torch.no_grad()
    def _copy_into(self, state: list[torch.Tensor], timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            seq = int(self.header[0])
            if seq % 2 == 0:
                version = int(self.header[1])
                for dst, src in zip(state, self.tensors):
                    dst.copy_(src)
                # unchanged counter: no publication began or ended while we copied (x86 load order; on ARM
                # an acquire fence is needed before this load, see the module docstring)
                if int(self.header[0]) == seq:
                    return version
            if time.monotonic() > deadline:
                raise TimeoutError("published weights stayed inconsistent: the learner stopped mid-publication")
            time.sleep(0.0001)
