"""Child processes: the semaphores of what a parent hands to its children, and what a child whose parent was
killed releases."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass

import pytest

from msf.runtime.supervision import CTX, semaphore_names, spawn


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
    parent = multiprocessing.parent_process().pid  # (it may be gone already: this child imports for seconds)
    while os.getppid() == parent:
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
