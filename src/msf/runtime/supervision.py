"""Starting, watching and ending child processes.

Every child is started one way, :func:`spawn`: forked from a fork server (the ``forkserver`` start
method, ``spawn`` where the platform has none or the temp folder's path is too long for its socket)
that imported torch and the worker modules once, before any thread, lock or CUDA state existed, so a
child starts in milliseconds instead of importing torch anew (~2 s of a core each: a 2,048-step run
with 16 rollout workers on 2 cores took 26.5 s from the command with ``spawn``, 6.0 s from the fork
server; ``benchmarks/startup.py``). A child starts as a spawned one would: its parent's environment
variables as they are when it is started, random generators of its own, BLAS thread pools as its
environment asks. It ignores SIGINT, SIGTERM, SIGHUP and SIGUSR1 (only the main process decides how to stop and when
to checkpoint), leads a process
group of its own (so whatever it starts, such as ViZDoom's engine processes, can be ended with it:
:func:`stop_children`), watches its parent through multiprocessing's parent sentinel
(:func:`parent_alive`), reports an exception as a :class:`ComponentFailure` on the failure queue,
and exits non-zero.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import select
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.queues import Queue
from typing import Any, Callable

import torch.multiprocessing as mp

from msf import CHECKPOINT_SIGNAL, LOG_DATEFMT
from msf.runtime.registrations import restore, snapshot

START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
CTX = mp.get_context(START_METHOD)
# what the fork server imports once, so that its children do not: torch, numpy, gymnasium and msf's workers
# (first, msf.runtime.fork_server_signals: the server ignores SIGTERM, which a stop sends to the whole process group)
CTX.set_forkserver_preload(
    ["msf.runtime.fork_server_signals", "msf.sampling.rollout_worker", "msf.sampling.inference_worker"]
)
# libraries that start threads when they are imported (numpy's OpenBLAS: one per core), kept to one thread in
# the fork server, so that it forks from a process with no other thread (a fork copies only the forking thread)
_SERVER_ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
log = logging.getLogger("msf")


@dataclass
class ComponentFailure:
    """Any child process -> main process: the component failed with this traceback."""

    component: str
    pid: int
    traceback: str


def _child_main(
    target: Callable[..., None],
    name: str,
    failures: Queue,
    log_level: int,
    args: tuple,
    registered: Any = None,
    environ: dict[str, str] | None = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM too: a stop's SIGTERM reaches every process of a job where the job's manager signals them all
    # (Slurm's scancel with its cgroup process tracking, systemd's control-group kill), and a worker that died of
    # it failed the clean stop that the same signal asked of the main process. msf never ends a child by SIGTERM
    # (it tells it to stop, then kills its group: stop_children), and an orphan ends itself (parent_alive).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # and SIGHUP (a closed terminal, an ssh session that dropped: the stop is the main process's to make)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # and SIGUSR1, msf-train's "checkpoint now" (Slurm's --signal=USR1@60 reaches every process of a job step;
    # its default action would end this one)
    signal.signal(CHECKPOINT_SIGNAL, signal.SIG_IGN)
    _as_a_fresh_process(environ or {})  # (for a spawned child: what it has already)
    if environ is not None:  # the parent's, as it was at spawn() (the fork server's is as it was when it started;
        os.environ.clear()  # and threadpoolctl's import above adds a variable)
        os.environ.update(environ)
    _lead_own_process_group()
    logging.basicConfig(
        level=log_level, format=f"[%(asctime)s][{name}][pid {os.getpid()}] %(message)s", datefmt=LOG_DATEFMT
    )
    try:
        restore(registered)  # the parent's registrations (envs, encoders), before anything looks them up
        target(*args)
    except BaseException:  # noqa: BLE001 - the whole point is to report anything
        tb = traceback.format_exc()
        try:
            failures.put(ComponentFailure(name, os.getpid(), tb))
            # put() hands the message to a feeder thread: flush it before _exit kills that thread
            failures.close()
            failures.join_thread()
        finally:
            _release_if_orphaned(failures, args)
            os._exit(1)
    _release_if_orphaned(failures, args)


def _as_a_fresh_process(environ: dict[str, str]) -> None:
    """What a forked child does to start as a spawned one would: global random generators seeded anew (numpy's
    and torch's; Python's ``random`` reseeds itself after a fork), else every worker would draw the fork server's
    numbers (an env that uses ``np.random`` did the same in every worker), and BLAS thread pools (numpy's
    OpenBLAS, which the fork server started with one thread) as large as ``environ`` or the cores make them."""
    import numpy as np
    import torch

    np.random.seed()  # from the OS's entropy, as numpy seeds itself at import
    torch.seed()
    threads = environ.get("OPENBLAS_NUM_THREADS") or environ.get("OMP_NUM_THREADS") or ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = int(threads) if threads.isdigit() and int(threads) > 0 else cores
    if n > 1:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")


def _release_if_orphaned(*handed: Any) -> None:
    """When the process that spawned this child is gone (killed: SIGKILL, the OOM killer, a second Ctrl-C's
    ``os._exit``), release the semaphores of the queues and events it handed to this child.

    The parent created them, and multiprocessing's resource tracker (one per job: the node launcher, its ranks
    and their workers share it) keeps their names until the parent unregisters them, which a killed parent
    never does. At the job's end the tracker then removed them itself, with "resource_tracker: There appear to
    be 17 leaked semaphore objects to clean up at shutdown" (a killed device group's four queues and its stop
    event). Its children outlive it by the 0.5 s between their checks of the parent, and between them they hold
    every one of those semaphores; the first to unlink a name also takes it off the tracker's list.
    """
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        release_semaphores(*handed)


def release_semaphores(*objs: Any) -> None:
    """Unlink the named semaphores of the ``multiprocessing`` queues and events in ``objs`` (at any depth of
    dataclasses, lists, tuples and dicts) and take them off the resource tracker's list, so that the tracker
    does not report them as leaked. A name already unlinked (by another process) is left alone."""
    from _multiprocessing import sem_unlink
    from multiprocessing import resource_tracker

    for name in semaphore_names(*objs):
        try:
            sem_unlink(name)
        except OSError:  # FileNotFoundError: another process released it
            continue
        resource_tracker.unregister(name, "semaphore")


def semaphore_names(*objs: Any) -> list[str]:
    """The names of the semaphores that the ``multiprocessing`` queues, events, conditions and locks in ``objs``
    are built of, found through dataclasses, lists, tuples and dicts (nothing else is entered)."""
    from multiprocessing.queues import SimpleQueue
    from multiprocessing.synchronize import Condition, Event, SemLock

    names: list[str] = []
    seen: set[int] = set()
    todo = list(objs)
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, SemLock):
            name = getattr(o._semlock, "name", None)
            if name:
                names.append(name)
        elif isinstance(o, (Queue, SimpleQueue, Event, Condition)):
            todo.extend(vars(o).values())
        elif isinstance(o, dict):
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo.extend(o)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            todo.extend(getattr(o, f.name) for f in dataclasses.fields(o))
    return names


def _lead_own_process_group() -> None:
    """Make this child the leader of a process group of its own, before it starts anything.

    The processes it starts join that group (ViZDoom's engines: one per env, started by the env's controller in
    the rollout worker). When the worker dies before it closed its envs (killed at the end of a stop budget; a
    crash), its engines are orphaned, and they wait for ever on their message
    queue (they catch SIGTERM, but act on it only between game tics): 43 of them were left behind by one run.
    Their group outlives the worker, so :func:`stop_children` ends them by it. The group also keeps a
    terminal's Ctrl-C (sent to the foreground group) away from the engines, which exit on SIGINT: a Ctrl-C
    meant as a clean stop ended every engine, and the next step of each env raised ("Controlled ViZDoom
    instance exited unexpectedly").
    """
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted (a session leader): the child stays in its parent's group
        pass


def spawn(target: Callable[..., None], name: str, failures: Queue, *args: Any) -> mp.Process:
    """Start ``target(*args)`` in a new process named ``name`` and return it (already started).

    ``args`` are pickled once, as the process starts (so queues, pipes and shared tensors may be among them,
    at any depth); ``failures`` (a queue of ``CTX``) receives a :class:`ComponentFailure` if ``target``
    raises. A child handed more shared tensors (file descriptors) than the fork server can pass (~250; a
    block with views into it counts once) is started with ``spawn`` instead, and imports torch itself."""
    child_args = (target, name, failures, log.getEffectiveLevel(), args, snapshot(), dict(os.environ))
    use_quiet_executable()
    forked = start_fork_server()
    p = (CTX if forked else mp.get_context("spawn")).Process(
        target=_child_main, args=child_args, name=name, daemon=True
    )
    try:
        p.start()
    except ValueError as e:  # the fork server hands a child at most ~250 file descriptors (one per shared tensor)
        if not forked or "too many fds" not in str(e):
            raise
        log.info("%s is handed more shared tensors than the fork server can pass: it is started with spawn", name)
        p = mp.get_context("spawn").Process(target=_child_main, args=child_args, name=name, daemon=True)
        p.start()
    return p


_FITS: list[bool] = []


def _fork_server_fits() -> bool:
    """Whether the fork server's socket path fits: it listens on a Unix socket in multiprocessing's folder of the
    temp folder (``<TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX``), and such a path has at most 107 bytes. With a
    longer temp folder (a cluster job's ``TMPDIR``) every child failed to start ("AF_UNIX path too long"); the
    workers are then started with ``spawn``, and the log says so once."""
    if not _FITS:
        from multiprocessing import util

        folder = util.get_temp_dir()
        size = len(os.fsencode(folder))
        _FITS.append(size + len("/listener-xxxxxxxx") <= 107)
        if not _FITS[0]:
            log.warning(
                "the path of multiprocessing's temp folder %s (%d bytes, at most 89 fit) is too long for the "
                "workers' fork server's socket: the workers are started with spawn and each imports torch itself "
                "(a slower start; a shorter TMPDIR avoids it)",
                folder,
                size,
            )
    return _FITS[0]


def start_fork_server() -> bool:
    """Start the fork server now, if this process has none running (with the ``forkserver`` start method; it does
    not wait for the server's imports, which run while this process goes on: a device group calls it before it
    makes its learners, the first :func:`spawn` otherwise), with
    :data:`_SERVER_ONE_THREAD` set to 1 in its environment only: it imports numpy (whose OpenBLAS would start a
    thread per core) and forks every child, and a fork from a process with other threads may leave a lock held
    by a thread that the child does not have. Children restore their parent's variables (:func:`_child_main`);
    what the fork server imported keeps one BLAS thread until a child sizes its own (:func:`_as_a_fresh_process`).

    Returns:
        True when children are forked from the fork server; False when they are to be spawned (no fork server
        on this platform, or :func:`_fork_server_fits` says its socket cannot be made)."""
    if START_METHOD != "forkserver" or not _fork_server_fits():
        return False
    from multiprocessing import forkserver

    saved = {k: os.environ.get(k) for k in _SERVER_ONE_THREAD}
    os.environ.update({k: "1" for k in _SERVER_ONE_THREAD})
    try:
        forkserver.ensure_running()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return True


_QUIET: list[str] = []


def use_quiet_executable() -> None:
    """Start spawned children through a two-line ``sh`` script that ignores SIGINT, SIGHUP and SIGUSR1 and then
    runs this Python.

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

    ignored = f"INT HUP {signal.Signals(CHECKPOINT_SIGNAL).name[3:]}"  # sh names signals without "SIG"
    text = f"#!/bin/sh\ntrap '' {ignored}\nexec {shlex.quote(sys.executable)} \"$@\"\n"
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


_PARENT_POLL: list[select.poll] = []


def parent_alive(parent_pid: int | None) -> bool:
    """True while the process that started us is alive (``parent_pid`` None: there is no parent to watch, a
    component driven in the main process: always True).

    A child of :func:`spawn` asks multiprocessing's parent sentinel, a pipe whose other end only the parent holds:
    it reads as closed once the parent is gone, however it died (a child of the fork server has that server, not
    the process that started it, for its OS parent). One ``poll`` system call, without waiting. Elsewhere (a
    process not started by multiprocessing) the OS parent must still be ``parent_pid``."""
    if parent_pid is None:
        return True
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid != parent_pid:
        return os.getppid() == parent_pid
    if not _PARENT_POLL:
        poller = select.poll()
        poller.register(parent.sentinel, select.POLLIN | select.POLLHUP)
        _PARENT_POLL.append(poller)
    return not _PARENT_POLL[0].poll(0)


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


def stop_fork_server(timeout_s: float = 5.0) -> None:
    """End this process's fork server, if it runs one, and wait up to ``timeout_s`` for it to exit (then kill it).

    The server exits by itself once its parent's end of its alive pipe closes, but only after the parent has
    exited: up to ~0.6 s after ``msf-train`` had ended, a script that looked for leftover processes (the next
    step of a batch job) found it. Call this once the children have stopped (:func:`stop_children`); the next
    :func:`spawn` starts a new server. It uses multiprocessing's record of the server (``_forkserver_pid``,
    ``_forkserver_alive_fd``, ``_forkserver_address``), as ``ForkServer._stop`` does, with a bounded wait instead of
    its unbounded ``waitpid``; where that record is not there (another Python), it does nothing."""
    from multiprocessing import forkserver, util

    server = getattr(forkserver, "_forkserver", None)
    pid, fd = getattr(server, "_forkserver_pid", None), getattr(server, "_forkserver_alive_fd", None)
    if pid is None or fd is None:
        return
    os.close(fd)
    server._forkserver_alive_fd = None
    deadline = time.monotonic() + timeout_s
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() >= deadline:
                log.warning("the workers' fork server (pid %d) did not exit within %.0f s: killed", pid, timeout_s)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    except ChildProcessError:  # reaped already
        pass
    server._forkserver_pid = None
    address = getattr(server, "_forkserver_address", None)
    if address and not util.is_abstract_socket_namespace(address):
        try:
            os.unlink(address)
        except OSError:
            pass
    server._forkserver_address = None


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


def stop_budget_s(envs_per_child: int) -> float:
    """How long :func:`stop_children` waits for children that close ``envs_per_child`` envs each before it
    kills them: 10 s, plus 3 s per env (a ViZDoom engine's exit is a round trip with a process that runs at
    niceness 10 on an oversubscribed machine; the envs of one worker are closed one after the other)."""
    return 10.0 + 3.0 * max(0, envs_per_child)


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
    out = []
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
    that lead their own groups (:func:`spawn`) started, even after the child itself has died. (A pid is not
    reused while a process group of that number has members, and the session check keeps other sessions'
    processes out if the number was reused since.)"""
    if not pgids:
        return []
    sid = os.getsid(0)
    return [e for e in process_table() if e.pgid in pgids and e.sid == sid]


def end_groups(
    pgids: set[int], seen: dict[int, list[str]], managed: set[int] = frozenset(), timeout_s: float = 5.0
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


def stop_children(procs: list[mp.Process], timeout_s: float = 5.0, slow_note_s: float = 5.0) -> dict[int, list[str]]:
    """Wait up to ``timeout_s`` for the children to exit by themselves (they have been told to stop), then end
    what is left: each child's whole process group (:func:`_lead_own_process_group`), so that the processes a
    child started (env engines) go with it, also those of a child that died earlier. After ``slow_note_s`` the
    log says who is still stopping; a child that had to be killed is named.

    Returns:
        pid -> command line of every process that had to be killed besides the children (engines: what they
        leave in /dev/shm can be found from it).
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    noted = False
    while True:
        alive = [p for p in procs if p.is_alive()]
        now = time.monotonic()
        if not alive or now >= deadline:
            break
        if not noted and now - t0 >= slow_note_s:
            noted = True
            log.info(
                "waiting up to %.0f s more for %s to stop (closing their environments)",
                deadline - now,
                ", ".join(p.name for p in alive),
            )
        wait([p.sentinel for p in alive], timeout=min(0.5, deadline - now))
    if alive:
        log.warning(
            "%s did not stop within %.0f s: killed, with the processes they started",
            ", ".join(f"{p.name} (pid {p.pid})" for p in alive),
            timeout_s,
        )
    own = {p.pid for p in procs if p.pid is not None and _leads_group(p.pid)}
    seen: dict[int, list[str]] = {}
    for p in alive:
        if p.pid not in own:
            p.kill()
    end_groups(own, seen, managed={p.pid for p in procs})
    for p in procs:
        p.join(5.0)
    return {pid: args for pid, args in seen.items() if pid not in {p.pid for p in procs}}


def _leads_group(pid: int) -> bool:
    """``pid`` (one of our children, alive or a zombie, or dead and reaped) was started by :func:`spawn`, which
    makes every child a group leader; True when its group is its own (or it can no longer be asked: then the
    group, if it still has members, is still the child's, since the number stays taken while it has any)."""
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


def end_orphans(timeout_s: float, keep: set[int] = frozenset()) -> dict[int, list[str]]:
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
        # within ~1 s by themselves, and the line ("a lost device group") came with every clean stop
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
