"""Starting and watching child processes.

Every child is started one way, :func:`spawn` (the ``spawn`` start method: no inherited
locks or CUDA state). A child ignores SIGINT (a Ctrl-C reaches the whole process group;
only the main process decides how to stop), reports an exception as a
:class:`~msf.sampling.messages.ComponentFailure` on the failure queue, and exits non-zero.
"""

from __future__ import annotations

import logging
import os
import signal
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from msf.sampling.messages import ComponentFailure

CTX = mp.get_context("spawn")
log = logging.getLogger("msf")


def _child_main(target: Callable[..., None], name: str, failures: Any, log_level: int, args: tuple) -> None:
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


def spawn(target: Callable[..., None], name: str, failures: Any, *args: Any) -> mp.Process:
    """Start ``target(*args)`` in a new process named ``name`` and return it (already started)."""
    p = CTX.Process(target=_child_main, args=(target, name, failures, log.getEffectiveLevel(), args),
                    name=name, daemon=True)
    p.start()
    return p


def parent_alive(parent_pid: int) -> bool:
    """True while the process that started us is still our parent."""
    return os.getppid() == parent_pid


class ChildDied(RuntimeError):
    """A child process exited while the run was going on."""


def check_children(procs: list[mp.Process]) -> None:
    """Raise :class:`ChildDied` naming the first child that is no longer alive."""
    for p in procs:
        if not p.is_alive():
            raise ChildDied(f"{p.name} (pid {p.pid}) exited unexpectedly with code {p.exitcode}")


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
