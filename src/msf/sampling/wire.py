"""The messages between a job and its sampler nodes, as bytes: signing, packing and checking. No sockets here.

A message is a list of frames (ZeroMQ multipart): ``[kind, header, *payload, mac]``. ``kind`` is one of the
names below, ``header`` a JSON object, ``payload`` raw tensor bytes (C order, native little-endian), and ``mac``
the HMAC-SHA256 (RFC 2104, :mod:`hmac`) of every frame before it, each preceded by its length as 8 bytes, under the
job's key: a frame cannot be moved into another or cut short without the MAC failing.

==========  ===============  ===========================================================================
kind        direction        header (payload)
==========  ===============  ===========================================================================
hello       sampler -> job   ``msf_version``, ``seq`` (the sampler asks for the job's config)
config      job -> sampler   ``msf_version``, ``config`` (the job's flags), ``spaces``
join        sampler -> job   ``msf_version``, ``env``, ``shape_hash`` (:func:`shape_hash` of what it runs)
accept      job -> sampler   ``version`` (policy 0's version now), ``window`` (see ``done`` below)
refuse      job -> sampler   ``reason`` (one line; the sampler exits 2)
traj        sampler -> job   ``seq``, ``sent``, ``sampled``, ``policies`` ``[n]`` (the fields of
                             :func:`trajectory_fields`, n rows each; stacked frames once: see below)
stats       sampler -> job   ``seq``, ``sampled``, ``returns``, ``lengths``, ``policies`` (finished episodes)
ping        both ways        ``seq`` (a sign of life); the sampler's: ``sampled``; the job's: ``done``
credit      job -> sampler   ``done``: this sampler's trajectories the job has accounted for (taken from its
                             buffer by the learner, rejected, or lost before a later one arrived)
weights     job -> sampler   ``policy``, ``version`` (the policy's ``state_dict`` tensors, in order)
bye         sampler -> job   ``seq``, ``sampled`` (the sampler stops)
end         job -> sampler   ``reason`` (``done``, ``stopped`` or ``failed``; the sampler exits 0)
==========  ===============  ===========================================================================

``hello`` and ``join`` also carry ``wire``: :data:`WIRE_VERSION`; the job refuses a sampler of another msf version or
wire format (one line naming both).

Stacked frames (:func:`sends_frames_once`: uint8 observations ``[S, ...]`` with ``S >= 2`` frames stacked along
their first axis, as msf's Atari envs ``[4, 84, 84]``): consecutive observations of an episode share ``S - 1``
frames, so a ``traj`` message carries the observations as two frames in place of one: ``slid`` ``[n, T]`` uint8,
1 where observation ``t + 1`` is observation ``t`` slid by one frame (``obs[t + 1][:-1] == obs[t][1:]``, checked
byte for byte on the node), and the frames ``[k, *frame]``: per trajectory, every frame of its first observation,
then per later step only the newest frame where it slid, every frame where it did not (an episode's start, whose
stack the reset fills, or an env that stacks otherwise). The job rebuilds the observations bit for bit
(:func:`unpack_frames`). Atari: 132 frames for 129 stacks of 4 in place of 516.

``seq`` counts a sampler's messages (1, 2, ...): the job drops one whose ``seq`` is not above the last it took
from that sampler (a replayed message).

A sampler's books: ``sent`` counts the trajectories it sent to this device group, those of this message included;
``sampled`` those it counts against the group: ``sent``, and (to the group it joined first) those its workers
finished that it has not sent yet. The job keeps the newest ``sampled``: what it never received of them is lost in
flight (with a sampler that is gone, or at the run's end).

Flow control: a sampler keeps at most ``window`` trajectories sent and not yet ``done`` (the job's
``trajectories_per_iteration``), so that what it sends waits in the queues of ZeroMQ, the kernel and the job's
buffer for about an iteration at most: the policy lag of its trajectories stays near a local worker's, where unbounded
queues aged them by tens of versions whenever the learner was the slower side.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

MAC_BYTES = 32  # SHA-256
KEY_BYTES = 32
MAX_TRAJECTORIES_PER_MESSAGE = 64  # a sampler splits a larger announcement; the job refuses a larger message
WIRE_VERSION = 2  # 1: each observation whole; 2: stacked frames once (sends_frames_once)
KINDS = ("hello", "config", "join", "accept", "refuse", "traj", "stats", "ping", "credit", "weights", "bye", "end")


class Malformed(ValueError):
    """A message that is not what its kind says (the message names the first problem)."""


def make_key(path: str) -> bytes:
    """A new random key, written to ``path`` as hex, readable by its owner only (mode 0600); returns it."""
    key = os.urandom(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def read_key(path: str) -> bytes:
    """The key in ``path`` (hex, as :func:`make_key` writes it, or any other non-empty content taken as bytes).

    Raises:
        OSError: the file cannot be read. ValueError: it is empty.
    """
    with open(path, "rb") as f:
        raw = f.read().strip()
    if not raw:
        raise ValueError(f"{path} is empty")
    try:
        return bytes.fromhex(raw.decode("ascii"))
    except ValueError:
        return raw


def _mac(key: bytes, frames: Sequence[Any]) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for f in frames:
        h.update(len(f).to_bytes(8, "little"))
        h.update(f)
    return h.digest()


def sign(key: bytes, kind: str, header: Mapping[str, Any], payload: Sequence[Any] = ()) -> list[Any]:
    """The frames of one message (``payload``: buffers, such as contiguous numpy arrays or ``bytes``; a payload
    frame is a byte view of its buffer, not a copy: ``len`` is its size in bytes)."""
    frames: list[Any] = [
        kind.encode(),
        json.dumps(header, separators=(",", ":")).encode(),
        *(memoryview(p).cast("B") for p in payload),
    ]
    return [*frames, _mac(key, frames)]


def verify(key: bytes, frames: Sequence[bytes]) -> tuple[str, dict, list[bytes]]:
    """``(kind, header, payload)`` of a message whose MAC holds.

    Raises:
        PermissionError: the MAC does not hold (another key, or the message was changed).
        Malformed: too few frames, an unknown kind, a header that is not a JSON object.
    """
    if len(frames) < 3:
        raise Malformed(f"{len(frames)} frames, at least 3 expected")
    if not hmac.compare_digest(_mac(key, frames[:-1]), bytes(frames[-1])):
        raise PermissionError("the message failed authentication (not signed with the job's key)")
    kind = bytes(frames[0]).decode("ascii", "replace")
    if kind not in KINDS:
        raise Malformed(f"unknown kind {kind!r}")
    try:
        header = json.loads(bytes(frames[1]))
    except ValueError as e:
        raise Malformed(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise Malformed("header is not a JSON object")
    return kind, header, [bytes(f) for f in frames[2:-1]]


def shape_hash(env_key: Mapping[str, Any], spaces: Any, model: torch.nn.Module, cfg: Any) -> str:
    """SHA-256 (hex) of everything that shapes a trajectory and the weights that act in it: the env and its flags
    (``env_key``: :func:`msf.envs.registry.env_info_key`), its spaces, the model's tensors (names and shapes), the
    rollout and recurrence. A sampler node and its job must agree on it."""
    space = asdict(spaces)
    space["obs_dtype"] = np.dtype(spaces.obs_dtype).str
    what = {
        "env": env_key,
        "spaces": space,
        "model": [(k, list(v.shape)) for k, v in model.state_dict().items()],
        "rollout": cfg.rollout,
        "recurrence": cfg.recurrence,
        "use_rnn": cfg.use_rnn,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def trajectory_fields(layout: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, tuple[tuple, np.dtype]]:
    """The fields a ``traj`` message carries, in order, with the shape and dtype of one trajectory: those of
    :meth:`~msf.sampling.trajectory_buffer.TrajectoryBuffer.gather` (``layout``: the buffer's, per slot)."""
    names = ["obs", "actions", "log_probs", "values", "rewards", "dones", "time_outs", "policy_versions"]
    names += [k for k in ("rnn_states", "action_params") if layout[k][0][-1]]
    return {k: (layout[k][0][1:], torch.empty(0, dtype=layout[k][1]).numpy().dtype) for k in names}


def sends_frames_once(fields: Mapping[str, tuple[tuple, np.dtype]]) -> bool:
    """Whether a ``traj`` message carries the observations as stacked frames, each once (:func:`pack_frames`):
    uint8 observations of at least 3 axes (a stack of images) with at least 2 along the first."""
    shape, dtype = fields["obs"]  # [T + 1, *obs_shape]
    return dtype == np.uint8 and len(shape) >= 4 and shape[1] >= 2


def payload_names(fields: Mapping[str, tuple[tuple, np.dtype]]) -> list[str]:
    """The names of a ``traj`` message's payload frames, in order."""
    return ["obs_slid", "obs_frames", *list(fields)[1:]] if sends_frames_once(fields) else list(fields)


def max_trajectory_bytes(fields: Mapping[str, tuple[tuple, np.dtype]]) -> int:
    """The most payload bytes one trajectory takes in a ``traj`` message (stacked frames: none slid)."""
    whole = sum(math.prod(shape) * dtype.itemsize for shape, dtype in fields.values())
    return whole + (fields["obs"][0][0] - 1 if sends_frames_once(fields) else 0)


def _carried(slid: np.ndarray, stack: int) -> np.ndarray:
    """``[n, T + 1, S]`` bool: the frames of each observation a message carries (``slid``: ``[n, T]`` bool)."""
    n, steps = slid.shape
    carried = np.ones((n, steps + 1, stack), dtype=bool)
    carried[:, 1:, :-1] = ~slid[:, :, None]
    return carried


def pack_frames(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(slid [n, T] uint8, frames [k, F] uint8)`` of stacked observations ``obs`` ``[n, T + 1, S, ...]`` uint8
    (F: the bytes of one frame): see the module's docstring. Vectorised: one comparison of every step with the
    next, one boolean selection."""
    obs = np.ascontiguousarray(obs)
    n, steps1, stack = obs.shape[:3]
    slid = (obs[:, 1:, :-1] == obs[:, :-1, 1:]).reshape(n, steps1 - 1, -1).all(axis=2)
    frames = obs.reshape(n, steps1 * stack, -1)[_carried(slid, stack).reshape(n, -1)]
    return slid.view(np.uint8), frames


def unpack_frames(n: int, shape: tuple[int, ...], slid_raw: bytes, frames_raw: bytes) -> np.ndarray:
    """The observations ``[n, *shape]`` uint8 (``shape``: ``[T + 1, S, ...]``) that :func:`pack_frames` packed.

    A frame not carried (frame ``s < S - 1`` of a slid step ``t``) is frame ``s + j`` of the observation ``j`` steps
    back, ``j = min(S - 1 - s, slid steps in a row ending at t)``: there it is either the newest frame or one of a
    whole observation, both carried. One gather builds every observation.

    Raises:
        Malformed: ``slid`` of another size or with values other than 0 and 1, or a count of frame bytes other
            than its flags imply.
    """
    steps1, stack, frame = shape[0], shape[1], math.prod(shape[2:])
    if len(slid_raw) != n * (steps1 - 1):
        raise Malformed(f"obs_slid: {len(slid_raw)} bytes, {n * (steps1 - 1)} expected for {n} trajectories")
    flags = np.frombuffer(slid_raw, dtype=np.uint8).reshape(n, steps1 - 1)
    if (flags > 1).any():
        raise Malformed("obs_slid: values other than 0 and 1")
    slid = flags.astype(bool)
    carried = _carried(slid, stack)
    k = int(carried.sum())
    if len(frames_raw) != k * frame:
        raise Malformed(
            f"obs_frames: {len(frames_raw)} bytes, {k * frame} expected for the {k} frames obs_slid implies"
        )
    frames = np.frombuffer(frames_raw, dtype=np.uint8).reshape(k, frame)
    where = (np.cumsum(carried.reshape(-1)) - 1).reshape(carried.shape)  # each carried frame's row in `frames`
    t, s = np.arange(steps1)[None, :, None], np.arange(stack)[None, None, :]
    full = np.concatenate([np.ones((n, 1), dtype=bool), ~slid], axis=1)  # [n, T + 1]: carried whole
    run = np.arange(steps1) - np.maximum.accumulate(np.where(full, np.arange(steps1), 0), axis=1)
    back = np.minimum(stack - 1 - s, run[:, :, None])  # [n, T + 1, S]: 0 for every carried frame
    rows = where[np.arange(n)[:, None, None], t - back, s + back]
    return frames[rows].reshape(n, *shape)


def pack_trajectories(batch: Mapping[str, torch.Tensor], fields: Mapping[str, Any]) -> list[np.ndarray]:
    """The payload of a ``traj`` message (:func:`payload_names`): each field of ``batch`` (``[n, ...]`` tensors),
    contiguous; stacked observations as :func:`pack_frames`' two arrays."""
    payload = [np.ascontiguousarray(batch[k].numpy()) for k in fields]
    return [*pack_frames(payload[0]), *payload[1:]] if sends_frames_once(fields) else payload


def unpack_trajectories(
    header: Mapping[str, Any],
    payload: Sequence[bytes],
    fields: Mapping[str, tuple[tuple, np.dtype]],
    versions: Sequence[int],
    num_actions: int,
    discrete: bool,
) -> tuple[list[int], dict[str, np.ndarray]]:
    """Check a ``traj`` message whole and return ``(policies [n], {field: [n, ...] array})``.

    Args:
        fields: :func:`trajectory_fields` of the job's buffer. versions: each policy's version now (a trajectory
            may not claim a later one). num_actions, discrete: the action space (discrete actions in
            ``[0, num_actions)``).

    Raises:
        Malformed: naming the first problem: the count of trajectories or frames, a frame's size, a count of
            stacked frames other than ``obs_slid`` implies (:func:`unpack_frames`), a non-finite float, a flag
            that is not 0/1, an action out of range, a policy or policy version out of range.
    """
    policies = header.get("policies")
    if not isinstance(policies, list) or not 1 <= len(policies) <= MAX_TRAJECTORIES_PER_MESSAGE:
        raise Malformed(f"policies: a list of 1 to {MAX_TRAJECTORIES_PER_MESSAGE} policy ids expected")
    if not all(isinstance(p, int) and 0 <= p < len(versions) for p in policies):
        raise Malformed(f"policies: ids in [0, {len(versions)}) expected")
    n = len(policies)
    names = payload_names(fields)
    if len(payload) != len(names):
        raise Malformed(f"{len(payload)} payload frames, {len(names)} expected ({', '.join(names)})")
    raws: list[Any] = list(payload)
    if sends_frames_once(fields):
        raws[:2] = [unpack_frames(n, fields["obs"][0], raws[0], raws[1])]
    out = {}
    for (name, (shape, dtype)), raw in zip(fields.items(), raws):
        want = n * math.prod(shape) * dtype.itemsize
        size = raw.nbytes if isinstance(raw, np.ndarray) else len(raw)  # an array: the rebuilt observations
        if size != want:
            raise Malformed(f"{name}: {size} bytes, {want} expected for {n} trajectories of {shape} {dtype}")
        a = (raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=dtype)).reshape(n, *shape)
        if dtype.kind == "f" and not np.isfinite(a).all():
            raise Malformed(f"{name}: non-finite values")
        out[name] = a
    for name in ("dones", "time_outs"):
        if (out[name] > 1).any():
            raise Malformed(f"{name}: values other than 0 and 1")
    if discrete and ((out["actions"] < 0).any() or (out["actions"] >= num_actions).any()):
        raise Malformed(f"actions: outside [0, {num_actions})")
    pv = out["policy_versions"]
    limit = np.asarray([versions[p] for p in policies], dtype=np.int64)[:, None]
    if (pv < 0).any() or (pv > limit).any():
        raise Malformed("policy_versions: negative, or later than the learner's version (a version not yet made)")
    return policies, out


def check_episodes(header: Mapping[str, Any], num_policies: int) -> tuple[list, list, list] | None:
    """``(returns, lengths, policies)`` of a ``stats`` message: equally long lists of finite numbers, positive
    integers and policy ids in ``[0, num_policies)``; None when the header is anything else."""
    returns, lengths, policies = header.get("returns"), header.get("lengths"), header.get("policies")
    if not (isinstance(returns, list) and isinstance(lengths, list) and isinstance(policies, list)):
        return None
    ok = len(returns) == len(lengths) == len(policies)
    ok = ok and all(isinstance(r, (int, float)) and math.isfinite(r) for r in returns)
    ok = ok and all(isinstance(n, int) and n > 0 for n in lengths)
    ok = ok and all(isinstance(p, int) and 0 <= p < num_policies for p in policies)
    return (returns, lengths, policies) if ok else None
