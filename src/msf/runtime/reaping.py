"""Watching and ending child processes: the process table, a stop that ends what each child started, the orphans
of a lost device group (this process as their subreaper).

Every child of :func:`msf.runtime.spawning.spawn` leads a process group of its own, so what it started (env
engines) can be found and ended with it, even after the child itself has died.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import AbstractSet, Callable

import torch.multiprocessing as mp

log = logging.getLogger("msf")


class ChildDied(RuntimeError):
    """A child process exited while the run was going on."""


def describe_exit(p: mp.Process) -> str:
    """``"exited with code N"``, ``"was killed by signal SIGSEGV"`` for a negative exit code, or, for a child of
    the fork server that died (multiprocessing then reports exit code 255 for every child it forked: it reads
    their exit codes through the server), that the child was lost with the server (its own exit code unknown)."""
    server = _lost_fork_server(p)
    if server is not None:
        return f"was lost with the workers' fork server (pid {server}), which died"
    if p.exitcode is not None and p.exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-p.exitcode).name}"
        except ValueError:
            return f"was killed by signal {-p.exitcode}"
    return f"exited with code {p.exitcode}"


def _lost_fork_server(p: mp.Process) -> int | None:
    """The pid of the fork server that forked ``p``, when ``p``'s exit code is the 255 that multiprocessing reports
    for a child whose fork server is gone and that server is no longer running (or a zombie); else None."""
    from multiprocessing import forkserver, popen_forkserver

    if p.exitcode != 255 or not isinstance(getattr(p, "_popen", None), popen_forkserver.Popen):
        return None
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return None
    entry = process_entry(pid)
    return None if entry is not None and entry.state != "Z" else pid


def check_children(procs: list[mp.Process]) -> None:
    """Raise :class:`ChildDied` naming the first child that is no longer alive."""
    for p in procs:
        if not p.is_alive():
            raise ChildDied(f"{p.name} (pid {p.pid}) {describe_exit(p)} unexpectedly")


def killed_children(procs: list[mp.Process]) -> list[mp.Process]:
    """The children that have ended by a signal (a crash in native code, the OOM killer): they could not
    report an exception, so another child's report may be only the consequence."""
    return [p for p in procs if not p.is_alive() and p.exitcode is not None and p.exitcode < 0]


STOP_GRACE_S = 5.0
"""How long a stop waits for the children to exit by themselves, from the moment they are asked to close (once the
final checkpoint is written, or there is nothing to save) until :func:`stop_children` or :func:`end_orphans` kills
what is left with what it started. The children were told to stop before that checkpoint and poll the stop event
every 0.5 s; an env whose constructor or ``close`` takes longer than this (a ViZDoom engine at niceness 10 on a
busy machine) is ended by SIGKILL, which loses nothing of the run: its state is saved before."""


@dataclass(frozen=True)
class ProcessEntry:
    """One line of the process table (:func:`process_table`)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str  # "Z": a zombie (dead, not yet reaped)


def process_table() -> list[ProcessEntry]:
    """Every process of this machine, from ``/proc/<pid>/stat`` (empty where there is no ``/proc``)."""
    out: list[ProcessEntry] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for d in names:
        entry = process_entry(int(d)) if d.isdigit() else None
        if entry is not None:
            out.append(entry)
    return out


def process_entry(pid: int) -> ProcessEntry | None:
    """``pid``'s line of the process table, from ``/proc/<pid>/stat`` (None: gone, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        # the command name (2nd field) may hold spaces and parentheses: the fields after it follow the last ")"
        rest = stat[stat.rindex(")") + 2 :].split()
        return ProcessEntry(pid, int(rest[1]), int(rest[2]), int(rest[3]), rest[0])
    except (OSError, ValueError, IndexError):  # gone meanwhile
        return None


def command_line(pid: int) -> list[str]:
    """The arguments ``pid`` was started with (empty when it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def group_members(pgids: set[int]) -> list[ProcessEntry]:
    """The processes of this session (zombies included) whose process group is one of ``pgids``: what children
    that lead their own groups (:func:`~msf.runtime.spawning.spawn`) started, even after the child itself has
    died. (A pid is not reused while a process group of that number has members, and the session check keeps
    other sessions' processes out if the number was reused since.)"""
    if not pgids:
        return []
    sid = os.getsid(0)
    return [e for e in process_table() if e.pgid in pgids and e.sid == sid]


def end_groups(
    pgids: set[int], seen: dict[int, list[str]], managed: AbstractSet[int] = frozenset(), timeout_s: float = 5.0
) -> None:
    """SIGKILL every live member of the process groups ``pgids`` (:func:`group_members`) until none is left
    (at most ``timeout_s``); add each one's command line to ``seen`` (pid -> arguments) first, so that what
    it leaves behind can be found (:func:`msf.envs.families.remove_engine_files`). Members that became this
    process's children (orphans, when it is a subreaper: :func:`become_subreaper`) are reaped, except those in
    ``managed`` (``multiprocessing`` children: their ``Process`` object reaps them)."""
    deadline = time.monotonic() + timeout_s
    me = os.getpid()
    left: list[ProcessEntry] = []
    while time.monotonic() < deadline:
        members = group_members(pgids)
        left = [e for e in members if e.state != "Z"]
        zombies = [e for e in members if e.state == "Z" and e.ppid == me and e.pid not in managed]
        if not left and not zombies:
            return
        for e in left:
            if e.pid not in seen:
                seen[e.pid] = command_line(e.pid)
            _kill(e.pid)
        for e in zombies:
            _reap(e.pid)
        time.sleep(0.05)
    if left:
        log.warning("processes %s could not be ended", [e.pid for e in left])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:  # not our child, or reaped already
        pass


def stop_children(
    procs: list[mp.Process], timeout_s: float = STOP_GRACE_S, describe: Callable[[mp.Process], str] | None = None
) -> dict[int, list[str]]:
    """Wait up to ``timeout_s`` for the children to exit by themselves (they have been told to stop), then end
    what is left: each child's whole process group (:func:`~msf.runtime.spawning.spawn`), so that the processes a
    child started (env engines) go with it, also those of a child that died earlier. The children that had to be
    killed are named in one log line, each by ``describe(p)`` (default: its name and pid).

    Returns:
        pid -> command line of every process that had to be killed besides the children (engines: what they
        leave in /dev/shm can be found from it).
    """
    deadline = time.monotonic() + timeout_s
    while alive := [p for p in procs if p.is_alive()]:
        if (left := deadline - time.monotonic()) <= 0:
            break
        wait([p.sentinel for p in alive], timeout=min(0.5, left))
    if alive:
        named = describe or (lambda p: f"{p.name} (pid {p.pid})")
        log.warning(
            "%s did not stop within %.0f s: killed, with the processes they started",
            ", ".join(map(named, alive)),
            timeout_s,
        )
    own = {p.pid for p in procs if p.pid is not None and _leads_group(p.pid)}
    seen: dict[int, list[str]] = {}
    for p in alive:
        if p.pid not in own:
            p.kill()
    end_groups(own, seen, managed={p.pid for p in procs if p.pid is not None})
    for p in procs:
        p.join(5.0)
    return {pid: args for pid, args in seen.items() if pid not in {p.pid for p in procs}}


def _leads_group(pid: int) -> bool:
    """``pid`` (one of our children, alive or a zombie, or dead and reaped) was started by
    :func:`~msf.runtime.spawning.spawn`, which makes every child a group leader; True when its group is its own
    (or it can no longer be asked: then the group, if it still has members, is still the child's, since the
    number stays taken while it has any)."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return True


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper(on: bool = True) -> bool:
    """Make this process the subreaper of its descendants (Linux 3.4+; ``on=False``: no longer): one whose parent
    dies is re-parented to this process instead of init, so it stays within reach of :func:`end_orphans`. The
    node launcher does this while its device groups run: the rollout workers and env engines of one that was
    killed come back to it.

    Returns:
        True when the kernel accepted it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_now() -> set[int]:
    """The pids of this process's children at this moment (from the process table)."""
    me = os.getpid()
    return {e.pid for e in process_table() if e.ppid == me}


def managed_children() -> set[int]:
    """The pids of this process's children that something else reaps: ``multiprocessing``'s processes (their
    ``Process`` objects) and its resource tracker."""
    import multiprocessing
    from multiprocessing import process, resource_tracker

    pids = {p.pid for p in process._children if p.pid is not None}  # type: ignore[attr-defined]
    pids |= {p.pid for p in multiprocessing.active_children()}
    tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
    return pids | ({tracker} if tracker else set())


def end_orphans(timeout_s: float, keep: AbstractSet[int] = frozenset()) -> dict[int, list[str]]:
    """End what was re-parented to this subreaper (:func:`become_subreaper`): its children other than
    :func:`managed_children` and ``keep`` (those it had before it started the device groups: see
    :func:`children_now`), such as the rollout workers of a device group that was killed, and their engines.
    Wait up to ``timeout_s`` for them to exit by themselves (a rollout worker notices within 0.5 s that its
    parent is gone, and closes its envs), then SIGKILL them with their process groups; reap them.

    Returns:
        pid -> command line of every process that had to be killed (see :func:`stop_children`).
    """
    me, own_group = os.getpid(), os.getpgid(0)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    groups: set[int] = set()
    noted = False
    while True:
        managed = managed_children() | keep
        orphans = [e for e in process_table() if e.ppid == me and e.pid not in managed]
        for e in orphans:
            if e.state == "Z":
                _reap(e.pid)
        live = [e for e in orphans if e.state != "Z"]
        groups |= {e.pgid for e in orphans if e.pgid != own_group}
        if not live or time.monotonic() >= deadline:
            break
        # noted only after 2 s: the fork servers of ranks that ended cleanly are re-parented here and exit
        # within about a second by themselves
        if not noted and time.monotonic() - t0 >= 2.0:
            noted = True
            log.info(
                "waiting up to %.0f s more for %d process(es) of a lost device group to stop",
                deadline - time.monotonic(),
                len(live),
            )
        time.sleep(0.2)
    seen: dict[int, list[str]] = {}
    if live:
        log.warning("processes %s of a lost device group did not stop: killed", [e.pid for e in live])
    for e in live:
        if e.pgid == own_group:  # not one of our group leaders: only this process
            seen[e.pid] = command_line(e.pid)
            _kill(e.pid)
    end_groups(groups, seen, managed_children() | keep)
    deadline = time.monotonic() + 2.0
    while live and time.monotonic() < deadline:  # reap the ones killed above (those in our own group)
        for e in live:
            _reap(e.pid)
        live = [e for e in live if os.path.exists(f"/proc/{e.pid}")]
        time.sleep(0.05)
    return seen
