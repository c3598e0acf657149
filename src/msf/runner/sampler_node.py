"""A sampler node: rollout and inference workers on this machine's CPUs, fed the newest weights by a job and
sending it every finished trajectory (``msf-sampler``, :mod:`msf.sampler`).

It asks the job for its config (``hello`` -> ``config``), builds the env and the model from it with its own worker
counts, joins (``join`` -> ``accept`` or ``refuse``, on :func:`~msf.sampling.wire.shape_hash`) and then runs the
same workers as a device group (:class:`~msf.sampling.process_sampler.ProcessSampler` over its own trajectory
buffer and published weights). Its loop, in place of a learner: copy each announced trajectory out of the buffer,
hand the slot back, send the copy; forward finished episodes; load the weights the job sends. Sends wait (the job's
back-pressure) but never blindly: the loop keeps reading the job's messages, and a job silent for
``connect_timeout`` seconds ends the node.

A job of several device groups (group R listens on the port + R) names them in its accept message: the node then
joins each group on a link of its own and sends each trajectory message to the group with the most room in its
window (:mod:`~msf.sampling.wire`'s flow control). The groups' learners take in lockstep (DDP), so their credits
come back at one pace and every group gets an equal share of the node's trajectories.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import random
import socket
import threading
import time
from typing import Any

import numpy as np
import torch
import zmq

import msf
from msf.cfg.config import Config, Derived
from msf.envs.registry import env_config_of, env_info_key, env_spaces
from msf.model.actor_critic import ActorCritic
from msf.runtime.spawning import start_fork_server, stop_fork_server, use_quiet_executable
from msf.sampling import wire
from msf.sampling.messages import EpisodeStats, SlotsReturned
from msf.sampling.plan import DeviceGroup
from msf.sampling.process_sampler import ProcessSampler
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")

HELLO_EVERY_S = 1.0  # while no job answers, the hello is sent again this often
VERSIONS = {"msf_version": msf.__version__, "wire": wire.WIRE_VERSION}  # what a job checks in hello and join
SILENT_REJOIN_S = 3.0  # the job silent this long (it pings every second): say hello again (a restarted job)


class Refused(RuntimeError):
    """The job refused this node, or the node's input is bad (exit 2)."""


class JobLost(RuntimeError):
    """No job answered within ``--connect_timeout`` (exit 1); the message names the address."""


class JobLink:
    """The node's DEALER socket to the job, signing every message with ``key`` and numbering it (``seq``).

    Args:
        address: ``HOST:PORT`` as given (for messages). endpoint: ``tcp://IP:PORT`` (resolved). key: the HMAC key.
        timeout_s: ``--connect_timeout``. name: the node's name in the job's books and its routing id (by
            default ``HOST:PID-XXXX``, four random hex digits, since two nodes can share a host name and a pid:
            containers on the host's network; the job's socket ignores a second peer with a routing id it has).
    """

    def __init__(self, address: str, endpoint: str, key: bytes, timeout_s: float, name: str | None = None):
        self.address, self.key, self.timeout_s = address, key, timeout_s
        self.name = name or f"{socket.gethostname()}:{os.getpid()}-{os.urandom(2).hex()}"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, self.name.encode())
        self.sock.setsockopt(zmq.SNDHWM, 16)  # a few messages ahead of the job: the rest waits in the workers
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(endpoint)
        self.endpoint = endpoint
        self.sent = 0  # trajectories sent on this link
        self.window, self.done = 1, 0  # flow control: at most `window` trajectories sent and not yet done
        self.group = 0  # the device group it joined (group 0 sends the weights)
        self.join_header: dict = {}  # what a rejoin sends again
        self.seq = 0
        self.heard = time.monotonic()
        self.bytes_sent = 0

    def send(self, kind: str, header: dict, payload: list = (), wait_s: float = 0.0) -> bool:  # type: ignore[assignment]
        """Send one message; False: the job's queue stayed full for ``wait_s`` seconds (nothing was sent)."""
        self.seq += 1
        frames = wire.sign(self.key, kind, {**header, "seq": self.seq}, payload)
        if self.sock.poll(int(wait_s * 1000), zmq.POLLOUT):
            self.sock.send_multipart(frames, zmq.NOBLOCK)
            self.bytes_sent += sum(map(len, frames))
            return True
        self.seq -= 1
        return False

    def recv(self, timeout_s: float) -> tuple[str, dict, list[bytes]] | None:
        """The next authenticated message of the job, or None within ``timeout_s`` (anything unauthenticated is
        dropped)."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        frames = self.sock.recv_multipart()
        try:
            msg = wire.verify(self.key, frames)
        except (PermissionError, wire.Malformed) as e:
            log.warning("a message from %s dropped: %s", self.address, e)
            return None
        self.heard = time.monotonic()
        return msg

    def room(self) -> int:
        """How many more trajectories fit in this link's window now."""
        return self.window - (self.sent - self.done)

    def silent_for(self) -> float:
        return time.monotonic() - self.heard

    def close(self) -> None:
        self.sock.close(linger=1000)
        self.ctx.term()


@dataclasses.dataclass
class NodeSettings:
    """What ``msf-sampler`` sets itself: its workers, and optionally the env it expects (a check, not a choice)."""

    num_workers: int
    num_envs_per_worker: int
    env: str | None = None


def node_config(job: dict, s: NodeSettings) -> Config:
    """The job's config with this node's workers (one device group, one inference worker per policy, its own
    seed); ``s.env`` replaces the env when given (the job then refuses the node if it differs)."""
    cfg = Config.from_dict(job)
    splits = 2 if s.num_envs_per_worker % 2 == 0 else 1
    return dataclasses.replace(
        cfg,
        num_workers=s.num_workers,
        num_envs_per_worker=s.num_envs_per_worker,
        worker_num_splits=splits,
        policy_workers_per_policy=1,
        nproc_per_node=1,
        nnodes=1,
        sampler_port=0,
        serial_mode=False,
        seed=random.SystemRandom().randrange(2**31),
        env=s.env or cfg.env,
        env_args=job.get("env_args", {}),
    )


class SamplerNode:
    """Join the job behind ``link``, then sample for it until it ends (:meth:`run`).

    Args:
        link: the connection. settings: the node's own workers. stop: set to stop (a signal).
    """

    def __init__(self, link: JobLink, settings: NodeSettings, stop: threading.Event):
        self.link, self.settings, self.stop = link, settings, stop
        self.links = [link]  # one per device group of the job, the one ``--connect`` names first
        self.versions: dict[int, int] = {}  # per policy, the version of the weights loaded
        self.sampler: ProcessSampler | None = None
        self.sampled = 0  # trajectories taken from this node's workers
        self.unsent = 0  # of those, not yet sent on any link
        self.last_ping = 0.0

    @property
    def sent_trajectories(self) -> int:
        return sum(link.sent for link in self.links)

    @property
    def bytes_sent(self) -> int:
        return sum(link.bytes_sent for link in self.links)

    # --- joining ------------------------------------------------------------------------------
    def _await(
        self, kinds: tuple[str, ...], resend: tuple[str, dict] | None, link: JobLink | None = None
    ) -> tuple[str, dict, list[bytes]]:
        """The job's next message of ``kinds`` on ``link`` (default: the first; ``refuse`` raises), sending
        ``resend`` every second meanwhile."""
        link = link or self.link
        deadline, last = time.monotonic() + link.timeout_s, 0.0
        while time.monotonic() < deadline and not self.stop.is_set():
            if resend is not None and time.monotonic() - last >= HELLO_EVERY_S:
                last = time.monotonic()
                link.send(*resend)
            msg = link.recv(0.1)
            if msg is None:
                continue
            if msg[0] == "refuse":
                raise Refused(f"the job at {link.address} refused this sampler: {msg[1].get('reason')}")
            if msg[0] == "end":
                raise Refused(f"the job at {link.address} ended ({msg[1].get('reason')})")
            if msg[0] in kinds:
                return msg
        if self.stop.is_set():
            raise KeyboardInterrupt
        raise JobLost(
            f"no job answered at {link.address} within {link.timeout_s:g} s (--connect_timeout): is "
            "msf-train running there with --sampler_port, and does --sampler_key_file hold its key?"
        )

    def join(self) -> tuple[Config, Any, ActorCritic]:
        """Hello, config, join, accept: the node's config, the env's spaces and a CPU model.

        Raises:
            Refused: the job refused (another msf version, env or shape). JobLost: no answer in time.
        """
        _, header, _ = self._await(("config",), ("hello", dict(VERSIONS)))
        cfg = node_config(header["config"], self.settings)
        spaces = env_spaces(cfg.env, env_config_of(cfg))
        model = ActorCritic(cfg, spaces)
        shape = wire.shape_hash(env_info_key(cfg), spaces, model, cfg)
        workers = f"{cfg.num_workers} workers x {cfg.num_envs_per_worker} envs"
        join = {**VERSIONS, "env": cfg.env, "shape_hash": shape, "workers": workers}
        self.link.join_header = join
        accept = self._await(("accept",), ("join", join))[1]
        self._accepted(self.link, accept)
        self._join_other_groups(accept, join)
        return cfg, spaces, model

    def _join_other_groups(self, accept: dict, join: dict) -> None:
        """Join every other device group the accept message names (group R at the port of group 0 + R)."""
        group, groups = accept.get("group", 0), accept.get("groups", 1)
        if not (isinstance(group, int) and isinstance(groups, int) and 0 <= group < groups <= 1024):
            return
        host, _, port = self.link.address.rpartition(":")
        ip, _, _ = self.link.endpoint.rpartition(":")
        for g in range(groups):
            if g == group:
                continue
            p = int(port) - group + g
            link = JobLink(f"{host}:{p}", f"{ip}:{p}", self.link.key, self.link.timeout_s, self.link.name)
            link.join_header = join
            self.links.append(link)
            self._accepted(link, self._await(("accept",), ("join", join), link)[1])
        log.info("sampler node: joined %d device group(s) of the job at %s", len(self.links), self.link.address)

    @staticmethod
    def _accepted(link: JobLink, header: dict) -> None:
        """The job's ``window`` (flow control, :mod:`msf.sampling.wire`); nothing sent before counts against it."""
        window, group = header.get("window"), header.get("group")
        link.window = window if isinstance(window, int) and window > 0 else 1
        link.group = group if isinstance(group, int) else 0
        link.done = link.sent

    # --- sampling -----------------------------------------------------------------------------
    def run(self) -> str:
        """Join, start the workers, sample until the job ends or a stop; return the job's end reason (``ended``,
        ``failed``) or ``stopped``.

        Raises:
            Refused, JobLost: as :meth:`join`; JobLost also when the job goes silent for ``--connect_timeout``.
            ComponentFailed, ChildDied: a worker failed.
        """
        cfg, spaces, model = self.join()
        derived = Derived.of(cfg, spaces.num_agents)
        buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
        weights = [PublishedWeights(model) for _ in range(cfg.num_policies)]
        self.fields = wire.trajectory_fields(TrajectoryBuffer.layout(cfg, derived, spaces))
        self.model, self.weights, self.buffer = model, weights, buffer
        self._receive_until_weights(next((k for k in self.links if k.group == 0), self.link))
        use_quiet_executable()
        start_fork_server()
        log.info("sampler node: %d rollout worker(s) x %d envs of %s for %s", cfg.num_workers,
                 cfg.num_envs_per_worker, cfg.env, self.link.address)  # fmt: skip
        self.sampler = ProcessSampler(cfg, derived, spaces, DeviceGroup(buffer, weights))
        try:
            while not self.stop.is_set():
                self.sampler.advance()
                end = self._receive(0.0)
                if end is not None:
                    return end
                self._send_trajectories()
                self._send_episodes()
                self._ping()
        except _Ended as e:
            return str(e.args[0])
        return "stopped"

    def close(self, reason: str) -> None:
        """Say bye (unless the job ended, or the node never sent its join), stop the workers, close the socket."""
        for link in self.links:
            if reason == "stopped" and link.join_header:
                link.send("bye", {"sampled": self._sampled(link)}, wait_s=0.5)
        if self.sampler is not None:
            self.sampler.close()
            stop_fork_server()
        for link in self.links:
            link.close()

    def _receive_until_weights(self, link: JobLink | None = None) -> None:
        """Device group 0 sends its weights right after accepting: load them before any worker acts."""
        _, header, payload = self._await(("weights",), None, link)
        self._load_weights(header, payload)

    def _receive(self, timeout_s: float) -> str | None:
        """Handle the job's messages on every link; return its end reason when it ends.

        Raises:
            JobLost: a link silent for ``--connect_timeout``. Refused: refused on a rejoin.
        """
        for link in self.links:
            end = self._receive_on(link, timeout_s)
            timeout_s = 0.0
            if end is not None:
                return end
        return None

    def _receive_on(self, link: JobLink, timeout_s: float) -> str | None:
        while True:
            msg = link.recv(timeout_s)
            timeout_s = 0.0
            if msg is None:
                break
            kind, header, payload = msg
            if isinstance(header.get("done"), int):
                link.done = max(link.done, header["done"])
            if kind == "end":
                return str(header.get("reason"))
            if kind == "weights":
                self._load_weights(header, payload)
            elif kind == "refuse":
                raise Refused(f"the job at {link.address} refused this sampler: {header.get('reason')}")
            elif kind == "accept":  # a rejoin's
                self._accepted(link, header)
            elif kind == "config":  # a rejoin's: the job must still be the one this node samples for
                link.send("join", link.join_header, wait_s=1.0)
        silent = link.silent_for()
        if silent >= link.timeout_s:
            raise JobLost(
                f"lost the job at {link.address}: nothing heard for {silent:.0f} s (--connect_timeout="
                f"{link.timeout_s:g})"
            )
        if silent >= SILENT_REJOIN_S:
            link.send("hello", dict(VERSIONS), wait_s=0.0)
        return None

    def _load_weights(self, header: dict, payload: list[bytes]) -> None:
        """Load a policy's weights unless those loaded are as new."""
        p, version = header.get("policy"), header.get("version")
        if not isinstance(p, int) or not 0 <= p < len(self.weights) or not isinstance(version, int):
            return
        if version <= self.versions.get(p, -1):
            return
        state = self.model.state_dict()
        if len(payload) != len(state):
            log.warning("weights from %s with %d tensors, %d expected: ignored", self.link.address, len(payload),
                        len(state))  # fmt: skip
            return
        with torch.no_grad():
            for t, raw in zip(state.values(), payload):  # one copy, straight into the model's tensor
                t.numpy().reshape(-1)[:] = np.frombuffer(raw, dtype=t.numpy().dtype)
        self.weights[p].publish(self.model, version)
        self.versions[p] = version

    def _send_trajectories(self) -> None:
        assert self.sampler is not None
        try:
            msg = self.sampler.full_queue.get(timeout=0.02)
        except queue.Empty:
            return
        slots = torch.tensor(msg.slots, dtype=torch.int64)
        batch = self.buffer.gather(slots)
        policies = self.buffer.slot_policy.index_select(0, slots).tolist()
        self.sampler.free_queues[msg.worker].put(SlotsReturned(msg.slots))  # copied: the worker may write them again
        self.sampled += len(policies)
        self.unsent += len(policies)
        step = wire.MAX_TRAJECTORIES_PER_MESSAGE
        for i in range(0, len(policies), step):
            part = {k: v[i : i + step] for k, v in batch.items()}
            n = len(policies[i : i + step])
            link = self._await_credit(n)
            header = {"policies": policies[i : i + step], "sent": link.sent + n, "sampled": self._sampled(link, n)}
            self._send_waiting(link, "traj", header, wire.pack_trajectories(part, self.fields))
            link.sent += n
            self.unsent -= n

    def _sampled(self, link: JobLink, sending: int = 0) -> int:
        """The trajectories this node counts against ``link`` (the wire's ``sampled``): those sent on it, with
        ``sending`` more about to be; on the first link also those taken from the workers and not yet sent on any
        (a job of one device group: every trajectory the node sampled)."""
        return link.sent + sending + (self.unsent - sending if link is self.link else 0)

    def _ping(self) -> None:
        """Every second, a ping on every link: a sign of life, with the node's books (``sampled``)."""
        if time.monotonic() - self.last_ping >= 1.0:
            self.last_ping = time.monotonic()
            for link in self.links:
                link.send("ping", {"sampled": self._sampled(link)}, wait_s=0.0)

    def _send_waiting(self, link: JobLink, kind: str, header: dict, payload: list) -> None:
        """Send, waiting while the job's queue is full (its back-pressure), reading its messages meanwhile."""
        while not link.send(kind, header, payload, wait_s=0.1):
            end = self._receive(0.0)
            if end is not None or self.stop.is_set():
                raise _Ended(end or "stopped")

    def _await_credit(self, n: int) -> JobLink:
        """The link (device group) with the most room in its window once ``n`` more trajectories fit there (or
        it has none in flight), reading the job's messages meanwhile; on a tie the one least sent to."""
        while True:
            link = max(self.links, key=lambda k: (k.room(), -k.sent))
            if link.room() >= n or link.sent == link.done:
                return link
            self._ping()  # the job hears from it while the learner is the slower side
            end = self._receive(0.05)
            if end is not None or self.stop.is_set():
                raise _Ended(end or "stopped")

    def _send_episodes(self) -> None:
        assert self.sampler is not None
        returns: list[float] = []
        lengths: list[int] = []
        policies: list[int] = []
        while True:
            try:
                s: EpisodeStats = self.sampler.stats_queue.get_nowait()
            except queue.Empty:
                break
            returns += map(float, s.returns)
            lengths += map(int, s.lengths)
            policies += map(int, s.policies)
        if returns:
            stats = {"returns": returns, "lengths": lengths, "policies": policies, "sampled": self._sampled(self.link)}
            self._send_waiting(self.link, "stats", stats, [])


class _Ended(Exception):
    """The job ended (or a stop came) while a send waited: the reason, as :meth:`SamplerNode.run` returns it."""
