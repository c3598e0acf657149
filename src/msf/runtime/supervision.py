"""Starting and watching child processes.

Every child is started one way, :func:`spawn` (the ``spawn`` start method: no inherited
locks or CUDA state). A child ignores SIGINT (a Ctrl-C reaches the whole process group;
only the main process decides how to stop), reports an exception as a
:class:`ComponentFailure` on the failure queue, and exits non-zero.
"""

from __future__ import annotations

import logging
import os
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any, Callable

import torch.multiprocessing as mp

CTX = mp.get_context("spawn")
log = logging.getLogger("msf")


@dataclass
class ComponentFailure:
    """Any child process -> main process: the component failed with this traceback."""

    component: str
    pid: int
    traceback: str


def _child_main(target: Callable[..., None], name: str, failures: Queue, log_level: int, args: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"[%(asctime)s][{name}][pid {os.getpid()}] %(message)s")
    try:
        target(*args)
    except BaseException:  # noqa: BLE001 - the whole point is to report anything
        tb = traceback.format_exc()
        try:
            failures.put(ComponentFailure(name, os.getpid(), tb))
            # put() hands the message to a feeder thread: flush it before _exit kills that thread
            failures.close()
            failures.join_thread()
        finally:
            os._exit(1)


def spawn(target: Callable[..., None], name: str, failures: Queue, *args: Any) -> mp.Process:
    """Start ``target(*args)`` in a new process named ``name`` and return it (already started).

    ``args`` are pickled once, as the process starts (so queues, pipes and shared tensors may be among them,
    at any depth); ``failures`` (a queue of ``CTX``) receives a :class:`ComponentFailure` if ``target``
    raises."""
    p = CTX.Process(
        target=_child_main, args=(target, name, failures, log.getEffectiveLevel(), args), name=name, daemon=True
    )
    use_quiet_executable()
    p.start()
    return p


_QUIET: list[str] = []


def use_quiet_executable() -> None:
    """Start spawned children through a two-line ``sh`` script that ignores SIGINT and then runs this Python.

    An ignored signal stays ignored across ``exec``, and Python then leaves it so: a child ignores a Ctrl-C
    (which a terminal sends to the whole process group) from its first instruction, not only once
    :func:`_child_main` runs. Its imports take seconds on a busy machine; a Ctrl-C then printed a
    ``KeyboardInterrupt`` traceback per child. The main process keeps its own handler all along, so it never
    misses the Ctrl-C. Without ``/bin/sh`` nothing changes.
    """
    if _QUIET or not os.path.exists("/bin/sh"):
        return
    import hashlib
    import shlex
    import sys
    import tempfile

    text = f"#!/bin/sh\ntrap '' INT\nexec {shlex.quote(sys.executable)} \"$@\"\n"
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"msf-python-{os.getuid()}-{digest}.sh")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    CTX.set_executable(path)
    _QUIET.append(path)


def parent_alive(parent_pid: int | None) -> bool:
    """True while the process that started us is still our parent (``parent_pid`` None: there is no parent
    to watch, a component driven in the main process: always True)."""
    return parent_pid is None or os.getppid() == parent_pid


class ChildDied(RuntimeError):
    """A child process exited while the run was going on."""


def describe_exit(p: mp.Process) -> str:
    """``"exited with code N"``, or ``"was killed by signal SIGSEGV"`` for a negative exit code."""
    if p.exitcode is not None and p.exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-p.exitcode).name}"
        except ValueError:
            return f"was killed by signal {-p.exitcode}"
    return f"exited with code {p.exitcode}"


def check_children(procs: list[mp.Process]) -> None:
    """Raise :class:`ChildDied` naming the first child that is no longer alive."""
    for p in procs:
        if not p.is_alive():
            raise ChildDied(f"{p.name} (pid {p.pid}) {describe_exit(p)} unexpectedly")


def killed_children(procs: list[mp.Process]) -> list[mp.Process]:
    """The children that have ended by a signal (a crash in native code, the OOM killer): they could not
    report an exception, so another child's report may be only the consequence."""
    return [p for p in procs if not p.is_alive() and p.exitcode is not None and p.exitcode < 0]


def stop_children(procs: list[mp.Process], timeout_s: float = 5.0) -> None:
    """Join children; terminate, then kill, those still alive after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
