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


# --- stacked frames, each sent once ------------------------------------------------------------------------------
S, H, W = 4, 6, 5  # a stack of 4 frames of 6 x 5 bytes: [T + 1, 4, 6, 5] uint8 per trajectory
PIXEL_FIELDS = wire.trajectory_fields({**LAYOUT, "obs": ((9, T + 1, S, H, W), torch.uint8)})


def frame_stacks(rng: np.random.Generator, steps: int, resets: list[int], slides: bool = True) -> np.ndarray:
    """``[steps + 1, S, H, W]`` uint8 observations of one env as a frame stack makes them: each step the stack
    slides by one new frame; at a step in ``resets`` (and at 0) a new episode's stack is its first frame S times.
    ``slides=False``: every observation drawn anew (an env that stacks another way, or none)."""
    obs = np.empty((steps + 1, S, H, W), np.uint8)
    for t in range(steps + 1):
        new = rng.integers(0, 256, size=(H, W), dtype=np.uint8)
        if not slides:
            obs[t] = rng.integers(0, 256, size=(S, H, W), dtype=np.uint8)
        elif t == 0 or t in resets:
            obs[t] = new  # broadcast: S copies of the episode's first frame
        else:
            obs[t] = np.concatenate([obs[t - 1, 1:], new[None]])
    return obs


def pixel_trajectories(obs: np.ndarray) -> dict[str, np.ndarray]:
    arrays, _ = trajectories(len(obs))
    return {**arrays, "obs": obs}


def round_trip(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[bytes]]:
    batch = {k: torch.from_numpy(v) for k, v in arrays.items()}
    header = {"policies": [0] * len(arrays["obs"])}
    _, header, payload = wire.verify(KEY, wire.sign(KEY, "traj", header, wire.pack_trajectories(batch, PIXEL_FIELDS)))
    return wire.unpack_trajectories(header, payload, PIXEL_FIELDS, [2], num_actions=2, discrete=True)[1], payload


def test_which_observations_are_sent_as_stacked_frames():
    assert wire.sends_frames_once(PIXEL_FIELDS) and not wire.sends_frames_once(FIELDS)  # CartPole: floats
    for shape, dtype in [
        ((T + 1, 1, H, W), torch.uint8),
        ((T + 1, S, H, W), torch.float32),
        ((T + 1, H, W), torch.uint8),
    ]:
        fields = wire.trajectory_fields({**LAYOUT, "obs": ((9, *shape), dtype)})  # one frame, floats, no stack
        assert not wire.sends_frames_once(fields) and wire.payload_names(fields) == list(fields)
    assert wire.payload_names(PIXEL_FIELDS)[:3] == ["obs_slid", "obs_frames", "actions"]


@pytest.mark.parametrize("seed", range(4))
def test_stacked_frames_rebuild_bit_identical_across_episode_boundaries_and_envs_that_do_not_slide(seed):
    rng = np.random.default_rng(seed)
    steps = 24
    fields = wire.trajectory_fields({**LAYOUT, "obs": ((9, steps + 1, S, H, W), torch.uint8)})
    obs = np.stack(
        [
            frame_stacks(rng, steps, sorted(rng.choice(np.arange(1, steps + 1), size=3, replace=False).tolist())),
            frame_stacks(rng, steps, [1, 2, 3, steps]),  # resets in a row, and at the last step
            frame_stacks(rng, steps, []),  # one episode: runs of slides longer than the stack
            frame_stacks(rng, steps, [], slides=False),
        ]
    )
    obs[0, 5:9] = obs[0, 4]  # a still screen: stacks of one frame that also slide
    slid, frames = wire.pack_frames(obs)
    rebuilt = wire.unpack_frames(4, obs.shape[1:], slid.tobytes(), frames.tobytes())
    assert rebuilt.dtype == np.uint8
    np.testing.assert_array_equal(rebuilt, obs)
    assert slid[3].sum() == 0 and slid[2].all()  # the non-sliding env's every step whole; the episode's none
    assert fields["obs"][0] == obs.shape[1:]


def test_the_packed_size_is_the_hand_counted_frames_and_flags():
    rng = np.random.default_rng(7)
    # T = 4 steps; trajectory 0: an episode starts at step 2 (its stack sent whole) -> 4 + 1 + 4 + 1 + 1 = 11 frames;
    # trajectory 1: no step slides -> 5 stacks of 4 = 20 frames; trajectory 2: all slide -> 4 + 4 = 8 frames
    obs = np.stack([frame_stacks(rng, T, [2]), frame_stacks(rng, T, [], slides=False), frame_stacks(rng, T, [])])
    arrays = pixel_trajectories(obs)
    out, payload = round_trip(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(out[k], v)
    assert [len(p) for p in payload[:2]] == [3 * T, (11 + 20 + 8) * H * W]
    assert bytes(payload[0]) == bytes([1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1])
    rest = T * (8 + 4 + 4 + 4 + 1 + 1 + 8)  # actions, log_probs, values, rewards, dones, time_outs, versions
    assert sum(map(len, payload)) == 3 * T + (11 + 20 + 8) * H * W + 3 * rest
    assert wire.max_trajectory_bytes(PIXEL_FIELDS) == T + (T + 1) * S * H * W + rest


def _change_flag(payload: list[bytes]) -> list[bytes]:
    slid = bytearray(payload[0])
    slid[slid.index(1)] = 0  # a slid step claimed whole: its 3 older frames are missing from obs_frames
    return [bytes(slid), *payload[1:]]


@pytest.mark.parametrize(
    "change, problem",
    [
        (_change_flag, "obs_frames: 1170 bytes, 1260 expected for the 42 frames obs_slid implies"),
        (lambda p: [b"\x02" + p[0][1:], *p[1:]], "obs_slid: values other than 0 and 1"),
        (lambda p: [p[0][:-1], *p[1:]], "obs_slid: 11 bytes, 12 expected for 3 trajectories"),
        (lambda p: [p[0], p[1] + b"\x00", *p[2:]], "obs_frames: 1171 bytes, 1170 expected"),
        (lambda p: [p[0], p[1][: len(p[1]) // 2], *p[2:]], "obs_frames: 585 bytes, 1170 expected"),
        (lambda p: p[1:], r"8 payload frames, 9 expected \(obs_slid, obs_frames, actions"),
    ],
)
def test_stacked_frames_whose_flags_and_frames_disagree_are_malformed(change, problem):
    rng = np.random.default_rng(3)
    obs = np.stack([frame_stacks(rng, T, [2]), frame_stacks(rng, T, [], slides=False), frame_stacks(rng, T, [])])
    _, payload = round_trip(pixel_trajectories(obs))
    with pytest.raises(wire.Malformed, match=problem):
        wire.unpack_trajectories({"policies": [0] * 3}, change(payload), PIXEL_FIELDS, [2], 2, discrete=True)


def test_a_node_of_another_wire_format_is_refused_in_one_line():
    import msf
    from msf.cfg.arguments import parse_args
    from msf.sampling.sampler_endpoint import _refusal

    cfg = parse_args(["--env=CartPole-v1"])[0]
    v = msf.__version__
    assert _refusal(cfg, "h", "hello", {"msf_version": v, "wire": wire.WIRE_VERSION}) is None
    assert _refusal(cfg, "h", "hello", {"msf_version": v}) == (
        f"msf version {v} (wire format 1), the job runs {v} (wire format {wire.WIRE_VERSION})"
    )


def test_two_nodes_with_one_host_and_pid_are_two_peers_of_the_job():
    """Two sampler nodes whose host name and pid agree (two containers with the host's network, each node its
    pid 1; here two links of one process): the job's ROUTER socket would ignore the second with the first's
    routing id, which then waited ``--connect_timeout`` for an answer that never came."""
    import zmq

    from msf.runner.sampler_node import JobLink

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    links = [JobLink(f"127.0.0.1:{port}", f"tcp://127.0.0.1:{port}", KEY, 5.0) for _ in range(2)]
    try:
        for i, link in enumerate(links):
            assert link.send("hello", {"node": i}, wait_s=5.0)
        idents = {}
        for _ in links:
            assert router.poll(5000), f"the job heard {len(idents)} of 2 nodes"
            ident, *frames = router.recv_multipart()
            idents[wire.verify(KEY, frames)[1]["node"]] = ident
        assert idents[0] != idents[1]
        assert all(
            ident.decode().startswith(f"{__import__('socket').gethostname()}:{os.getpid()}")
            for ident in idents.values()
        )
        for i, link in enumerate(links):  # each answer reaches its own node
            router.send_multipart([idents[i], *wire.sign(KEY, "config", {"node": i})])
            msg = link.recv(5.0)
            assert msg is not None and msg[1]["node"] == i
    finally:
        for link in links:
            link.sock.close(0)
            link.ctx.term()
        router.close(0)
        ctx.term()


@pytest.mark.parametrize(
    "env, line",
    [
        ("NoSuchEnv-v0", "msf-sampler: error: --env: unknown environment 'NoSuchEnv-v0'"),
        ("no_such_module:Env", "msf-sampler: error: --env: cannot import module 'no_such_module'"),
    ],
)
def test_a_node_that_cannot_make_the_jobs_env_exits_2_in_one_line_and_never_says_bye(env, line, tmp_path, capsys):
    """The env comes from the job (``--env=module:Id`` whose module this machine lacks) or from the node's own
    ``--env``: making it fails on the node, before it joins. One line and exit 2 (bad input), not a traceback; no
    ``bye`` (the job would log it as a message before joining)."""
    import threading

    import zmq

    from msf.cfg.config import Config
    from msf.sampler import main

    key_file = tmp_path / "k.key"
    key_file.write_text(KEY.hex() + "\n")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    heard: list[str] = []

    def job() -> None:  # answers the first hello with its config, then records what else comes
        while router.poll(3000):
            ident, *frames = router.recv_multipart()
            kind, _, _ = wire.verify(KEY, frames)
            heard.append(kind)
            if kind == "hello" and heard.count("hello") == 1:
                config = Config(env="CartPole-v1").to_dict()
                router.send_multipart([ident, *wire.sign(KEY, "config", {"msf_version": "x", "config": config})])

    t = threading.Thread(target=job)
    t.start()
    try:
        argv = [f"--connect=127.0.0.1:{port}", f"--sampler_key_file={key_file}", "--num_workers=1"]
        rc = main([*argv, f"--env={env}", "--connect_timeout=10"])
    finally:
        t.join()
        router.close(0)
        ctx.term()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(line) and not any("Traceback" in e for e in err), err
    assert "bye" not in heard, heard


def test_a_node_stopped_before_it_sent_its_join_says_no_bye():
    """Ctrl-C while the node waits for the job's config: a ``bye`` would reach the job as a message before joining
    (a warning in its log for a node that did nothing wrong). After its join, it says bye."""
    import threading

    import zmq

    from msf.runner.sampler_node import JobLink, NodeSettings, SamplerNode

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    heard = []
    for join_header in ({}, {"env": "CartPole-v1"}):
        link = JobLink(f"127.0.0.1:{port}", f"tcp://127.0.0.1:{port}", KEY, 5.0)
        link.join_header = join_header
        SamplerNode(link, NodeSettings(1, 2), threading.Event()).close("stopped")
        while router.poll(500):
            heard.append((bool(join_header), wire.verify(KEY, router.recv_multipart()[1:])[0]))
    router.close(0)
    ctx.term()
    assert heard == [(True, "bye")]
