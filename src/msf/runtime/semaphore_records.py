"""The named semaphores of a run that was killed, removed by the next run.

Under the forkserver and spawn start methods every ``multiprocessing`` queue, event and lock is built of named
POSIX semaphores (``/dev/shm/sem.mp-...`` on Linux). CPython unlinks them at the end through its resource tracker,
which dies with the run when the whole process group is killed (``kill -9``, the OOM killer): the files stay until
the machine restarts. So each process that makes them writes their names to ``/dev/shm/msf-semaphores.<pid>``
(:func:`record_semaphores`; the first line: the process's start time, against the reuse of its pid), removed at
its exit; :func:`remove_dead_runs_semaphores`, at the start of every run, unlinks the semaphores listed by the
records of processes that are gone, and the records. Semaphores removed under a running run (systemd-logind's
``RemoveIPC`` at a logout, a user's ``rm``) do not stop it; at its exit :func:`forget_removed_semaphores` says so in
one line, where multiprocessing's clean-up would print a traceback and a warning for each.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any

SHM = "/dev/shm"
PREFIX = "msf-semaphores."


def start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from /proc); None: there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22; the fields after the name start at 3
    except (OSError, IndexError):
        return None


def record_semaphores(*objs: Any) -> None:
    """Add the names of the semaphores of the queues, events and locks in ``objs`` (see
    :func:`msf.runtime.spawning.semaphore_names`) to this process's record, which its exit removes."""
    from msf.runtime.spawning import semaphore_names

    names = semaphore_names(*objs)
    pid = os.getpid()
    path = os.path.join(SHM, f"{PREFIX}{pid}")
    if not names or not os.path.isdir(SHM) or start_time(pid) is None:  # not Linux: no semaphore files
        return
    new = not os.path.exists(path)
    try:
        with open(path, "a") as f:
            f.write("".join(f"{n}\n" for n in ([start_time(pid)] if new else []) + names))
    except OSError:
        return
    if new:
        atexit.register(_at_exit, path, pid)  # before multiprocessing's clean-up (atexit runs the last first)


def _at_exit(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child
        forget_removed_semaphores()
        _unlink(path)


def release_recorded_semaphores() -> None:
    """Before an exit that skips the clean-up at exit (``os._exit``): unlink the semaphores of this process's
    record, take them off the resource tracker's list (which would report them as leaked) and remove the record."""
    from msf.runtime.spawning import release_named_semaphores

    path = os.path.join(SHM, f"{PREFIX}{os.getpid()}")
    try:
        with open(path) as f:
            release_named_semaphores(f.read().split()[1:])
    except OSError:  # no record
        return
    _unlink(path)


def forget_removed_semaphores() -> None:
    """The semaphores this process made whose files were removed while it ran: log one line, and take them off
    multiprocessing's clean-up (the finalizer that would unlink each, the resource tracker's list), which would
    print a traceback and a warning for each."""
    from multiprocessing import resource_tracker, synchronize, util

    cleanup = synchronize.SemLock._cleanup  # type: ignore[attr-defined]  # a private static method
    pending = [f for f in list(util._finalizer_registry.values()) if f._callback is cleanup]  # type: ignore[attr-defined]
    removed = [f for f in pending if not os.path.exists(os.path.join(SHM, f"sem.{str(f._args[0]).lstrip('/')}"))]
    for f in removed:
        name = f._args[0]
        f.cancel()
        resource_tracker.unregister(name, "semaphore")
    if removed:
        logging.getLogger("msf").warning(
            "%d of this run's semaphores (%s/sem.mp-*) were removed while it ran (systemd-logind's RemoveIPC at a "
            "logout, or an rm); training went on with them",
            len(removed),
            SHM,
        )


def remove_dead_runs_semaphores() -> None:
    """Unlink the semaphores recorded by this user's processes that are gone (killed before their clean-up) and
    remove their records; log one line when there were any."""
    try:
        entries = [e for e in os.listdir(SHM) if e.startswith(PREFIX) and e[len(PREFIX) :].isdigit()]
    except OSError:
        return
    removed, pids = 0, list[int]()
    for e in sorted(entries):
        path, pid = os.path.join(SHM, e), int(e[len(PREFIX) :])
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            with open(path) as f:
                lines = f.read().split()
        except OSError:
            continue
        if lines and start_time(pid) == lines[0]:
            continue  # alive
        gone = sum(_unlink(os.path.join(SHM, f"sem.{name.lstrip('/')}")) for name in lines[1:])
        _unlink(path)
        if gone:
            removed, pids = removed + gone, [*pids, pid]
    if removed:
        logging.getLogger("msf").info(
            "removed %d semaphores of dead msf runs (pids %s) from %s", removed, ", ".join(map(str, pids)), SHM
        )


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except OSError:  # another run removed it first
        return False
    return True
