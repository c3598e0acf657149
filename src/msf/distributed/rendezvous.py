"""Rendezvous primitives: the c10d store a job's ranks meet in, the checks made there, the heartbeat.

Each rank joins through a c10d ``TCPStore`` that rank 0 hosts on a socket it binds itself to the first
host's address only (not every interface). Before the process group exists, the ranks check in the store
that no rank is claimed twice and that every node runs the same experiment config; then they wait for each
other, naming the hosts that never come. Under torchrun the process group comes from torchrun's environment
(``env://``) and the same checks run in its store. The launching itself lives in :mod:`msf.runner.launch`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from msf.cfg.config import PER_NODE_FLAGS, Config
from msf.cfg.validation import ConfigError
from msf.distributed.nodes import NodePlan
from msf.distributed.topology import RankInfo

# The exit code of a rank whose join was refused (the launcher turns it into JoinRefused, exit 2).
JOIN_REFUSED_EXIT = 2


class JoinRefused(ConfigError):
    """The nodes' flags do not fit together (a rank claimed twice, different configs): exit code 2."""


def bind_listener(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on ``addr:port`` only (``port`` 0: a free one)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    return socket.create_server(sockaddr[:2], family=family, backlog=128)


def check_port(port: int, addr: str) -> int:
    """``port`` if it is free on ``addr`` (0: a free one, returned).

    Raises:
        ConfigError: naming ``--master_port``, when the port is taken or the address is not this machine's.
    """
    try:
        with bind_listener(addr, port) as s:
            return s.getsockname()[1]
    except OSError as e:
        raise ConfigError(
            f"--master_port: port {port} on {addr} is not free or not this machine's ({e.strerror or e})"
        ) from None


def wait_for_listener(addr: str, port: int, deadline: float) -> None:
    """Return once ``addr:port`` accepts a TCP connection; raise TimeoutError at ``deadline`` (monotonic)."""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{addr}:{port} did not accept a connection") from None
            time.sleep(0.2)


def fingerprint(cfg: Config) -> dict:
    """What must be the same on every node: the config minus :data:`PER_NODE_FLAGS` (seed kept, to adopt)."""
    d = cfg.to_dict()
    return {k: v for k, v in d.items() if k not in PER_NODE_FLAGS or k == "seed"}


def _wait(store: Any, keys: list[str], deadline: float, rank: RankInfo) -> bool:
    """Wait until ``keys`` exist in ``store`` (True) or ``deadline`` passes (False); raise when a rank
    aborted the join (the abort's message is the error)."""
    while True:
        if store.check(["abort"]):
            code, _, msg = store.get("abort").decode().partition("|")
            _linger(store, rank)
            raise (JoinRefused if code == "2" else RuntimeError)(msg)
        if store.check(keys):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _abort(store: Any, rank: RankInfo, error: Exception) -> None:
    store.set("abort", f"{2 if isinstance(error, JoinRefused) else 1}|{error}")
    _linger(store, rank)
    raise error


def _linger(store: Any, rank: RankInfo, limit_s: float = 10.0) -> None:
    """After an abort: other ranks count themselves in ``abort_seen``; rank 0, which hosts the store,
    keeps it up until every process that claimed a rank has read the abort (at most ``limit_s``)."""
    if not rank.is_main:
        store.add("abort_seen", 1)
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        claimed = sum(store.add(f"claim/{r}", 0) for r in range(rank.world_size))
        if store.add("abort_seen", 0) >= claimed - 1:
            return
        time.sleep(0.1)


@dataclass
class Rendezvous:
    """What joining the job left this rank with: the c10d store of this attempt (prefixed), the config with
    rank 0's seed, and on rank 0 the listening socket the store serves on (kept open while the object lives;
    :meth:`close` closes it)."""

    store: Any
    cfg: Config
    listener: socket.socket | None = None

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def join(rank: RankInfo, cfg: Config, plan: NodePlan, attempt: int) -> Rendezvous:
    """Join the job's process group and return the :class:`Rendezvous` of this attempt.

    In order: reach the store (rank 0 hosts it), claim this rank, check this node's config against rank 0's
    and adopt rank 0's seed, wait until every rank has arrived, then create the process group (under
    torchrun it exists before the store is reached).

    Raises:
        JoinRefused: a rank is claimed twice, or this node's config differs from rank 0's.
        RuntimeError: the rendezvous cannot be reached, or some node did not join within ``--dist_timeout``
            seconds (the message names its host).
    """
    timeout = datetime.timedelta(seconds=cfg.dist_timeout)
    deadline = time.monotonic() + cfg.dist_timeout
    backend = "nccl" if cfg.device == "gpu" else "gloo"
    store, listener = _connect(rank, cfg, plan, attempt, backend, deadline)
    if plan.launcher != "torchrun" and store.add(f"claim/{rank.rank}", 1) > 1:
        _abort(
            store,
            rank,
            JoinRefused(
                f"--node_rank: rank {rank.rank} is claimed twice: two nodes were started with "
                f"--node_rank={rank.node_rank} (each node needs its own, in [0, {rank.nnodes}))"
            ),
        )
    cfg = _check_config(store, rank, cfg, plan, deadline)
    _wait_for_everyone(store, rank, cfg, plan, deadline)
    if plan.launcher != "torchrun":
        dist.init_process_group(
            backend, store=dist.PrefixStore("pg", store), rank=rank.rank, world_size=rank.world_size, timeout=timeout
        )
    return Rendezvous(store, cfg, listener)


def _where(cfg: Config, plan: NodePlan) -> str:
    return f"the rendezvous at {plan.master_addr}:{cfg.master_port}"


def _connect(
    rank: RankInfo, cfg: Config, plan: NodePlan, attempt: int, backend: str, deadline: float
) -> tuple[Any, socket.socket | None]:
    """The store of this attempt (prefixed, so that a restart never reads an earlier attempt's keys) and,
    on rank 0 outside torchrun, the socket it serves on. Under torchrun the process group is created here,
    from torchrun's environment, before the store is reached."""
    timeout = datetime.timedelta(seconds=cfg.dist_timeout)
    addr, port = plan.master_addr, cfg.master_port
    if plan.launcher == "torchrun":
        dist.init_process_group(
            backend, init_method="env://", rank=rank.rank, world_size=rank.world_size, timeout=timeout
        )
        raw = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
        return dist.PrefixStore(f"msf/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}/", raw), None
    listener = None
    if rank.is_main:
        sock = bind_listener(addr, port)  # this address only: c10d's own listener would take every interface
        raw = dist.TCPStore(
            addr,
            port,
            rank.world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
        listener = sock  # the store serves on this socket: the Rendezvous keeps it open
    else:
        try:
            # wait for the listener with plain sockets first: a failing TCPStore client takes longer than
            # its time-out and prints C++ stack traces while it retries
            wait_for_listener(addr, port, deadline)
            raw = dist.TCPStore(addr, port, rank.world_size, is_master=False, timeout=timeout)
        except Exception:  # noqa: BLE001 - a time-out or a refused connection
            raise RuntimeError(
                f"could not reach {_where(cfg, plan)} (rank 0, node 0: "
                f"{plan.host_of(0, rank.nproc_per_node)}) within --dist_timeout="
                f"{cfg.dist_timeout} s"
            ) from None
    return dist.PrefixStore(f"msf/{attempt}/", raw), listener


def _check_config(store: Any, rank: RankInfo, cfg: Config, plan: NodePlan, deadline: float) -> Config:
    """Publish this rank's :func:`fingerprint`; on the other ranks, compare it with rank 0's (a difference
    aborts the join for everyone) and return ``cfg`` with rank 0's seed."""
    mine = fingerprint(cfg)
    store.set(f"config/{rank.rank}", json.dumps(mine))
    if rank.is_main:
        return cfg
    if not _wait(store, ["config/0"], deadline, rank):
        raise RuntimeError(
            f"rank 0 ({plan.host_of(0, rank.nproc_per_node)}) did not join {_where(cfg, plan)} within "
            f"--dist_timeout={cfg.dist_timeout} s"
        )
    ref = json.loads(store.get("config/0"))
    diff = [k for k in sorted(set(mine) | set(ref)) if k != "seed" and mine.get(k) != ref.get(k)]
    if diff:
        _abort(
            store,
            rank,
            JoinRefused(
                f"--{diff[0]}: node {rank.node_rank} runs another config than node 0: "
                + "; ".join(f"--{k}={ref.get(k)!r} on node 0, {mine.get(k)!r} on node {rank.node_rank}" for k in diff)
                + " (start every node with the same flags)"
            ),
        )
    return dataclasses.replace(cfg, seed=ref["seed"])


def _wait_for_everyone(store: Any, rank: RankInfo, cfg: Config, plan: NodePlan, deadline: float) -> None:
    """Mark this rank arrived and wait for all the others until ``deadline``.

    Raises:
        RuntimeError: naming the ranks (and, over several nodes, the nodes and hosts) that did not arrive.
    """
    store.set(f"arrived/{rank.rank}", "1")
    if _wait(store, [f"arrived/{r}" for r in range(rank.world_size)], deadline, rank):
        return
    missing = [r for r in range(rank.world_size) if not store.check([f"arrived/{r}"])]
    if rank.nnodes == 1:
        raise RuntimeError(
            f"rank(s) {missing} did not join {_where(cfg, plan)} within --dist_timeout={cfg.dist_timeout} s"
        )
    nodes = sorted({r // rank.nproc_per_node for r in missing})
    hosts = ", ".join(f"node {n}" + (f" ({plan.hosts[n]})" if plan.hosts else "") for n in nodes)
    message = (
        f"{hosts} did not join {_where(cfg, plan)} within --dist_timeout={cfg.dist_timeout} s "
        f"(missing rank(s) {missing} of {rank.world_size}"
    )
    if plan.launcher == "torchrun":
        message += f"; under torchrun: {len(nodes)} node(s) missing"
    raise RuntimeError(message + ")")


@dataclass
class RankProgress:
    """How far a rank has come, as its training loop counts it. Its heartbeat writes it to the store
    (``progress/<rank>``) every second, so that a rank whose collective times out can say who did not come and
    what that rank was doing (:meth:`Heartbeat.absent_from_agreement`).

    Attributes:
        iteration: training iterations completed. entered: agreements entered (one more than ``agreed`` while
            the rank waits in one). agreed: agreements completed. trajectories: trajectories its rollout workers
            have delivered so far. last_trajectory: when the last one came (``time.time()``; None: none yet).
    """

    iteration: int = 0
    entered: int = 0
    agreed: int = 0
    trajectories: int = 0
    last_trajectory: float | None = None

    def record(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "now": time.time()})


class Heartbeat:
    """Every rank bumps a counter in the store every second, and writes its :class:`RankProgress`; after a
    failure, the ranks whose counter stood still (or all of them but this one, when the store itself is gone
    with rank 0) are named, and after a timed-out agreement, the ranks that did not come to it.

    Args:
        store: the rendezvous store. rank: this rank. timeout: ``--dist_timeout`` (seconds), what a collective
            waits. host_of: the host of a rank (for messages).
    """

    PERIOD = 1.0

    def __init__(self, store: Any, rank: RankInfo, timeout: float, host_of: Any = None):
        self.store, self.rank, self.world = store, rank.rank, rank.world_size
        self.timeout, self.host_of = timeout, host_of or (lambda r: "?")
        self.progress = RankProgress()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        if self.world > 1:
            self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.PERIOD):
            try:
                self.store.add(f"beat/{self.rank}", 1)
                self.store.set(f"progress/{self.rank}", self.progress.record())
            except Exception:  # noqa: BLE001 - the store is gone: lost_ranks says so
                return

    def _counts(self) -> list[int]:
        return [self.store.add(f"beat/{r}", 0) for r in range(self.world)]

    def lost_ranks(self) -> list[int]:
        if self.world == 1:
            return []
        try:
            self.store.set_timeout(datetime.timedelta(seconds=5))
            before = self._counts()
            time.sleep(3 * self.PERIOD)
            after = self._counts()
        except Exception:  # noqa: BLE001 - rank 0 hosted the store: it is gone
            return [0]
        return [r for r in range(self.world) if r != self.rank and after[r] == before[r]]

    def absent_from_agreement(self) -> str | None:
        """After this rank's agreement (:mod:`msf.distributed.agreement`) timed out: which ranks did not enter it
        and what each did last, from the progress records (None: every rank came, or a record is missing or
        stale: then the rank was lost, which :meth:`lost_ranks` tells); gloo's own message names only the rank
        that waited."""
        if self.world == 1:
            return None
        mine = self.progress
        try:
            self.store.set_timeout(datetime.timedelta(seconds=5))
            records = {r: json.loads(self.store.get(f"progress/{r}")) for r in range(self.world) if r != self.rank}
        except Exception:  # noqa: BLE001 - no store, or a rank that never wrote: a lost rank
            return None
        absent = {r: p for r, p in records.items() if p["entered"] < mine.entered}
        if not absent or any(time.time() - p["now"] > 10 * self.PERIOD for p in absent.values()):
            return None  # a rank whose heartbeat stopped is lost, not late
        return "; ".join(self._describe(r, p) for r, p in sorted(absent.items()))

    def _describe(self, r: int, p: dict) -> str:
        last = p["last_trajectory"]
        if last is None:
            sampling = "its rollout workers have delivered no trajectory yet (are its envs still starting?)"
        elif p["now"] - last < max(2.0, 0.1 * self.timeout):
            sampling = (
                f"its rollout workers were still delivering trajectories ({p['trajectories']} so far, the last "
                f"{p['now'] - last:.1f} s ago), too slowly for one iteration within the wait: raise "
                "--dist_timeout, or make that rank's envs faster"
            )
        else:
            sampling = (
                f"its rollout workers had delivered nothing for {p['now'] - last:.0f} s ({p['trajectories']} so "
                "far): they are stuck (see that rank's lines in log.txt)"
            )
        return (
            f"rank {r} ({self.host_of(r)}) did not come to the agreement after iteration {self.progress.iteration} "
            f"within --dist_timeout={self.timeout:g} s (rank {self.rank} waited for it): its last completed "
            f"iteration is {p['iteration']}, and {sampling}"
        )

    def stop(self) -> None:
        self.stopped.set()
