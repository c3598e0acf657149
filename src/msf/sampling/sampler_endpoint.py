"""The job's end of its sampler nodes: a ZeroMQ ROUTER socket served by one thread of the device group's process.

The thread answers handshakes (:mod:`msf.sampling.wire`: hello -> config, join -> accept or refuse), checks every
trajectory message whole (:func:`~msf.sampling.wire.unpack_trajectories`) before anything of it touches the
trajectory buffer, writes an accepted one into free slots of the buffer's remote range
(:attr:`~msf.cfg.config.Derived.remote_slots`) and announces them on the training loop's full queue as
:class:`~msf.sampling.messages.FullTrajectories` of the virtual worker ``first_worker + source``; the batcher
returns their slots on :attr:`SamplerEndpoint.returned`. The loop sees them as it sees a rollout worker's: same
batcher, same lag rule, same books.

Back-pressure: with no free remote slot, the thread holds the one message it checked (``parked``) and reads no
more until slots come back. Each sampler keeps at most ``window`` trajectories in flight or in the buffer
(:mod:`~msf.sampling.wire`'s flow control): the thread tells it whenever the learner took some of its trajectories
(``credit``) and every second (``ping``) how many it has accounted for; its rollout workers wait for slots meanwhile.
Weights: device group 0 sends each joined sampler the newest version of every policy that changed (the replicas'
weights are equal, so the other groups send none), paced per sampler (:func:`weights_interval`): at most every
:data:`WEIGHTS_EVERY_S`, at least every :data:`WEIGHTS_LATEST_S`, and in between so that the weights cost its link
about what its trajectories do, or :data:`WEIGHTS_FREE_BYTES_S`, whichever is more. Only this thread touches the
sockets (ZeroMQ sockets are not thread-safe); the training loop's thread reads the counters.
"""

from __future__ import annotations

import collections
import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

import msf
from msf.cfg.config import Config, Derived
from msf.sampling import wire
from msf.sampling.messages import EpisodeStats, FullTrajectories, SlotsReturned
from msf.sampling.protocol import Outbox
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")

PING_EVERY_S = 1.0  # a sign of life to every joined sampler
SILENT_S = 10.0  # a sampler not heard from for this long is counted as gone
WEIGHTS_EVERY_S = 0.1  # at most this often, a new version's weights to a sampler
WEIGHTS_LATEST_S = 1.0  # at least this often (when the version changed)
WEIGHTS_FREE_BYTES_S = 10e6  # a weights stream any link carries unnoticed (8% of 1 Gb/s), bytes per second
_REFUSED_HANDSHAKES = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def bind_address(cfg: Config) -> str:
    """``--sampler_bind``, or the rendezvous address: 127.0.0.1 for one node (the only layout this version runs)."""
    return cfg.sampler_bind or "127.0.0.1"


def join_address(cfg: Config) -> str:
    """``HOST:PORT`` a sampler node gives to ``--connect``: device group 0's port (a node joins every group from
    there) on the bind address, or this host's name when it binds every interface (``0.0.0.0``, ``::``), an
    address no other machine can connect to."""
    host = bind_address(cfg)
    if host in ("0.0.0.0", "::", "*"):
        host = socket.gethostname()
    return f"{host}:{cfg.sampler_port}"


def check_sampler_port(cfg: Config) -> str | None:
    """Why a sampler port (``--sampler_port`` + R for device group R) cannot be listened on (one line naming the
    flag), or None: they can (then they are free again: the device groups bind them)."""
    if not cfg.sampler_port:
        return None
    addr = bind_address(cfg)
    for port in range(cfg.sampler_port, cfg.sampler_port + (cfg.nproc_per_node or 1)):
        try:
            infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
        except OSError as e:
            return f"--sampler_bind: cannot resolve {addr!r}: {e}"
        family, _, _, _, sockaddr = infos[0]
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
        except OSError as e:
            return f"--sampler_port={cfg.sampler_port}: cannot listen on {addr}:{port}: {e.strerror or e}"
        finally:
            s.close()
    return None


def _refusal(cfg: Config, shape_hash: str, kind: str, header: dict) -> str | None:
    """Why a ``hello`` or ``join`` is refused (another msf version or wire format, env or shape), or None."""
    version, form, why = header.get("msf_version"), header.get("wire", 1), None
    if version != msf.__version__ or form != wire.WIRE_VERSION:
        ours = f"{msf.__version__} (wire format {wire.WIRE_VERSION})"
        why = f"msf version {version} (wire format {form}), the job runs {ours}"
    elif kind == "join" and header.get("env") != cfg.env:
        why = f"env {header.get('env')!r}, the job trains {cfg.env!r}"
    elif kind == "join" and header.get("shape_hash") != shape_hash:
        why = "what shapes its trajectories (env flags, spaces, model, rollout) differs from the job's"
    return why


def weights_interval(weights_bytes: int, trajectory_bytes_s: float) -> float:
    """Seconds between two weights messages to one sampler: the time its link takes to carry ``weights_bytes``
    (one version of every policy) at the rate of its trajectories (``trajectory_bytes_s``, bytes per second
    received from it) or at :data:`WEIGHTS_FREE_BYTES_S`, whichever is faster, within
    [:data:`WEIGHTS_EVERY_S`, :data:`WEIGHTS_LATEST_S`]: the weights stream costs a link at most about what the
    sampler sends on it, or a rate too small to matter, and the sampler's policy is at most about a second old."""
    return min(WEIGHTS_LATEST_S, max(WEIGHTS_EVERY_S, weights_bytes / max(trajectory_bytes_s, WEIGHTS_FREE_BYTES_S)))


@dataclass
class Source:
    """One sampler node, as the job counts it (trajectories unless said; agent steps are these x rollout)."""

    index: int
    name: str
    ident: bytes = b""  # its ZeroMQ routing id
    seq: int = 0  # the last message sequence number taken from it
    sent: int = 0  # trajectories it says it has sent (the newest trajectory message's count)
    sampled: int = 0  # trajectories it counts against this group, sent or not (its newest message's count)
    received: int = 0  # written into the buffer and announced
    taken: int = 0  # of those, copied out of the buffer by the learner (their slots came back)
    rejected: int = 0  # in messages that failed their checks
    episodes: int = 0
    bytes: int = 0
    weights_sent: int = 0  # weights messages sent to it (one policy's version each)
    weights_bytes: int = 0
    weights_due: float = 0.0  # when its next weights may go, at the earliest (the joined_s clock)
    versions: dict[int, int] = field(default_factory=dict)  # per policy, the version sent to it
    lag_sum: float = 0.0  # policy lag (versions) of the received trajectories at arrival
    last_heard: float = field(default_factory=time.monotonic)
    left: bool = False  # said bye, or went silent
    workers: str = ""
    joined_s: float = 0.0  # when it first joined, in seconds since the endpoint began listening
    first_trajectory_s: float | None = None  # when its first trajectory entered the buffer (same clock)

    def note_books(self, header: dict) -> None:
        """Take the sampler's own counts from a message's header (:mod:`~msf.sampling.wire`'s ``sent`` and
        ``sampled``; what is not an int is ignored)."""
        sent, sampled = header.get("sent"), header.get("sampled")
        if isinstance(sent, int):
            self.sent = max(self.sent, sent)
        if isinstance(sampled, int):
            self.sampled = sampled

    def weights_went(self, now_s: float, sent: int) -> None:
        """``sent`` bytes of weights went to it at ``now_s`` (the ``joined_s`` clock): count them and pace its next
        (:func:`weights_interval`, at the rate of the trajectory bytes it sent since its first)."""
        self.weights_bytes += sent
        elapsed = 0.0 if self.first_trajectory_s is None else now_s - self.first_trajectory_s
        self.weights_due = now_s + weights_interval(sent, self.bytes / elapsed if elapsed > 1.0 else 0.0)


class SignedWeights:
    """Each policy's newest published weights as one signed ``weights`` message (:mod:`~msf.sampling.wire`), made
    once per version whatever the number of samplers it goes to."""

    def __init__(self, key: bytes, weights: Sequence[PublishedWeights]):
        self.key, self.weights = key, weights
        self._signed: dict[int, tuple[int, list[bytes]]] = {}

    def newest(self, p: int) -> tuple[int, list[bytes]]:
        """Policy ``p``'s newest version and its signed message's frames."""
        cached = self._signed.get(p)
        if cached is None or cached[0] != self.weights[p].version:
            version, tensors = self.weights[p].snapshot()
            frames = wire.sign(self.key, "weights", {"policy": p, "version": version}, [t.numpy() for t in tensors])
            cached = self._signed[p] = (version, frames)
        return cached


class SamplerEndpoint:
    """Listen for sampler nodes and feed their trajectories to the training loop (module docstring).

    Args:
        cfg, derived: the device group's config. spaces: the env's spaces (the action range checked).
        buffer: the group's trajectory buffer (its last ``derived.remote_slots`` slots are this endpoint's).
        weights: per policy, its published weights (the version a trajectory may claim, and what is sent).
        key: the HMAC key. shape_hash: :func:`~msf.sampling.wire.shape_hash` of the job.
        full_queue, stats_queue: where trajectories and episodes are announced (the training loop's inboxes).
        first_worker: the virtual worker index of source 0 (the group's rollout workers come first).
        group, groups: its local rank, and the node's groups: it listens on port + group (accept names both).

    Raises:
        zmq.ZMQError: the port cannot be bound.
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        spaces: Any,
        buffer: TrajectoryBuffer,
        weights: Sequence[PublishedWeights],
        key: bytes,
        shape_hash: str,
        full_queue: Outbox[FullTrajectories],
        stats_queue: Outbox[EpisodeStats],
        first_worker: int,
        group_of: tuple[int, int] = (0, 1),
    ):
        self.cfg, self.spaces, self.weights, self.key, self.hash = cfg, spaces, weights, key, shape_hash
        self.window = derived.trajectories_per_iteration  # a sampler's trajectories in flight, at most (wire)
        self.full_queue, self.stats_queue, self.first_worker = full_queue, stats_queue, first_worker
        self.views = buffer.numpy_views()
        self.fields = wire.trajectory_fields(TrajectoryBuffer.layout(cfg, derived, spaces))
        first_slot = cfg.num_workers * derived.slots_per_worker
        self.free = collections.deque(range(first_slot, first_slot + derived.remote_slots))
        self.returned: queue.Queue[SlotsReturned] = queue.Queue()  # the batcher's free queue for every source
        self.sources: dict[bytes, Source] = {}
        self.refused: dict[str, str] = {}  # peers that never joined: why (the first reason)
        self.rejected_connections = 0  # connections that were not ZeroMQ peers (random bytes, a port scan)
        self.group = {"group": group_of[0], "groups": group_of[1]}
        self.address = f"{bind_address(cfg)}:{cfg.sampler_port + group_of[0]}"
        self.started = time.monotonic()  # the clock of Source.joined_s and first_trajectory_s
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        per_traj = wire.max_trajectory_bytes(self.fields)
        # ZeroMQ drops the connection of a peer whose message is larger: it never reaches this process
        self._sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_TRAJECTORIES_PER_MESSAGE * per_traj + 2**20)
        self._sock.setsockopt(zmq.RCVHWM, 64)
        self._sock.setsockopt(zmq.LINGER, 1000)
        try:
            self._sock.bind(f"tcp://{self.address}")
        except zmq.ZMQError:
            self._ctx.destroy(linger=0)
            raise
        self._monitor = self._sock.get_monitor_socket(_REFUSED_HANDSHAKES)
        self._parked: tuple[Source, list[int], dict[str, np.ndarray]] | None = None
        self._slot_source: dict[int, Source] = {}  # the source of each slot in the buffer
        self._signed = SignedWeights(key, weights)
        self._last_ping = 0.0
        self._logged: set[tuple[str, str]] = set()
        self._end: str | None = None
        self._stopped = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sampler_endpoint", daemon=True)
        self._thread.start()
        log.info("sampler nodes may join at %s (msf-sampler --connect=%s)", self.address, join_address(cfg))

    # --- the loop's side ------------------------------------------------------------------------
    def connected(self) -> list[Source]:
        """The sampler nodes that joined and are neither gone nor silent."""
        return [s for s in self.sources.values() if not s.left]

    def finish(self, reason: str) -> None:
        """Tell every joined sampler that the job ends (``reason``: done, stopped or failed), close the socket and
        end the thread (within about a second). Idempotent."""
        if self._end is None:
            self._end = reason
        self._stopped.set()
        self._thread.join(timeout=5.0)

    # --- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                self._serve_once()
        except BaseException as e:  # noqa: BLE001 - the training loop raises it (SamplerEndpoint.error)
            self.error = e
        finally:
            self._close()

    def _serve_once(self) -> None:
        now = time.monotonic()
        taken = set()
        while True:
            try:
                slots = self.returned.get_nowait().slots
            except queue.Empty:
                break
            self.free.extend(slots)
            for slot in slots:
                source = self._slot_source.pop(slot)
                source.taken += 1
                taken.add(source.index)
        for source in (s for s in self.connected() if s.index in taken):
            self._reply(source.ident, "credit", {"done": self._done(source)})
        self._send_weights(now)
        if now - self._last_ping >= PING_EVERY_S:
            self._last_ping = now
            self._note_silent(now)
            for s in self.connected():  # with its books: a lost credit message does not stall it
                self._reply(s.ident, "ping", {"seq": 0, "done": self._done(s)})
        self._watch_handshakes()
        if self._parked is not None:
            if len(self.free) < len(self._parked[1]):
                time.sleep(0.005)
                return
            parked, self._parked = self._parked, None
            self._enter(*parked)
        if not self._sock.poll(20):
            return
        for _ in range(64):  # then the weights and the pings again
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(frames)
            if self._parked is not None:
                return

    def _close(self) -> None:
        if self._end is not None:
            self._broadcast(wire.sign(self.key, "end", {"reason": self._end}))
        self._monitor.close(linger=0)
        self._sock.close(linger=1000)  # the end message goes out first
        self._ctx.term()

    def _broadcast(self, frames: list[bytes], to: Sequence[Source] | None = None) -> None:
        for ident, s in self.sources.items():
            if not s.left and (to is None or s in to):
                try:
                    self._sock.send_multipart([ident, *frames], zmq.NOBLOCK)
                except zmq.Again:
                    pass  # its queue is full: it gets the next one

    def _done(self, source: Source) -> int:
        """``source``'s trajectories sent up to its newest message, but those parked or in the buffer, not taken."""
        parked = len(self._parked[1]) if self._parked is not None and self._parked[0] is source else 0
        return max(source.sent, source.received + source.rejected) - parked - (source.received - source.taken)

    def _send_weights(self, now: float, to: Sequence[Source] | None = None) -> None:
        """Group 0: the versions each of ``to`` (joining) or each whose pace allows (:func:`weights_interval`) lacks."""
        if self.group["group"] != 0:
            return
        for s in to if to is not None else self.connected():
            if to is None and now - self.started < s.weights_due:
                continue
            sent = 0
            for p, w in enumerate(self.weights):
                if to is None and w.version == s.versions.get(p):
                    continue
                s.versions[p], frames = self._signed.newest(p)
                self._broadcast(frames, [s])
                sent += sum(map(len, frames))
                s.weights_sent += 1
            if sent:
                s.weights_went(now - self.started, sent)

    def _note_silent(self, now: float) -> None:
        for s in self.sources.values():
            if not s.left and now - s.last_heard > SILENT_S and self._parked is None:
                s.left = True
                log.warning("sampler node %s: nothing heard for %.0f s: counted as gone", s.name, SILENT_S)
                self.note_waiting()

    def note_waiting(self) -> None:
        """Log, when no sampler node is connected and the group has no rollout worker, that the learner waits."""
        if not self.connected() and self.cfg.num_workers == 0:
            log.warning(
                "no sampler node is connected and this learner has no rollout worker: it waits for one to join at %s",
                self.address,
            )

    def _watch_handshakes(self) -> None:
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] & _REFUSED_HANDSHAKES:
                self.rejected_connections += 1
                if self.rejected_connections == 1:
                    log.warning("sampler port %s: a connection that is not a ZeroMQ peer was closed", self.address)

    def _once(self, who: str, what: str, line: str) -> None:
        """Log ``line`` the first time ``who`` has problem ``what``."""
        if (who, what) not in self._logged:
            self._logged.add((who, what))
            log.warning("%s", line)

    # --- messages -----------------------------------------------------------------------------
    def _handle(self, frames: list[bytes]) -> None:
        ident, frames = frames[0], frames[1:]
        # a sampler names itself HOST:PID-XXXX (its routing id); a peer that did not is named by its id's bytes
        name = ident.decode() if ident.isascii() and ident.decode().isprintable() else f"peer-{ident.hex()[:16]}"
        try:
            kind, header, payload = wire.verify(self.key, frames)
        except (PermissionError, wire.Malformed) as e:
            self.refused.setdefault(name, str(e))
            self._once(name, "auth", f"sampler node {name}: message dropped: {e}")
            return
        source = self.sources.get(ident)
        if source is not None and not source.left:
            source.last_heard = time.monotonic()
        if kind in ("hello", "join"):
            self._handshake(ident, name, kind, header)
            return
        if source is None or source.left:
            self._once(name, "unjoined", f"sampler node {name}: {kind} message before joining: dropped")
            return
        seq = header.get("seq")
        if not isinstance(seq, int) or seq <= source.seq:
            self._once(name, "seq", f"sampler node {name}: message out of sequence (a replay?): dropped")
            return
        source.seq = seq
        source.bytes += sum(map(len, frames))
        source.note_books(header)
        if kind == "traj":
            self._trajectories(source, header, payload)
        elif kind == "stats":
            self._episodes(source, header)
        elif kind == "bye":
            source.left = True
            log.info("sampler node %s left (%d trajectories received)", name, source.received)
            self.note_waiting()

    def _reply(self, ident: bytes, kind: str, header: dict) -> None:
        try:
            self._sock.send_multipart([ident, *wire.sign(self.key, kind, header)], zmq.NOBLOCK)
        except zmq.Again:
            pass  # its queue is full (a credit: the next ping carries the same books)

    def _handshake(self, ident: bytes, name: str, kind: str, header: dict) -> None:
        why = _refusal(self.cfg, self.hash, kind, header)
        if why is not None:
            self.refused.setdefault(name, why)
            self._once(name, "refused", f"sampler node {name} refused: {why}")
            self._reply(ident, "refuse", {"reason": why})
            return
        if kind == "hello":
            self._reply(ident, "config", {"msf_version": msf.__version__, "config": self.cfg.to_dict()})
            return
        old = self.sources.get(ident)
        workers = str(header.get("workers", ""))
        source = Source(len(self.sources), name, ident, workers=workers, joined_s=time.monotonic() - self.started)
        if old is not None:  # it joins again (after a silence): its books go on
            source = old
            source.left, source.last_heard = False, time.monotonic()
        self.sources[ident] = source
        log.info("sampler node %s joined (source %d, %s)", name, source.index, source.workers)
        self._reply(ident, "accept", {"version": self.weights[0].version, "window": self.window, **self.group})
        self._send_weights(time.monotonic(), to=[source])

    def _trajectories(self, source: Source, header: dict, payload: list[bytes]) -> None:
        versions = [w.version for w in self.weights]
        try:
            policies, arrays = wire.unpack_trajectories(
                header, payload, self.fields, versions, self.spaces.num_actions, self.spaces.discrete
            )
        except wire.Malformed as e:
            n = header.get("policies")
            source.rejected += len(n) if isinstance(n, list) else 0
            self._once(source.name, "malformed", f"sampler node {source.name}: trajectories dropped: {e}")
            self._reply(source.ident, "credit", {"done": self._done(source)})
            return
        pv = arrays["policy_versions"].min(axis=1)
        source.lag_sum += float(sum(versions[p] - v for p, v in zip(policies, pv)))
        if len(self.free) < len(policies):
            self._parked = (source, policies, arrays)
            return
        self._enter(source, policies, arrays)

    def _enter(self, source: Source, policies: list[int], arrays: dict[str, np.ndarray]) -> None:
        """Write checked trajectories into free slots, then announce them (whole: the slots are the learner's
        only from the announcement on)."""
        slots = [self.free.popleft() for _ in policies]
        for name, a in arrays.items():
            self.views[name][slots] = a
        self.views["slot_policy"][slots] = policies
        source.received += len(slots)
        if source.first_trajectory_s is None:
            source.first_trajectory_s = time.monotonic() - self.started
        self._slot_source.update(dict.fromkeys(slots, source))
        self.full_queue.put(FullTrajectories(self.first_worker + source.index, slots))

    def _episodes(self, source: Source, header: dict) -> None:
        episodes = wire.check_episodes(header, len(self.weights))
        if episodes is None:
            self._once(source.name, "stats", f"sampler node {source.name}: malformed episode statistics dropped")
            return
        source.episodes += len(episodes[0])
        self.stats_queue.put(EpisodeStats(self.first_worker + source.index, *episodes))
