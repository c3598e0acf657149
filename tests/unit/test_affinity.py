"""--set_workers_cpu_affinity: which core each rollout worker is pinned to, and the pinning itself."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from msf.sampling.affinity import pin_this_process, usable_cores, worker_cores


def test_workers_spread_evenly_are_pinned_round_robin():
    cores = [0, 1, 2, 3]
    assert [worker_cores(i, 4, cores) for i in range(4)] == [[0], [1], [2], [3]]
    assert [worker_cores(i, 8, cores) for i in range(8)] == [[0], [1], [2], [3], [0], [1], [2], [3]]
    assert [worker_cores(i, 2, cores) for i in range(2)] == [[0], [1]]  # fewer workers than cores
    # the cores this process may use, not 0..n-1 (e.g. under taskset or a Slurm allocation)
    assert [worker_cores(i, 4, [4, 6]) for i in range(4)] == [[4], [6], [4], [6]]


def test_uneven_spread_pins_nobody():
    # 6 workers on 4 cores: two cores would carry two workers and two cores one
    assert all(worker_cores(i, 6, [0, 1, 2, 3]) is None for i in range(6))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="outside"):
        worker_cores(4, 4, [0, 1])
    with pytest.raises(ValueError, match="no CPU cores"):
        worker_cores(0, 1, [])


def _child(core: int, q) -> None:
    q.put(pin_this_process([core]))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity on this platform")
def test_pinning_restricts_the_process_as_the_os_reports_it():
    core = usable_cores()[-1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(core, q))
    p.start()
    assert q.get(timeout=60) == [core]
    p.join(30)
    assert pin_this_process(None) is None
