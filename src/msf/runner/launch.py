"""Launching the device groups of a node, and joining them into one job, with PyTorch's own machinery.

Where this process stands comes from :func:`msf.distributed.nodes.discover`: one node; a host
list (``--nnodes --node_rank --hosts``, a static rendezvous on the first host); torchrun (this
process is one rank); or Slurm (one task per node, or one task per device group).

A node launcher (``launcher == "local"``) runs one device group in this process when the world has
one rank. Otherwise ``torch.multiprocessing.start_processes`` spawns the node's ``nproc_per_node``
rank processes at once (so every replica joins at the same time: nothing waits for another replica
to finish initialising), supervises them, and ends them all when one fails; with
``--max_restarts=K`` it starts them again, from the last checkpoint, up to K times.

Each rank joins the job through :func:`msf.distributed.rendezvous.join` (a c10d store hosted by rank 0,
with the checks that the nodes' flags fit together), then runs its device group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import sys
import time
from multiprocessing.connection import wait
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from msf import CHECKPOINT_SIGNAL
from msf.cfg.config import Config
from msf.cfg.validation import ConfigError
from msf.distributed.nodes import NodePlan
from msf.distributed.rendezvous import JOIN_REFUSED_EXIT, Heartbeat, JoinRefused, check_port, join
from msf.distributed.topology import RankInfo
from msf.envs.families import remove_engine_files
from msf.envs.registry import EnvSpaces
from msf.persistence.summaries import setup_logging
from msf.runner.device_group import run_device_group
from msf.runner.experiment import experiment_dir
from msf.runner.training_loop import AgreementTimedOut, ComponentFailed, PeerFailed
from msf.runtime.reaping import STOP_GRACE_S, become_subreaper, children_now, end_orphans
from msf.runtime.registrations import restore, snapshot
from msf.runtime.semaphore_records import record_semaphores, remove_dead_runs_semaphores
from msf.runtime.signals import Signals, exit_on_interrupt, ignore, set_handlers
from msf.runtime.spawning import use_quiet_executable

log = logging.getLogger("msf")

SINGLE = NodePlan(
    source="single",
    launcher="local",
    nnodes=1,
    node_rank=0,
    nproc_per_node=None,
    master_addr="127.0.0.1",
    master_port=0,
    hosts=None,
)


def resolve(cfg: Config, given: set[str], plan: NodePlan = SINGLE) -> Config:
    """Fill in what the defaults leave open, before anything is spawned: the device (``gpu`` falls back
    to the CPU unless asked for explicitly), ``nproc_per_node``, the node layout of ``plan``, the seed
    (one for all replicas: rank 0's) and the rendezvous port.

    Raises:
        ConfigError: an explicit ``--device=gpu`` without CUDA, more device groups than GPUs, a busy port.
    """
    changes: dict[str, Any] = {}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = cfg.device
    if device == "gpu" and gpus == 0:
        if "device" in given:
            raise ConfigError("--device: gpu was asked for but CUDA is not available here; use --device=cpu")
        device = changes["device"] = "cpu"
    nproc = plan.nproc_per_node or cfg.nproc_per_node
    if nproc is None:
        nproc = gpus if device == "gpu" else 1
    if device == "gpu" and plan.launcher == "local" and nproc > gpus:
        raise ConfigError(
            f"--nproc_per_node: {nproc} device groups but only {gpus} visible GPU(s) "
            "(CUDA_VISIBLE_DEVICES); use at most that many, or --device=cpu"
        )
    # a device env (--env_gpu_actions) has no rollout worker: resolve_device_env sets --num_workers to nproc
    if cfg.num_workers < nproc and plan.launcher == "local" and not cfg.sampler_port and not cfg.env_gpu_actions:
        raise ConfigError(
            f"--num_workers: must be at least nproc_per_node={nproc} (every device group needs a "
            f"rollout worker), got {cfg.num_workers}"
        )
    changes.update(
        nproc_per_node=nproc,
        nnodes=plan.nnodes,
        node_rank=plan.node_rank,
        hosts=",".join(plan.hosts) if plan.hosts else None,
    )
    if cfg.seed is None:
        changes["seed"] = int(np.random.SeedSequence().entropy % (2**31))  # type: ignore[operator]  # an int here
    if plan.launcher == "torchrun":
        changes["master_port"] = plan.master_port
    elif plan.nnodes == 1 and plan.launcher == "local":
        if nproc > 1:
            changes["master_port"] = check_port(cfg.master_port, "127.0.0.1")
    else:
        changes["master_port"] = plan.master_port
        hosts_rank0 = plan.node_rank == 0 if plan.launcher == "local" else plan.rank == 0
        if hosts_rank0:
            check_port(plan.master_port, plan.master_addr)
    return dataclasses.replace(cfg, **changes)


def launch(cfg: Config, spaces: EnvSpaces, plan: NodePlan = SINGLE) -> None:
    """Run this node's device groups (or, under torchrun or one Slurm task per group, this one rank)
    until they end; restart them up to ``--max_restarts`` times after a failure.

    Raises:
        JoinRefused: the nodes' flags do not fit together (the message names the flag).
        RuntimeError: a rank failed, was lost, or never joined; the message names it.
    """
    assert cfg.nproc_per_node is not None, "resolve() sets it"
    remove_dead_runs_semaphores()
    if plan.launcher != "local":
        assert plan.rank is not None and plan.local_rank is not None, "a plan of one rank sets them"
        rank = RankInfo(
            rank=plan.rank,
            local_rank=plan.local_rank,
            nproc_per_node=cfg.nproc_per_node,
            node_rank=plan.node_rank,
            nnodes=plan.nnodes,
        )
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        _run_rank(rank, cfg, spaces, plan, attempt)
        return
    for attempt in range(cfg.max_restarts + 1):
        if attempt:
            log.warning(
                "restarting the device groups from the last checkpoint (restart %d of --max_restarts=%d)",
                attempt,
                cfg.max_restarts,
            )
        try:
            if cfg.nproc_per_node * plan.nnodes == 1:
                run_device_group(cfg, spaces, RankInfo())
            else:
                _launch_node(cfg, spaces, plan, attempt)
            return
        except JoinRefused:
            raise
        except Exception as e:  # noqa: BLE001 - a failed attempt: restart, or report it
            if attempt == cfg.max_restarts:
                raise
            log.error("the job failed: %s", str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            time.sleep(1.0)


def _launch_node(cfg: Config, spaces: EnvSpaces, plan: NodePlan, attempt: int) -> None:
    """Spawn this node's rank processes and supervise them until they end; then end what a lost rank left
    behind (its rollout workers and env engines, re-parented to this subreaper)."""
    # the ranks (and the resource tracker that the queue below starts) ignore a terminal's Ctrl-C from their
    # first instruction, as the workers do, until a rank installs its own handlers (_rank_main)
    use_quiet_executable()
    signals = _NodeSignals()  # before anything is spawned: a signal that comes meanwhile is passed on too
    try:
        errors = mp.get_context("spawn").SimpleQueue()
        record_semaphores(errors)
        had = children_now()  # a program that calls msf-train may have children of its own: never touched
        become_subreaper()
        with _quiet_c10d_warnings():
            ctx = mp.start_processes(
                _rank_main,
                args=(cfg, spaces, plan, attempt, errors, snapshot()),
                nprocs=cfg.nproc_per_node,
                join=False,
                start_method="spawn",
            )
    except BaseException:
        signals.restore()
        raise
    signals.watch(ctx.processes)
    assert cfg.nproc_per_node is not None, "resolve() sets it"
    first = plan.node_rank * cfg.nproc_per_node
    try:
        while not _join(ctx, signals):
            pass
    except mp.ProcessExitedException as e:
        if e.exit_code == JOIN_REFUSED_EXIT and not errors.empty():
            raise JoinRefused(errors.get()) from None
        if signals.count and _start_up_interrupted(ctx.processes):
            raise KeyboardInterrupt from None  # msf-train: "interrupted before training began", exit 130
        raise RuntimeError(f"rank {first + e.error_index} (pid {e.error_pid}) was lost: {e}") from None
    except mp.ProcessRaisedException as e:
        if signals.count and _start_up_interrupted(ctx.processes):  # a peer's start-up ended: its collectives fail
            raise KeyboardInterrupt from None
        # the traceback's last line, without the exception's class ("msf.runner.device_group.RunFailed: ")
        last = re.sub(r"^[A-Za-z_][\w.]*: ", "", str(e).strip().splitlines()[-1])
        raise RuntimeError(f"rank {first + e.error_index} (pid {e.error_pid}) failed: {last}\n{e}") from None
    finally:
        try:
            # a rank that was killed could not stop its workers: they stop by themselves (their parent is gone),
            # and whatever does not in time is killed with what it started
            remove_engine_files(end_orphans(STOP_GRACE_S, keep=had).values())
            remove_dead_runs_semaphores()  # and the semaphores of a rank that was killed
            become_subreaper(False)
        finally:
            signals.restore()  # only now: a second Ctrl-C while the orphans stop still exits at once


@contextlib.contextmanager
def _quiet_c10d_warnings() -> Iterator[None]:
    """The rank processes spawned inside start with ``TORCH_CPP_LOG_LEVEL=ERROR`` unless the user set it: when a
    rank ends, every other rank's next use of the store that rank 0 hosts logs a c10d warning with a C++ stack
    trace ("[c10d] recvValue failed ...") before msf names the lost rank itself. torch reads the level when it is
    imported, so it is set in the environment the ranks inherit; this process's own is left as it was.
    ``TORCH_CPP_LOG_LEVEL=WARNING`` shows the warnings again."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        yield
    finally:
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)


INTERRUPTED_EXIT = 130
"""The exit code of a rank process whose start-up a signal ended."""


class _NodeSignals(Signals):
    """The node launcher's stop signals, from before it spawns the ranks until they have ended.

    A signal sent to the launcher's pid alone (a script's ``kill -INT``, a batch system, a supervisor) reaches only
    the launcher, so the first stop signal is passed on to every rank as SIGTERM. A rank that trains takes it as the
    same stop as the Ctrl-C it may have had itself (not a second one: ``msf.runner.device_group._SignalHandler``)
    and stops cleanly after the next agreement; a rank still starting ends its start-up (:func:`_rank_main`), and
    the launcher then ends with ``KeyboardInterrupt`` (exit code 130). A second SIGINT exits at once, as with one
    device group: the ranks are killed, exit code 130. ``CHECKPOINT_SIGNAL`` to the launcher (``sbatch
    --signal=B:USR1@60`` through a batch script) is passed on to the ranks: a checkpoint now, the run going on.
    """

    def __init__(self) -> None:
        super().__init__(self._stop, lambda: self._send(CHECKPOINT_SIGNAL), self._again)
        self.procs: list[Any] = []
        self.install()

    def watch(self, procs: list[Any]) -> None:
        """The ranks have been spawned: pass on a stop that came while they were."""
        self.procs = procs
        if self.count:
            self._send(signal.SIGTERM)

    def _stop(self, signum: int) -> None:
        log.warning(
            "received %s: passing the stop on to the device groups%s",
            signal.Signals(signum).name,
            " (Ctrl-C again to exit at once)" if signum == signal.SIGINT else "",
        )
        self._send(signal.SIGTERM)

    def _again(self, signum: int) -> None:
        if signum == signal.SIGINT:
            self._send(signal.SIGKILL)
            exit_on_interrupt(signum)

    def _send(self, sig: int) -> None:
        for p in self.procs:
            try:
                # not p.is_alive(): its waitpid, run here, could reap a rank under the join in progress
                os.kill(p.pid, sig)
            except OSError:  # gone already
                pass


def _join(ctx: Any, signals: _NodeSignals) -> bool:
    """Wait up to 1 s for a rank to end, then torch's ``ProcessContext.join``: True once every rank has ended,
    raises when one failed (and ends the others).

    Once a stop was passed on, torch's join comes only when every rank has ended: the first rank to end (its
    start-up cut short: exit code 130) would make it SIGTERM the others again at once, with a warning of its own,
    while they are ending anyway."""
    alive = [p.sentinel for p in ctx.processes if p.is_alive()]
    if alive:
        wait(alive, timeout=1.0)
        if signals.count and any(p.is_alive() for p in ctx.processes):
            return False
    return ctx.join(timeout=0)


def _start_up_interrupted(procs: list[Any]) -> bool:
    """A stop ended the start-up of one of these (ended) rank processes: exit code :data:`INTERRUPTED_EXIT`, or
    SIGTERM while it had not yet run any of msf's code."""
    return any(p.exitcode in (INTERRUPTED_EXIT, -signal.SIGTERM) for p in procs)


def _rank_main(
    local_rank: int,
    cfg: Config,
    spaces: EnvSpaces,
    plan: NodePlan,
    attempt: int,
    errors: Any,
    registered: Any = None,
) -> None:
    """The target of a spawned rank process: :func:`_rank_process`, whose start-up a SIGINT or SIGTERM ends with
    exit code :data:`INTERRUPTED_EXIT`.

    The rank starts with SIGINT ignored (:func:`msf.runtime.spawning.use_quiet_executable`); from here until
    its device group installs its own handler (just before it spawns its workers) either signal raises
    ``KeyboardInterrupt``, whatever the rank inherited (torch's wrapper around this function would take one for a
    clean exit, code 0). A launcher that died while this process was starting (its death signal, SIGINT, came
    while SIGINT was ignored) ends it the same way. ``registered``: the launcher's registrations
    (:mod:`msf.runtime.registrations`).
    """
    import multiprocessing

    set_handlers(dict.fromkeys((signal.SIGINT, signal.SIGTERM), signal.default_int_handler))
    restore(registered)  # the launcher's registrations (a script's main() may have made them), and on to workers
    try:
        launcher = multiprocessing.parent_process()
        if launcher is not None and os.getppid() != launcher.pid:
            raise KeyboardInterrupt
        _rank_process(local_rank, cfg, spaces, plan, attempt, errors)
    except KeyboardInterrupt:
        # ignored until the exit: a terminal's Ctrl-C reaches the rank together with the SIGTERM its launcher passes
        # on, and the second of the two, landing while the interpreter ends, came out of a finalizer as a traceback
        ignore(signal.SIGINT, signal.SIGTERM)
        sys.exit(INTERRUPTED_EXIT)
    ignore(signal.SIGINT, signal.SIGTERM)


def _rank_process(local_rank: int, cfg: Config, spaces: EnvSpaces, plan: NodePlan, attempt: int, errors: Any) -> None:
    """A rank process: its logging and device, then :func:`_run_rank`; a refused join goes back to the launcher
    through ``errors`` with exit code :data:`JOIN_REFUSED_EXIT`."""
    assert cfg.nproc_per_node is not None, "resolve() sets it"
    rank = RankInfo(
        rank=plan.node_rank * cfg.nproc_per_node + local_rank,
        local_rank=local_rank,
        nproc_per_node=cfg.nproc_per_node,
        node_rank=plan.node_rank,
        nnodes=plan.nnodes,
    )
    setup_logging(experiment_dir(cfg), rank=rank.rank, to_file=cfg.log_to_file)
    if cfg.device == "gpu":
        # before any CUDA state exists in this process: everything after lands on this rank's GPU
        torch.cuda.set_device(local_rank)
    try:
        _run_rank(rank, cfg, spaces, plan, attempt)
    except JoinRefused as e:
        log.error("%s", e)
        errors.put(str(e))
        sys.exit(JOIN_REFUSED_EXIT)


def _host_label(plan: NodePlan, rank: int, nproc_per_node: int) -> str:
    """The host of ``rank`` for a message: the host list's name, else the node and, on one node, this host."""
    if plan.hosts is None and plan.nnodes == 1:
        import socket

        return f"node 0, {socket.gethostname()}"
    return plan.host_of(rank, nproc_per_node)


def _run_rank(rank: RankInfo, cfg: Config, spaces: EnvSpaces, plan: NodePlan, attempt: int) -> None:
    """Join the job, train, leave; a failure names the ranks that were lost, if any.

    Looked up by name at each call: ``tests/helpers/late_rank_train.py`` wraps it to start one rank late.
    """
    entered = time.time()
    meeting = join(rank, cfg, plan, attempt)
    cfg = meeting.cfg
    # every replica logs when it entered and left initialisation: all enter before any leaves
    log.info("joined the process group: entered %.3f left %.3f", entered, time.time())
    beat = Heartbeat(meeting.store, rank, cfg.dist_timeout, lambda r: _host_label(plan, r, rank.nproc_per_node))
    try:
        run_device_group(cfg, spaces, rank, beat, spawned_by_node_launcher=plan.launcher == "local")
    except Exception as e:
        # a failure every rank agreed on names its cause already, and so does a timed-out agreement; anything
        # else may be a lost peer
        named = (ComponentFailed, PeerFailed, AgreementTimedOut)
        lost = [] if isinstance(e.__cause__, named) else beat.lost_ranks()
        if lost:
            where = ", ".join(f"rank {r} ({plan.host_of(r, rank.nproc_per_node)})" for r in lost)
            raise RuntimeError(f"lost {where}: {e}") from None
        raise
    finally:
        beat.stop()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group after a lost rank
            pass
        meeting.close()
