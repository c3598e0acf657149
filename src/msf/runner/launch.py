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

import dataclasses
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError
from msf.distributed.nodes import NodePlan
from msf.distributed.rendezvous import JOIN_REFUSED_EXIT, Heartbeat, JoinRefused, check_port, join
from msf.distributed.topology import RankInfo
from msf.envs.registry import EnvSpaces
from msf.persistence.summaries import setup_logging
from msf.runner.device_group import run_device_group
from msf.runner.experiment import experiment_dir
from msf.runner.training_loop import ComponentFailed, PeerFailed

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
    if cfg.num_workers < nproc and plan.launcher == "local":
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
        changes["seed"] = int(np.random.SeedSequence().entropy % (2**31))
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
    if plan.launcher != "local":
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
    """Spawn this node's rank processes and supervise them until they end."""
    errors = mp.get_context("spawn").SimpleQueue()
    ctx = mp.start_processes(
        _rank_main,
        args=(cfg, spaces, plan, attempt, errors),
        nprocs=cfg.nproc_per_node,
        join=False,
        start_method="spawn",
    )

    # Ctrl-C reaches every process of the terminal's group, ranks included: they agree on a clean stop,
    # and the launcher waits for them. A SIGTERM sent to the launcher alone is passed on to the ranks.
    def forward_term(signum: int, frame: Any) -> None:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, forward_term)
    first = plan.node_rank * cfg.nproc_per_node
    try:
        while not ctx.join(timeout=1.0):
            pass
    except mp.ProcessExitedException as e:
        if e.exit_code == JOIN_REFUSED_EXIT and not errors.empty():
            raise JoinRefused(errors.get()) from None
        raise RuntimeError(f"rank {first + e.error_index} (pid {e.error_pid}) was lost: {e}") from None
    except mp.ProcessRaisedException as e:
        last = str(e).strip().splitlines()[-1]
        raise RuntimeError(f"rank {first + e.error_index} (pid {e.error_pid}) failed: {last}\n{e}") from None
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _rank_main(local_rank: int, cfg: Config, spaces: EnvSpaces, plan: NodePlan, attempt: int, errors: Any) -> None:
    """The target of a spawned rank process: its logging and device, then :func:`_run_rank`; a refused join
    goes back to the launcher through ``errors`` with exit code :data:`JOIN_REFUSED_EXIT`."""
    rank = RankInfo(
        rank=plan.node_rank * cfg.nproc_per_node + local_rank,
        local_rank=local_rank,
        nproc_per_node=cfg.nproc_per_node,
        node_rank=plan.node_rank,
        nnodes=plan.nnodes,
    )
    setup_logging(experiment_dir(cfg), rank=rank.rank)
    if cfg.device == "gpu":
        # before any CUDA state exists in this process: everything after lands on this rank's GPU
        torch.cuda.set_device(local_rank)
    try:
        _run_rank(rank, cfg, spaces, plan, attempt)
    except JoinRefused as e:
        log.error("%s", e)
        errors.put(str(e))
        sys.exit(JOIN_REFUSED_EXIT)


def _run_rank(rank: RankInfo, cfg: Config, spaces: EnvSpaces, plan: NodePlan, attempt: int) -> None:
    """Join the job, train, leave; a failure names the ranks that were lost, if any.

    Looked up by name at each call: ``tests/helpers/late_rank_train.py`` wraps it to start one rank late.
    """
    entered = time.time()
    meeting = join(rank, cfg, plan, attempt)
    cfg = meeting.cfg
    # every replica logs when it entered and left initialisation: all enter before any leaves
    log.info("joined the process group: entered %.3f left %.3f", entered, time.time())
    beat = Heartbeat(meeting.store, rank, cfg.dist_timeout)
    try:
        run_device_group(cfg, spaces, rank)
    except Exception as e:
        # a failure every rank agreed on names its cause already; anything else may be a lost peer
        lost = [] if isinstance(e.__cause__, (ComponentFailed, PeerFailed)) else beat.lost_ranks()
        if lost:
            where = ", ".join(f"rank {r} ({plan.host_of(r, cfg.nproc_per_node)})" for r in lost)
            raise RuntimeError(f"lost {where}: {e}") from None
        raise
    finally:
        beat.stop()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group after a lost rank
            pass
        meeting.close()
