"""Starting child processes: every child is started one way, :func:`spawn`.

A child is forked from a fork server (``spawn`` where the platform has none or the temp folder's path is too long
for its socket) that imported torch and the worker modules once, before any thread, lock or CUDA state existed: a
child starts in milliseconds instead of importing torch anew, and as a spawned one would (its parent's environment,
random generators of its own). It ignores the stop and checkpoint signals (the main process's to act on), leads a
process group of its own (so that what it starts, such as ViZDoom's engines, ends with it:
:func:`msf.runtime.reaping.stop_children`), watches its parent (:func:`parent_alive`), and reports an exception as
a :class:`ComponentFailure` on the failure queue before it exits non-zero (a :class:`OneLineFailure` with its
message only).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing
import os
import select
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any, Callable

import torch.multiprocessing as mp

from msf import CHECKPOINT_SIGNAL, LOG_DATEFMT, STOP_SIGNALS
from msf.runtime.registrations import restore, snapshot
from msf.runtime.signals import ignore

START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
CTX = mp.get_context(START_METHOD)  # the context of every queue, pipe and event handed to children
# what the fork server imports once, so that its children do not: torch, numpy, gymnasium and msf's workers
# (first, msf.runtime.fork_server_signals: the server ignores SIGTERM, which a stop sends to the whole process group)
_PRELOAD = ["msf.runtime.fork_server_signals", "msf.sampling.rollout_worker", "msf.sampling.inference_worker"]
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


class OneLineFailure(Exception):
    """A child's failure whose message says all (what went wrong, where): reported without a traceback."""


class Spawner:
    """How this process starts its children: the fork server (started with its preload list and one BLAS
    thread), and the quiet executable that spawned children start through.

    One per process (:func:`spawner`): multiprocessing keeps one fork server and one executable per process, and
    this object is what sets them up and remembers that it did.
    """

    def __init__(self) -> None:
        self.fits: bool | None = None  # whether the fork server's socket path fits (:meth:`_fork_server_fits`)
        self.quiet = False  # whether the quiet executable is set

    def spawn(self, target: Callable[..., None], name: str, failures: Queue, *args: Any) -> mp.Process:
        """Start ``target(*args)`` in a new process named ``name`` and return it (already started).

        ``args`` are pickled once, as the process starts (so queues, pipes and shared tensors may be among them,
        at any depth); ``failures`` (a queue of :data:`CTX`) receives a :class:`ComponentFailure` if ``target``
        raises. A child handed more shared tensors (file descriptors) than the fork server can pass (~250; a
        block with views into it counts once) is started with ``spawn`` instead, and imports torch itself."""
        child_args = (target, name, failures, log.getEffectiveLevel(), args, snapshot(), dict(os.environ))
        self.use_quiet_executable()
        forked = self.start_fork_server()
        p = (CTX if forked else mp.get_context("spawn")).Process(  # type: ignore[attr-defined]  # CTX has one
            target=_child_main, args=child_args, name=name, daemon=True
        )
        try:
            p.start()
        except ValueError as e:  # the fork server hands a child at most ~250 file descriptors (one per tensor)
            if not forked or "too many fds" not in str(e):
                raise
            log.info("%s is handed more shared tensors than the fork server can pass: it is started with spawn", name)
            p = mp.get_context("spawn").Process(target=_child_main, args=child_args, name=name, daemon=True)
            p.start()
        return p

    def _fork_server_fits(self) -> bool:
        """Whether the fork server's socket path fits: it listens on a Unix socket in multiprocessing's folder of
        the temp folder (``<TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX``), and such a path has at most 107 bytes
        (a cluster job's ``TMPDIR`` may be longer). If not, the workers are started with ``spawn``, and the log
        says so once."""
        if self.fits is None:
            from multiprocessing import util

            folder = util.get_temp_dir()
            size = len(os.fsencode(folder))
            self.fits = size + len("/listener-xxxxxxxx") <= 107
            if not self.fits:
                log.warning(
                    "the path of multiprocessing's temp folder %s (%d bytes, at most 89 fit) is too long for the "
                    "workers' fork server's socket: the workers are started with spawn and each imports torch "
                    "itself (a slower start; a shorter TMPDIR avoids it)",
                    folder,
                    size,
                )
        return self.fits

    def start_fork_server(self) -> bool:
        """Start the fork server now, if this process has none running, with its preload list and with
        :data:`_SERVER_ONE_THREAD` set to 1 in its environment only (a fork from a process with other threads
        may leave a lock held by a thread that the child does not have). It does not wait for the server's
        imports, which run while this process goes on. Children restore their parent's variables and size their
        own BLAS pools (:func:`_child_main`).

        Returns:
            True when children are forked from the fork server; False when they are to be spawned (no fork server
            on this platform, or its socket cannot be made)."""
        if START_METHOD != "forkserver" or not self._fork_server_fits():
            return False
        from multiprocessing import forkserver

        CTX.set_forkserver_preload(_PRELOAD)
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

    def use_quiet_executable(self) -> None:
        """Start spawned children (and the fork server) through a two-line ``sh`` script that ignores SIGINT,
        SIGHUP and the checkpoint signal and then runs this Python.

        An ignored signal stays ignored across ``exec``, and Python then leaves it so: a child ignores a Ctrl-C
        (which a terminal sends to the whole process group) from its first instruction, not only once
        :func:`_child_main` runs, which may take seconds of imports on a busy machine. The main process keeps its
        own handler all along. Without ``/bin/sh`` nothing changes.
        """
        if self.quiet or not os.path.exists("/bin/sh"):
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
        self.quiet = True


@functools.cache
def spawner() -> Spawner:
    """This process's :class:`Spawner`, made at its first use."""
    return Spawner()


def spawn(target: Callable[..., None], name: str, failures: Queue, *args: Any) -> mp.Process:
    """:meth:`Spawner.spawn` of this process's spawner."""
    return spawner().spawn(target, name, failures, *args)


def start_fork_server() -> bool:
    """:meth:`Spawner.start_fork_server` of this process's spawner (a device group calls it before it makes its
    learners, so that the server's imports overlap with that work)."""
    return spawner().start_fork_server()


def use_quiet_executable() -> None:
    """:meth:`Spawner.use_quiet_executable` of this process's spawner."""
    spawner().use_quiet_executable()


def _child_main(
    target: Callable[..., None],
    name: str,
    failures: Queue,
    log_level: int,
    args: tuple,
    registered: Any = None,
    environ: dict[str, str] | None = None,
) -> None:
    # The stop signals reach every process of a job where its manager signals them all (Slurm's scancel, a
    # terminal's Ctrl-C to the foreground group, systemd's control-group kill), and so does Slurm's checkpoint
    # signal: the stop and the checkpoint are the main process's to make. msf never ends a child by a signal (it
    # tells it to stop, then kills its group: stop_children), and an orphan ends itself (parent_alive).
    ignore(*STOP_SIGNALS, CHECKPOINT_SIGNAL)
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
    except BaseException as e:  # noqa: BLE001 - the whole point is to report anything
        tb = str(e) if isinstance(e, OneLineFailure) else traceback.format_exc()
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
    numbers, and BLAS thread pools (numpy's OpenBLAS, which the fork server started with one thread) as large as
    ``environ`` or the cores make them."""
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


def _lead_own_process_group() -> None:
    """Make this child the leader of a process group of its own, before it starts anything.

    The processes it starts join that group (ViZDoom's engines: one per env, started by the env's controller in
    the rollout worker). When the worker dies before it closed its envs, its engines are orphaned and wait for
    ever on their message queue; the group outlives the worker, so :func:`msf.runtime.reaping.stop_children`
    ends them by it. The group also keeps a terminal's Ctrl-C (sent to the foreground group) away from the
    engines, which exit on SIGINT: a clean stop would otherwise break every env's next step.
    """
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted (a session leader): the child stays in its parent's group
        pass


def _release_if_orphaned(*handed: Any) -> None:
    """When the process that spawned this child is gone (killed: SIGKILL, the OOM killer, a second Ctrl-C's
    ``os._exit``), release the semaphores of the queues and events it handed to this child.

    The parent created them, and multiprocessing's resource tracker (one per job: the node launcher, its ranks
    and their workers share it) keeps their names until the parent unregisters them, which a killed parent
    never does: at the job's end the tracker would report them as leaked. Its children outlive it by the 0.5 s
    between their checks of the parent, and between them they hold every one of those semaphores; the first to
    unlink a name also takes it off the tracker's list.
    """
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        release_semaphores(*handed)


def release_semaphores(*objs: Any) -> None:
    """Unlink the named semaphores of the ``multiprocessing`` queues and events in ``objs`` (at any depth of
    dataclasses, lists, tuples and dicts) and take them off the resource tracker's list, so that the tracker
    does not report them as leaked. A name already unlinked (by another process) is left alone."""
    release_named_semaphores(semaphore_names(*objs))


def release_named_semaphores(names: list[str]) -> None:
    """:func:`release_semaphores` by the semaphores' names (``/mp-...``)."""
    from _multiprocessing import sem_unlink
    from multiprocessing import resource_tracker

    for name in names:
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
            name = getattr(o._semlock, "name", None)  # type: ignore[attr-defined]
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
    poller = select.poll()  # (poll, not select: the sentinel's descriptor may be above select's limit of 1,024)
    poller.register(parent.sentinel, select.POLLIN | select.POLLHUP)
    return not poller.poll(0)


def stop_fork_server(timeout_s: float = 5.0) -> None:
    """End this process's fork server, if it runs one, and wait up to ``timeout_s`` for it to exit (then kill it).

    The server exits by itself once its parent's end of its alive pipe closes, but only after the parent has
    exited, where a script that looks for leftover processes right after ``msf-train`` would find it. Call this
    once the children have stopped; the next :func:`spawn` starts a new server. It uses multiprocessing's record
    of the server (``_forkserver_pid``, ``_forkserver_alive_fd``, ``_forkserver_address``), as
    ``ForkServer._stop`` does, with a bounded wait instead of its unbounded ``waitpid``; where that record is not
    there (another Python), it does nothing."""
    import time
    from multiprocessing import forkserver, util

    server: Any = getattr(forkserver, "_forkserver", None)
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
