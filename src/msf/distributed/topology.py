"""Who is who in a training job: global rank, local rank, world size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    """One device group's place in the job.

    ``rank = node_rank * nproc_per_node + local_rank``; ``world_size = nnodes * nproc_per_node``.
    The global rank and the local rank are kept apart: the local rank picks the device on
    this node, the global rank decides who writes files (rank 0) and seeds environments.
    """

    rank: int = 0
    local_rank: int = 0
    nproc_per_node: int = 1
    node_rank: int = 0
    nnodes: int = 1

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def split_evenly(total: int, parts: int, index: int) -> int:
    """How many of ``total`` items part ``index`` of ``parts`` gets (the first parts get the remainder)."""
    return total // parts + (1 if index < total % parts else 0)
