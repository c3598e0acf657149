"""The sampler nodes' messages (msf.sampling.wire): the MAC against an independent HMAC, and every check a
trajectory message must pass before it may touch the buffer."""

from __future__ import annotations

import hashlib
import hmac
import json
import os

import numpy as np
import pytest
import torch

from msf.sampling import wire

KEY = bytes(range(32))
# the fields of a CartPole buffer: obs [T + 1, 4] float32, discrete actions, no recurrent state
T = 4
LAYOUT = {
    "obs": ((9, T + 1, 4), torch.float32),
    "actions": ((9, T), torch.int64),
    "log_probs": ((9, T), torch.float32),
    "action_params": ((9, T, 0), torch.float32),
    "values": ((9, T), torch.float32),
    "rewards": ((9, T), torch.float32),
    "dones": ((9, T), torch.uint8),
    "time_outs": ((9, T), torch.uint8),
    "policy_versions": ((9, T), torch.int64),
    "rnn_states": ((9, T + 1, 0), torch.float32),
}
FIELDS = wire.trajectory_fields(LAYOUT)


def test_the_mac_is_hmac_sha256_over_length_prefixed_frames():
    frames = wire.sign(KEY, "ping", {"seq": 3}, [b"abc"])
    h = hmac.new(KEY, digestmod=hashlib.sha256)
    for f in (b"ping", b'{"seq":3}', b"abc"):
        h.update(len(f).to_bytes(8, "little") + f)
    assert frames == [b"ping", b'{"seq":3}', b"abc", h.digest()]
    assert wire.verify(KEY, frames) == ("ping", {"seq": 3}, [b"abc"])


@pytest.mark.parametrize(
    "change",
    [
        lambda f: [f[0], f[1], b"abd", f[3]],  # a payload byte
        lambda f: [f[0], f[1] + f[2][:1], f[2][1:], f[3]],  # a byte moved from one frame into the other
        lambda f: [f[0], b'{"seq":4}', f[2], f[3]],  # the header
    ],
)
def test_a_changed_message_fails_authentication(change):
    frames = wire.sign(KEY, "ping", {"seq": 3}, [b"abc"])
    with pytest.raises(PermissionError):
        wire.verify(KEY, change(frames))
    with pytest.raises(PermissionError):
        wire.verify(b"another key", frames)


def test_a_key_file_is_its_owners_only_and_reads_back(tmp_path):
    path = str(tmp_path / "sampler.key")
    key = wire.make_key(path)
    assert len(key) == 32 and os.stat(path).st_mode & 0o777 == 0o600
    assert wire.read_key(path) == key


def trajectories(n: int, versions: int = 2) -> tuple[dict, list[bytes]]:
    rng = np.random.default_rng(0)
    arrays = {
        "obs": rng.normal(size=(n, T + 1, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, size=(n, T)),
        "log_probs": np.full((n, T), -0.69, np.float32),
        "values": rng.normal(size=(n, T)).astype(np.float32),
        "rewards": np.ones((n, T), np.float32),
        "dones": np.zeros((n, T), np.uint8),
        "time_outs": np.zeros((n, T), np.uint8),
        "policy_versions": np.full((n, T), versions, np.int64),
    }
    return arrays, [a.tobytes() for a in arrays.values()]


def test_trajectories_round_trip_through_a_signed_message():
    arrays, _ = trajectories(3)
    batch = {k: torch.from_numpy(v) for k, v in arrays.items()}
    frames = wire.sign(KEY, "traj", {"policies": [0, 0, 0]}, wire.pack_trajectories(batch, FIELDS))
    _, header, payload = wire.verify(KEY, frames)
    policies, out = wire.unpack_trajectories(header, payload, FIELDS, [2], num_actions=2, discrete=True)
    assert policies == [0, 0, 0] and list(out) == list(FIELDS)
    for k, v in arrays.items():
        np.testing.assert_array_equal(out[k], v)
    # 4-float observations of 5 rows, 8-byte actions and versions, 4-byte floats, 1-byte flags, per step
    assert sum(map(len, payload)) == 3 * (5 * 4 * 4 + T * (8 + 4 + 4 + 4 + 1 + 1 + 8))


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("obs", np.nan, "obs: non-finite values"),
        ("rewards", np.inf, "rewards: non-finite values"),
        ("dones", 2, "dones: values other than 0 and 1"),
        ("actions", 2, r"actions: outside \[0, 2\)"),
        ("actions", -1, r"actions: outside \[0, 2\)"),
        ("policy_versions", 3, "policy_versions: negative, or later than the learner's version"),
        ("policy_versions", -1, "policy_versions: negative"),
    ],
)
def test_a_bad_value_anywhere_rejects_the_whole_message(field, value, problem):
    arrays, _ = trajectories(2)
    arrays[field][1, -1] = value
    payload = [a.tobytes() for a in arrays.values()]
    with pytest.raises(wire.Malformed, match=problem):
        wire.unpack_trajectories({"policies": [0, 0]}, payload, FIELDS, [2], num_actions=2, discrete=True)


@pytest.mark.parametrize(
    "header, cut, problem",
    [
        ({"policies": [0, 0]}, 1, "obs: 159 bytes, 160 expected"),
        ({"policies": [0, 0, 0]}, 0, "obs: 160 bytes, 240 expected"),
        ({"policies": [1, 0]}, 0, r"policies: ids in \[0, 1\) expected"),
        ({"policies": []}, 0, "policies: a list of 1 to 64"),
        ({"policies": list(range(65))}, 0, "policies: a list of 1 to 64"),
        ({}, 0, "policies: a list"),
    ],
)
def test_sizes_and_counts_are_checked(header, cut, problem):
    _, payload = trajectories(2)
    payload[0] = payload[0][: len(payload[0]) - cut]
    with pytest.raises(wire.Malformed, match=problem):
        wire.unpack_trajectories(header, payload, FIELDS, [2], num_actions=2, discrete=True)
    with pytest.raises(wire.Malformed, match="7 payload frames, 8 expected"):
        wire.unpack_trajectories({"policies": [0, 0]}, payload[:7], FIELDS, [2], num_actions=2, discrete=True)


def test_a_header_must_be_a_json_object_of_a_known_kind():
    with pytest.raises(wire.Malformed, match="unknown kind"):
        wire.verify(KEY, wire.sign(KEY, "nonsense", {}))
    frames = [b"ping", json.dumps([1]).encode()]
    with pytest.raises(wire.Malformed, match="not a JSON object"):
        wire.verify(KEY, [*frames, wire._mac(KEY, frames)])


@pytest.mark.parametrize(
    "bind, host",
    [(None, "127.0.0.1"), ("10.0.0.5", "10.0.0.5"), ("0.0.0.0", "HOSTNAME"), ("::", "HOSTNAME")],
)
def test_the_join_address_names_this_host_when_the_port_binds_every_interface(bind, host):
    """What the job tells sampler nodes to ``--connect`` to: never a wildcard, which no other machine reaches."""
    import socket

    from msf.cfg.arguments import parse_args
    from msf.sampling.sampler_endpoint import join_address

    flags = ["--env=CartPole-v1", "--sampler_port=29600"] + ([f"--sampler_bind={bind}"] if bind else [])
    cfg = parse_args(flags)[0]
    expected = socket.gethostname() if host == "HOSTNAME" else host
    assert join_address(cfg) == f"{expected}:29600"
