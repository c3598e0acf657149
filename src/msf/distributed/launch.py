"""Launching the device groups of one node, with PyTorch's own machinery.

One device group runs in this process when the world has one rank. Otherwise
``torch.multiprocessing.start_processes`` spawns ``nproc_per_node`` rank processes
at once (so every replica joins the process group at the same time: nothing waits for
another replica to finish initialising), supervises them, and ends them all when one
fails. Each rank joins the c10d process group (gloo on CPU, NCCL on CUDA) through a TCP
rendezvous on 127.0.0.1 before it creates its learner.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import signal
import socket
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError
from msf.distributed.topology import RankInfo, split_evenly
from msf.envs.registry import EnvSpaces

log = logging.getLogger("msf")


def resolve(cfg: Config, given: set[str]) -> Config:
    """Fill in what the defaults leave open, before anything is spawned: the device (``gpu`` falls back
    to the CPU unless asked for explicitly), ``nproc_per_node``, the seed (one for all replicas)
    and a free rendezvous port.

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
    nproc = cfg.nproc_per_node
    if nproc is None:
        nproc = gpus if device == "gpu" else 1
    if device == "gpu" and nproc > gpus:
        raise ConfigError(f"--nproc_per_node: {nproc} device groups but only {gpus} visible GPU(s) "
                          "(CUDA_VISIBLE_DEVICES); use at most that many, or --device=cpu")
    if cfg.num_workers < nproc:
        raise ConfigError(f"--num_workers: must be at least nproc_per_node={nproc} (every device group needs a "
                          f"rollout worker), got {cfg.num_workers}")
    changes["nproc_per_node"] = nproc
    if cfg.seed is None:
        changes["seed"] = int(np.random.SeedSequence().entropy % (2**31))
    if nproc > 1:
        changes["master_port"] = _check_port(cfg.master_port)
    return dataclasses.replace(cfg, **changes)


def _check_port(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise ConfigError(f"--master_port: port {port} on 127.0.0.1 is not free ({e.strerror})") from None
        return s.getsockname()[1]


def rank_config(cfg: Config, rank: RankInfo) -> Config:
    """The config of one device group: its share of this node's rollout workers."""
    return dataclasses.replace(cfg, num_workers=split_evenly(cfg.num_workers, rank.nproc_per_node, rank.local_rank))


def launch(cfg: Config, spaces: EnvSpaces) -> None:
    """Run all device groups of this node until they end (see module docstring).

    Raises:
        torch.multiprocessing.ProcessRaisedException / ProcessExitedException: a rank died;
        the message names it.
    """
    from msf.runner.device_group import run_device_group

    if cfg.nproc_per_node == 1:
        run_device_group(cfg, spaces, RankInfo())
        return
    ctx = mp.start_processes(_rank_main, args=(cfg, spaces), nprocs=cfg.nproc_per_node, join=False,
                             start_method="spawn")

    # Ctrl-C reaches every process of the terminal's group, ranks included: they agree on a clean stop,
    # and the launcher waits for them. A SIGTERM sent to the launcher alone is passed on to the ranks.
    def forward_term(signum: int, frame: Any) -> None:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, forward_term)
    try:
        while not ctx.join(timeout=1.0):
            pass
    except mp.ProcessExitedException as e:
        raise RuntimeError(f"rank {e.error_index} (pid {e.error_pid}) was lost: {e}") from None
    except mp.ProcessRaisedException as e:
        last = str(e).strip().splitlines()[-1]
        raise RuntimeError(f"rank {e.error_index} (pid {e.error_pid}) failed: {last}\n{e}") from None
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _join(rank: RankInfo, cfg: Config) -> None:
    """Join the process group through a c10d TCPStore that rank 0 hosts, and wait until every rank has
    arrived, so that a rank that never comes is named (not a bare time-out).

    Raises:
        RuntimeError: some rank did not arrive within ``--dist_timeout`` seconds (the message lists them).
    """
    timeout = datetime.timedelta(seconds=cfg.dist_timeout)
    store = dist.TCPStore("127.0.0.1", cfg.master_port, rank.world_size, is_master=rank.is_main,
                          timeout=timeout, wait_for_workers=False)
    store.set(f"msf/arrived/{rank.rank}", "1")
    keys = [f"msf/arrived/{r}" for r in range(rank.world_size)]
    try:
        store.wait(keys, timeout)
    except Exception:  # noqa: BLE001 - a time-out: say who is missing
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise RuntimeError(f"rank(s) {missing} did not join within --dist_timeout={cfg.dist_timeout} s") from None
    backend = "nccl" if cfg.device == "gpu" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank.rank, world_size=rank.world_size, timeout=timeout)


def _rank_main(local_rank: int, cfg: Config, spaces: EnvSpaces) -> None:
    from msf.persistence.summaries import setup_logging
    from msf.runner.device_group import run_device_group
    from msf.runner.experiment import experiment_dir

    rank = RankInfo(rank=local_rank, local_rank=local_rank, nproc_per_node=cfg.nproc_per_node)
    setup_logging(experiment_dir(cfg), rank=rank.rank)
    delay = os.environ.get("MSF_DEBUG_DELAY_RANK", "")  # "RANK:SECONDS", for the tests of concurrent start
    if delay and int(delay.split(":")[0]) == rank.rank:
        time.sleep(float(delay.split(":")[1]))
    if cfg.device == "gpu":
        # before any CUDA state exists in this process: everything after lands on this rank's GPU
        torch.cuda.set_device(local_rank)
    entered = time.time()
    _join(rank, cfg)
    # every replica logs when it entered and left initialisation: all enter before any leaves
    log.info("joined the process group: entered %.3f left %.3f", entered, time.time())
    try:
        run_device_group(cfg, spaces, rank)
    finally:
        dist.destroy_process_group()
