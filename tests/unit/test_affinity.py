"""--set_workers_cpu_affinity: which core each rollout worker is pinned to; the learner's torch threads (the
pinning and niceness themselves, in a child process: tests/integration/test_affinity_processes.py)."""

from __future__ import annotations

import pytest
import torch

from msf.runtime.affinity import (
    LearnerThreadRetune,
    auto_learner_threads,
    learner_threads,
    usable_cores,
    worker_cores,
)


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


@pytest.mark.parametrize(
    "flag, workers, inference, nproc, cores, sync, want",
    [
        (0, 2, 1, 1, 2, False, 1),  # 2 cores, 2 workers + 1 inference worker: none spare, still 1
        (2, 2, 1, 1, 2, False, 2),  # given: taken as is
        (0, 4, 2, 2, 16, False, 5),  # 16 - (4 + 2) = 10 spare, 2 replicas
        (0, 4, 4, 1, 16, False, 8),  # 2 policies x 2 inference workers
        # --async_rl=False: the workers wait while the learner trains, which gets its whole share of the cores
        (0, 2, 1, 1, 2, True, 2),
        (0, 4, 2, 2, 16, True, 8),
        (0, 4, 2, 4, 2, True, 1),  # a share of half a core: still 1
        (1, 2, 1, 1, 2, True, 1),  # given (--deterministic gives 1): taken as is
    ],
)
def test_learner_threads_at_the_start(flag, workers, inference, nproc, cores, sync, want):
    assert learner_threads(flag, workers, inference, nproc, cores, synchronous=sync) == want


@pytest.mark.parametrize(
    "case, args, want",
    [
        # waiting shares measured on 2 cores with 1 learner thread (benchmarks/HISTORY.md, 2026-11-30):
        # atari_pong: workers idle most of the time, learner the bottleneck -> 2 - (2 x 0.12 + 0.24) = 1.52 -> 2
        ("atari_pong", (2.0, 2, 0.88, 1, 0.76, 0.0, 1), 2),
        # doom_basic: busy ViZDoom workers -> 2 - (2 x 0.56 + 0.75) = 0.13 -> 1 (2 threads measured slower)
        ("doom_basic", (2.0, 2, 0.44, 1, 0.25, 0.0, 1), 1),
        # CartPole: the learner waits 75% of the time, it is not the bottleneck: keep what it has
        ("CartPole", (2.0, 2, 0.73, 1, 0.05, 0.75, 1), 1),
        # 16 cores, 2 replicas: a share of 8, 4 + 1 workers each nearly idle -> 8 - 0.5 = 7.5 -> 8 (the share's cap)
        ("16 cores, 2 replicas", (8.0, 4, 0.9, 1, 0.9, 0.0, 3), 8),
        # 2 replicas on 2 cores: a share of 1 core, never more than 1 thread
        ("share of one core", (1.0, 1, 0.95, 1, 0.95, 0.0, 1), 1),
    ],
)
def test_auto_learner_threads_from_measured_waiting(case, args, want):
    assert auto_learner_threads(*args) == want


def test_the_learner_threads_note_says_what_is_true_of_oversubscribed_cores(caplog):
    """16 rollout workers that never wait, on this node's cores: their not-waiting time is 16 process-seconds a
    second, which is not "16.00 of 2.00 cores busy" (the time they wait for a core counts as not waiting)."""
    import logging

    cores = len(usable_cores())
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="msf"):
            LearnerThreadRetune(True, 0.0, 16 * cores, 1, 1)(30.0, [0.0, 0.0, 0.0])
            LearnerThreadRetune(True, 0.0, 1, 1, 1)(30.0, [0.9, 0.8, 0.0])
    finally:
        torch.set_num_threads(before)
    oversubscribed, fits = [r.getMessage() for r in caplog.records if "torch thread(s) from now on" in r.getMessage()]
    assert "cores busy" not in oversubscribed and "the cores are oversubscribed" in oversubscribed, oversubscribed
    assert f"{16 * cores} rollout and 1 inference worker(s) on {cores:.2f} cores" in oversubscribed, oversubscribed
    assert f"the workers kept 0.30 of {cores:.2f} cores busy" in fits, fits


@pytest.mark.parametrize("auto", [True, False])
def test_the_learner_threads_are_retuned_once_30_s_after_the_start_and_only_when_auto(auto):
    cores = len(usable_cores())
    retune = LearnerThreadRetune(auto, start=100.0, rollout_workers=0, inference_workers=0, groups_per_node=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        retune(129.9, [0.0, 0.0, 0.0])  # too early
        assert torch.get_num_threads() == 1
        retune(130.0, [0.0, 0.0, 0.0])  # no worker is busy: the learner takes every core
        assert torch.get_num_threads() == (cores if auto else 1)
        torch.set_num_threads(1)
        retune(200.0, [0.0, 0.0, 0.0])  # once only
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
