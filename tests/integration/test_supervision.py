"""Child processes: the semaphores of what a parent hands to its children, and what a child whose parent was
killed releases."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass

import pytest

from msf.runtime.spawning import (
    CTX,
    START_METHOD,
    parent_alive,
    semaphore_names,
    spawn,
    start_fork_server,
    stop_fork_server,
)


@dataclass(frozen=True)
class _Spec:
    queues: dict
    event: object


def test_semaphore_names_are_those_of_the_queues_and_events_handed_over():
    q, q2, ev = CTX.Queue(), CTX.Queue(), CTX.Event()
    names = semaphore_names(q, _Spec({"a": q2, "b": q}, ev), [ev])
    # a queue is built of 3 semaphores (two locks and its size), an event of 5 (its condition's 4 and its flag)
    assert len(names) == len(set(names)) == 3 + 3 + 5
    assert all(n.startswith("/mp-") for n in names), names


def _orphan(q, ev) -> None:
    parent = multiprocessing.parent_process().pid  # (it may be gone already)
    while parent_alive(parent):
        time.sleep(0.05)


def _parent(report) -> None:
    q, ev, failures = CTX.Queue(), CTX.Event(), CTX.Queue()
    child = spawn(_orphan, "orphan", failures, q, ev)
    report.send((semaphore_names(failures, q, ev), child.pid))
    time.sleep(600)


def _sem_file(name: str) -> str:
    return f"/dev/shm/sem.{name.lstrip('/')}"  # where Linux keeps a named POSIX semaphore


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="named semaphores live in /dev/shm on Linux only")
def test_a_child_whose_parent_was_killed_releases_the_semaphores_handed_to_it():
    """A killed parent never unregisters its semaphores, so multiprocessing's resource tracker reported them as
    leaked at the job's end; the child holds them all and releases them as it exits."""
    r, w = CTX.Pipe(duplex=False)
    parent = CTX.Process(target=_parent, args=(w,))
    parent.start()
    try:
        assert r.poll(60), "the parent did not start its child"
        names, child = r.recv()
        assert len(names) == 3 + 3 + 5
        assert all(os.path.exists(_sem_file(n)) for n in names)
        os.kill(parent.pid, signal.SIGKILL)
        parent.join(10)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                    break
            time.sleep(0.05)
        assert time.monotonic() < deadline, "the orphaned child did not exit"
        assert [n for n in names if os.path.exists(_sem_file(n))] == []
    finally:
        if parent.is_alive():
            parent.kill()


def _report(q, ev) -> None:
    parent = multiprocessing.parent_process().pid
    q.put((os.getppid() == parent, parent_alive(parent), os.environ.get("MSF_TEST_VAR"), dict(os.environ)))


def test_a_child_sees_its_parent_alive_and_the_parents_environment_at_its_start(monkeypatch):
    """Children fork from a fork server, which is not their parent and whose environment is the one it started
    with: a child still knows its parent is alive, and sees the environment as the parent had it at spawn()
    (here a variable set after the fork server started, and none of the server's one-thread settings)."""
    failures, q, ev = CTX.Queue(), CTX.Queue(), CTX.Event()
    spawn(_report, "first", failures, q, ev).join(60)  # the fork server is running from here on
    q.get(timeout=10)
    monkeypatch.setenv("MSF_TEST_VAR", "set after the server started")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    child = spawn(_report, "second", failures, q, ev)
    is_os_parent, alive, var, env = q.get(timeout=60)
    child.join(10)
    assert child.exitcode == 0 and failures.empty()
    assert alive
    assert is_os_parent == (START_METHOD == "spawn")
    assert var == "set after the server started"
    assert env == dict(os.environ)


def _sum_all(q, ev, tensors) -> None:
    q.put(float(sum(t.sum() for t in tensors)))


def test_a_child_handed_more_shared_tensors_than_the_fork_server_passes_still_starts():
    """300 shared tensors are 300 file descriptors, more than the fork server hands a child (~250): that child
    starts with spawn instead, and sees the tensors' values."""
    import torch

    failures, q, ev = CTX.Queue(), CTX.Queue(), CTX.Event()
    tensors = [torch.full((3,), float(i)).share_memory_() for i in range(300)]
    child = spawn(_sum_all, "many", failures, q, ev, tensors)
    assert q.get(timeout=60) == 3.0 * sum(range(300))
    child.join(10)
    assert child.exitcode == 0 and failures.empty()


def _draws(q, ev) -> None:
    import numpy as np
    import torch
    from threadpoolctl import threadpool_info

    blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    q.put((float(np.random.rand()), float(torch.rand(1)), blas))


def test_children_draw_their_own_random_numbers_and_have_the_blas_threads_their_environment_asks_for(monkeypatch):
    """Forked children would share the fork server's numpy and torch generators (every rollout worker's env drew
    the same np.random numbers) and its one BLAS thread: each child seeds them anew and sizes its BLAS pool by
    its environment, as a spawned process does."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    failures, q, ev = CTX.Queue(), CTX.Queue(), CTX.Event()
    children = [spawn(_draws, f"draws{i}", failures, q, ev) for i in range(3)]
    got = [q.get(timeout=60) for _ in children]
    for c in children:
        c.join(10)
    assert len({g[0] for g in got}) == 3 and len({g[1] for g in got}) == 3, got
    assert all(g[2] == [2] for g in got), got  # numpy's OpenBLAS, as OPENBLAS_NUM_THREADS asks


def _nothing(q, ev) -> None:
    q.put(os.getpid())


@pytest.mark.skipif(START_METHOD != "forkserver", reason="no fork server on this platform")
def test_stop_fork_server_reaps_the_server_at_once_and_the_next_child_gets_a_new_one():
    """The fork server exited on its own only after its parent had (up to ~0.6 s after msf-train ended, seen by a
    script that looked for leftover processes). stop_fork_server ends and reaps it before it returns."""
    from multiprocessing import forkserver

    assert start_fork_server()
    failures, q, ev = CTX.Queue(), CTX.Queue(), CTX.Event()
    child = spawn(_nothing, "first", failures, q, ev)
    q.get(timeout=60)
    child.join(10)
    server = forkserver._forkserver._forkserver_pid
    assert server is not None and os.path.exists(f"/proc/{server}")
    stop_fork_server()
    assert not os.path.exists(f"/proc/{server}")  # reaped: not even a zombie is left
    child = spawn(_nothing, "second", failures, q, ev)  # a new server
    q.get(timeout=60)
    child.join(10)
    assert forkserver._forkserver._forkserver_pid not in (None, server)
    stop_fork_server()
