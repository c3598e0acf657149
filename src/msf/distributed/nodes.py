"""Where this process stands in a job over one or several nodes, decided before anything is spawned.

A job over several machines is started in one of three ways, and :func:`discover` tells
them apart (world size = nnodes x nproc_per_node, rank = node_rank x nproc_per_node + local_rank):

1. **host list** (a static rendezvous): ``msf-train ... --nnodes=2 --node_rank=K --hosts=hostA,hostB``
   on every node. The first host holds the rendezvous and rank 0; this process spawns the
   node's device groups.
2. **torchrun**: torchrun started this process (``TORCHELASTIC_RUN_ID`` is set); it is one
   rank, and torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
   ``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` are used as they are.
3. **Slurm**: ``srun msf-train ...`` inside an allocation, without ``--hosts``. The node
   names come from ``scontrol show hostnames $SLURM_STEP_NODELIST``; with one task per node
   each task spawns its node's device groups, with one task per device group each task is one rank.
   An ``sbatch`` script is no step (no ``SLURM_STEP_ID``): it is one process on the allocation's
   first node, whatever ``SLURM_NTASKS`` says, so ``msf-train`` run in it is a single node.

Otherwise the job runs on this machine alone. Every problem is a
:class:`~msf.cfg.validation.ConfigError` whose one-line message starts with the flag concerned.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError, Problems, check_node_flags

DEFAULT_MASTER_PORT = 29500
"""The rendezvous port when ``--master_port=0`` and the processes start independently (torchrun's default)."""

LOCALHOST = "127.0.0.1"

SCONTROL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodePlan:
    """This process's place in the job, as far as it is known before the device groups exist.

    Attributes:
        source: where the layout came from: ``"single"``, ``"hosts"``, ``"torchrun"`` or ``"slurm"``.
        launcher: ``"local"``: this process spawns the node's ``nproc_per_node`` device groups;
            ``"torchrun"`` / ``"slurm_task"``: this process is one rank (``rank``, ``local_rank`` set).
        nnodes: nodes in the job.
        node_rank: this node's index in ``[0, nnodes)``.
        nproc_per_node: device groups per node; ``None`` when the caller resolves it (from the GPUs).
        master_addr: the rendezvous host (rank 0's node); ``"127.0.0.1"`` for a single node.
        master_port: the rendezvous port; ``0`` only on a single node (the caller picks a free one).
        hosts: node names in node-rank order (host list, Slurm); ``None`` otherwise.
        rank: this process's global rank when it is one rank, else ``None``.
        local_rank: this process's rank on its node when it is one rank, else ``None``.
    """

    source: str
    launcher: str
    nnodes: int
    node_rank: int
    nproc_per_node: int | None
    master_addr: str
    master_port: int
    hosts: tuple[str, ...] | None
    rank: int | None = None
    local_rank: int | None = None

    def host_of(self, rank: int, nproc_per_node: int) -> str:
        """The name of the node holding global ``rank``: ``hosts[rank // nproc_per_node]``, else ``"node N"``."""
        node = rank // nproc_per_node
        if self.hosts is not None and 0 <= node < len(self.hosts):
            return self.hosts[node]
        return f"node {node}"


def _fail(flag: str, msg: str) -> ConfigError:
    return ConfigError(f"--{flag}: {msg}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def validate_node_flags(cfg: Config) -> None:
    """Check the node flags that need no environment: ``nnodes >= 1``, ``node_rank >= 0``, ``max_restarts >= 0``
    (:func:`msf.cfg.validation.validate` checks them too, with all other flags).

    Raises:
        ConfigError: every invalid one, a line each.
    """
    p = Problems()
    check_node_flags(cfg, p)
    p.raise_if_any()


def discover(
    cfg: Config,
    given: set[str],
    environ: Mapping[str, str] | None = None,
    scontrol: str = "scontrol",
) -> NodePlan:
    """Decide this process's place in the job from the flags and the environment.

    Precedence: torchrun's environment, then an explicit ``--hosts``, then Slurm
    (``SLURM_JOB_NODELIST`` and ``SLURM_PROCID`` set: a step of ``srun`` when ``SLURM_STEP_ID`` is
    set too, else the batch script of ``sbatch``), then a single node.

    Args:
        cfg: the parsed flags.
        given: names of the flags given explicitly (explicit node flags must agree with
            torchrun's or Slurm's environment).
        environ: the environment to read; ``os.environ`` when ``None``.
        scontrol: the ``scontrol`` executable that expands the step's node list.

    Returns:
        The :class:`NodePlan` of this process.

    Raises:
        ConfigError: a node flag is invalid, disagrees with torchrun's or Slurm's
            environment, a host cannot be resolved, the environment is inconsistent, or
            ``scontrol`` is missing or fails.
    """
    env = os.environ if environ is None else environ
    validate_node_flags(cfg)
    if "TORCHELASTIC_RUN_ID" in env:
        return _from_torchrun(cfg, given, env)
    if cfg.hosts is not None:
        return _from_hosts(cfg, cfg.hosts)
    if "SLURM_JOB_NODELIST" in env and "SLURM_PROCID" in env:
        if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env:
            return _from_slurm(cfg, given, env, scontrol)
        return _from_slurm_batch(cfg, given, env)
    return _single(cfg)


def _check_node_rank(node_rank: int, nnodes: int) -> None:
    if not 0 <= node_rank < nnodes:
        raise _fail("node_rank", f"must be in [0, nnodes) = [0, {nnodes}), got {node_rank}")


def _port(cfg: Config, independent: bool) -> int:
    """``--master_port``; 0 means 29500 when processes start independently and must agree on the port."""
    if cfg.master_port == 0 and independent:
        return DEFAULT_MASTER_PORT
    return cfg.master_port


def _single(cfg: Config) -> NodePlan:
    if cfg.nnodes != 1:
        raise _fail(
            "hosts",
            f"required with --nnodes={cfg.nnodes} outside torchrun and Slurm: give the "
            f"{cfg.nnodes} nodes' host names in node-rank order (--hosts=hostA,hostB,...), "
            "or start every node with torchrun or srun",
        )
    _check_node_rank(cfg.node_rank, 1)
    return NodePlan(
        source="single",
        launcher="local",
        nnodes=1,
        node_rank=0,
        nproc_per_node=cfg.nproc_per_node,
        master_addr=LOCALHOST,
        master_port=cfg.master_port,
        hosts=None,
    )


def _parse_hosts(spec: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in spec.split(","))
    if any(not h for h in hosts):
        raise _fail("hosts", f"must be comma-separated host names or addresses without empty entries, got {spec!r}")
    return hosts


def _resolve(host: str) -> None:
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        raise _fail(
            "hosts",
            f"cannot resolve {host!r} ({_one_line(str(e))}); every host must be a name or "
            "address that every node can reach",
        ) from None


def _from_hosts(cfg: Config, spec: str) -> NodePlan:
    hosts = _parse_hosts(spec)
    if len(hosts) != cfg.nnodes:
        raise _fail(
            "hosts",
            f"lists {len(hosts)} host(s) but --nnodes={cfg.nnodes}; give exactly one host per node, in node-rank order",
        )
    _check_node_rank(cfg.node_rank, cfg.nnodes)
    for host in hosts:
        _resolve(host)
    return NodePlan(
        source="hosts",
        launcher="local",
        nnodes=cfg.nnodes,
        node_rank=cfg.node_rank,
        nproc_per_node=cfg.nproc_per_node,
        master_addr=hosts[0],
        master_port=_port(cfg, independent=cfg.nnodes > 1),
        hosts=hosts,
    )


def _env_int(env: Mapping[str, str], names: tuple[str, ...], flag: str, who: str) -> int:
    """The first of ``names`` set in ``env``, as an integer."""
    return _env_int_named(env, names, flag, who)[1]


def _env_int_named(env: Mapping[str, str], names: tuple[str, ...], flag: str, who: str) -> tuple[str, int]:
    """The first of ``names`` set in ``env`` and its value as an integer (the name, for messages)."""
    for name in names:
        if name in env:
            value = env[name]
            try:
                return name, int(value)
            except ValueError:
                raise _fail(flag, f"{who} sets {name}={value!r}, not an integer") from None
    raise _fail(flag, f"{who} does not set {' or '.join(names)}")


def _agree(given: set[str], flag: str, ours, theirs, who: str) -> None:
    if flag in given and ours != theirs:
        raise _fail(flag, f"{ours} disagrees with {who}, which says {theirs}; drop the flag or make them agree")


def _from_torchrun(cfg: Config, given: set[str], env: Mapping[str, str]) -> NodePlan:
    who = "torchrun's environment"
    world = _env_int(env, ("WORLD_SIZE",), "nnodes", who)
    per_node = _env_int(env, ("LOCAL_WORLD_SIZE",), "nproc_per_node", who)
    rank = _env_int(env, ("RANK",), "node_rank", who)
    local_rank = _env_int(env, ("LOCAL_RANK",), "node_rank", who)
    if per_node < 1 or world < 1 or world % per_node != 0:
        raise _fail(
            "nproc_per_node",
            f"{who} has WORLD_SIZE={world}, not a multiple of LOCAL_WORLD_SIZE={per_node}; "
            "start the same --nproc_per_node on every node",
        )
    nnodes = world // per_node
    node_rank = _env_int(env, ("GROUP_RANK",), "node_rank", who) if "GROUP_RANK" in env else rank // per_node
    if not (0 <= local_rank < per_node and 0 <= node_rank < nnodes and rank == node_rank * per_node + local_rank):
        raise _fail(
            "node_rank",
            f"{who} is inconsistent: RANK={rank}, LOCAL_RANK={local_rank}, GROUP_RANK={node_rank}, "
            f"LOCAL_WORLD_SIZE={per_node}, WORLD_SIZE={world}; expected "
            "RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK",
        )
    _agree(given, "nnodes", cfg.nnodes, nnodes, f"{who} (WORLD_SIZE / LOCAL_WORLD_SIZE = {nnodes})")
    _agree(given, "node_rank", cfg.node_rank, node_rank, f"{who} (GROUP_RANK = {node_rank})")
    _agree(given, "nproc_per_node", cfg.nproc_per_node, per_node, f"{who} (LOCAL_WORLD_SIZE = {per_node})")
    if "hosts" in given and cfg.hosts is not None:
        n_hosts = len(_parse_hosts(cfg.hosts))
        if n_hosts != nnodes:
            raise _fail(
                "hosts", f"lists {n_hosts} host(s) but {who} has {nnodes} node(s); drop the flag under torchrun"
            )
    master_addr = env.get("MASTER_ADDR", "")
    if not master_addr:
        raise _fail("hosts", f"{who} does not set MASTER_ADDR, the rendezvous host")
    master_port = _env_int(env, ("MASTER_PORT",), "master_port", who)
    return NodePlan(
        source="torchrun",
        launcher="torchrun",
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=per_node,
        master_addr=master_addr,
        master_port=master_port,
        hosts=None,
        rank=rank,
        local_rank=local_rank,
    )


def _slurm_hostnames(name: str, nodelist: str, scontrol: str) -> tuple[str, ...]:
    """The node names of ``nodelist``, expanded by ``scontrol show hostnames``."""
    cmd = [scontrol, "show", "hostnames", nodelist]
    shown = " ".join(cmd)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise _fail(
            "hosts",
            f"cannot expand {name}={nodelist!r}: {scontrol!r} not found (ran '{shown}'); "
            "put Slurm's scontrol on PATH, or give --hosts",
        ) from None
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _fail(
            "hosts",
            f"cannot expand {name}={nodelist!r}: '{shown}' failed ({_one_line(str(e))}); give --hosts instead",
        ) from None
    if done.returncode != 0:
        err = _one_line(done.stderr or "") or "no message"
        raise _fail(
            "hosts",
            f"cannot expand {name}={nodelist!r}: '{shown}' exited with {done.returncode} ({err}); give --hosts instead",
        )
    return tuple(line.strip() for line in done.stdout.splitlines() if line.strip())


def _from_slurm_batch(cfg: Config, given: set[str], env: Mapping[str, str]) -> NodePlan:
    """The batch script of an ``sbatch`` job: one process on the allocation's first node. Its ``SLURM_NTASKS``
    is what ``srun`` would start, not processes that exist, so it is not read: taken for ranks, they would
    be waited for until ``--dist_timeout``."""
    name, nnodes = _env_int_named(env, ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), "nnodes", "Slurm")
    if nnodes > 1 and not ("nnodes" in given and cfg.nnodes == 1):
        job = env.get("SLURM_JOB_ID", "?")
        raise _fail(
            "nnodes",
            f"this is the batch script of Slurm job {job} over {name}={nnodes} nodes, which runs on the first "
            "node only: start msf-train with srun in it (srun --ntasks-per-node=1 msf-train ...), or give "
            "--nnodes=1 to train on this node alone",
        )
    return _single(cfg)


def _from_slurm(cfg: Config, given: set[str], env: Mapping[str, str], scontrol: str) -> NodePlan:
    """A task of an ``srun`` step. The step's own variables come first: a step may run on part of the
    allocation, and then ``SLURM_JOB_NODELIST`` and ``SLURM_JOB_NUM_NODES`` are the allocation's."""
    who = "Slurm"
    nn_name, nnodes = _env_int_named(
        env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "nnodes", who
    )
    node_rank = _env_int(env, ("SLURM_NODEID",), "node_rank", who)
    procid = _env_int(env, ("SLURM_PROCID",), "node_rank", who)
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise _fail("node_rank", f"{who} sets SLURM_NODEID={node_rank}, outside [0, {nn_name}={nnodes})")
    _agree(given, "nnodes", cfg.nnodes, nnodes, f"{who} ({nn_name} = {nnodes})")
    _agree(given, "node_rank", cfg.node_rank, node_rank, f"{who} (SLURM_NODEID = {node_rank})")
    nt_name, ntasks = _env_int_named(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "nproc_per_node", who)
    if nnodes == 1 and ntasks == 1:
        return _single(cfg)

    layouts = (
        "valid layouts: one task per node (srun --ntasks-per-node=1; each task starts its node's device "
        "groups) or one task per device group (the same k > 1 tasks on every node, ntasks = nnodes x k)"
    )
    if ntasks < nnodes or ntasks % nnodes != 0:
        raise _fail("nproc_per_node", f"{who} runs {nt_name}={ntasks} task(s) on {nn_name}={nnodes} node(s); {layouts}")
    per_node = ntasks // nnodes
    if nnodes == 1:
        hosts = None
        master_addr = LOCALHOST
    else:
        nl_name = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in env else "SLURM_JOB_NODELIST"
        nodelist = env[nl_name]
        hosts = _slurm_hostnames(nl_name, nodelist, scontrol)
        if len(hosts) != nnodes:
            raise _fail(
                "nnodes",
                f"'{scontrol} show hostnames {nodelist}' gives {len(hosts)} host(s) but "
                f"{nn_name}={nnodes}; run srun over the whole allocation, or give --hosts",
            )
        master_addr = hosts[0]

    if per_node == 1:
        return NodePlan(
            source="slurm",
            launcher="local",
            nnodes=nnodes,
            node_rank=node_rank,
            nproc_per_node=cfg.nproc_per_node,
            master_addr=master_addr,
            master_port=_port(cfg, independent=nnodes > 1),
            hosts=hosts,
        )

    _agree(
        given,
        "nproc_per_node",
        cfg.nproc_per_node,
        per_node,
        f"{who} (one task per device group: {nt_name} / {nn_name} = {per_node})",
    )
    local_rank = _env_int(env, ("SLURM_LOCALID",), "nproc_per_node", who)
    if not (0 <= local_rank < per_node and procid == node_rank * per_node + local_rank):
        raise _fail(
            "nproc_per_node",
            f"{who} places task SLURM_PROCID={procid} as SLURM_LOCALID={local_rank} on "
            f"SLURM_NODEID={node_rank}, but one task per device group needs {per_node} "
            "tasks on every node in block order (srun --ntasks-per-node="
            f"{per_node} --distribution=block); {layouts}",
        )
    return NodePlan(
        source="slurm",
        launcher="slurm_task",
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=per_node,
        master_addr=master_addr,
        master_port=_port(cfg, independent=True),
        hosts=hosts,
        rank=procid,
        local_rank=local_rank,
    )
