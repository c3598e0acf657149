"""The shared memory a run needs, computed before anything is allocated: the trajectory buffer's bytes equal what
it allocates, and a /dev/shm too small for them is refused with the figures."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from msf.cfg.config import Config, Derived
from msf.cfg.validation import ConfigError
from msf.envs.registry import EnvSpaces
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

VECTOR = EnvSpaces(obs_shape=(4,), obs_dtype=np.float32, discrete=True, num_actions=2)
IMAGE = EnvSpaces(obs_shape=(4, 84, 84), obs_dtype=np.uint8, discrete=True, num_actions=6)
CONTINUOUS_AGENTS = EnvSpaces(obs_shape=(5,), obs_dtype=np.float32, discrete=False, num_actions=3, num_agents=2)

CASES = [
    (VECTOR, dict(num_workers=2, num_envs_per_worker=4, rollout=8, batch_size=64)),
    (IMAGE, dict(num_workers=1, num_envs_per_worker=2, rollout=4, batch_size=16, use_rnn=True, rnn_size=16)),
    (CONTINUOUS_AGENTS, dict(num_workers=3, num_envs_per_worker=2, rollout=16, batch_size=96, rnn_type="lstm")),
]


@pytest.mark.parametrize("spaces, flags", CASES)
def test_the_computed_size_is_what_the_buffer_allocates(spaces, flags):
    cfg = Config(**flags)
    derived = Derived.of(cfg, spaces.num_agents)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    tensors = [getattr(buffer, f.name) for f in dataclasses.fields(buffer)]
    assert all(t.is_shared() for t in tensors)
    assert TrajectoryBuffer.nbytes(cfg, derived, spaces) == sum(t.numel() * t.element_size() for t in tensors)


def test_the_published_weights_size_is_what_they_allocate():
    from msf.model.actor_critic import ActorCritic

    model = ActorCritic(Config(encoder_mlp_layers=[16, 8]), VECTOR)
    weights = PublishedWeights(model)
    # one block (the header and every tensor, each at a multiple of 64 bytes)
    blocks = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*weights.tensors, weights.header]}
    assert PublishedWeights.tensor_bytes(model) == list(blocks.values())
    end = max(t.data_ptr() + t.numel() * t.element_size() for t in weights.tensors) - weights.header.data_ptr()
    assert sum(blocks.values()) == end


def _atari_like():
    """The issue's run: atari_pong's spaces, 2 workers x 16 envs, rollout 128 (the defaults otherwise)."""
    from msf.train import check_model

    cfg = Config(env="atari_pong", num_workers=2, num_envs_per_worker=16, rollout=128, nproc_per_node=1)
    return cfg, check_model(cfg, IMAGE)


def test_a_dev_shm_too_small_is_refused_with_what_is_needed_free_and_to_change(monkeypatch):
    import msf.train

    cfg, model = _atari_like()
    buffers, weights = msf.train.shared_memory_bytes(cfg, IMAGE, model)
    # the buffer (page-rounded per tensor) dominates: 64 slots x 129 rows x 4x84x84 bytes of observations
    assert 64 * 129 * 4 * 84 * 84 < buffers < TrajectoryBuffer.nbytes(cfg, Derived.of(cfg), IMAGE) + 11 * 4096
    assert round(buffers / 2**20, 1) == 222.5  # the "about 222 MiB" of the issue
    monkeypatch.setattr(msf.train, "shm_free_bytes", lambda path=msf.train.SHM_DIR: 64 * 2**20)
    with pytest.raises(ConfigError) as e:
        msf.train.check_shared_memory(cfg, IMAGE, model)
    (line,) = e.value.problems
    need = (buffers + weights) / 2**20
    assert f"needs {need:.1f} MiB in /dev/shm" in line and "64.0 MiB is free" in line
    assert f"trajectory buffer {buffers / 2**20:.1f} MiB for 2 rollout workers x 16 envs x --rollout=128" in line
    assert "--shm-size=256m" in line and "--num_envs_per_worker" in line and "--rollout" in line
    # with room enough it passes, and two device groups need twice the buffers
    monkeypatch.setattr(msf.train, "shm_free_bytes", lambda path=msf.train.SHM_DIR: buffers + weights)
    msf.train.check_shared_memory(cfg, IMAGE, model)
    two = dataclasses.replace(cfg, num_workers=4, nproc_per_node=2)
    assert msf.train.shared_memory_bytes(two, IMAGE, model) == (2 * buffers, 2 * weights)
    with pytest.raises(ConfigError, match="2 device groups x trajectory buffer"):
        msf.train.check_shared_memory(two, IMAGE, model)


class _Limits:
    """A stand-in for the ``resource`` module's open-files limit: getrlimit reads it, setrlimit records the call."""

    RLIMIT_NOFILE = 7
    RLIM_INFINITY = -1

    def __init__(self, soft: int, hard: int):
        self.limit, self.set_to = (soft, hard), None

    def getrlimit(self, which):
        assert which == self.RLIMIT_NOFILE
        return self.limit

    def setrlimit(self, which, limit):
        self.set_to = self.limit = limit


@pytest.mark.parametrize(
    "workers, soft, hard, expect",
    [
        (4, 1024, 4096, "kept"),  # 256 + 8 x (4 + 1) = 296 <= 1024
        (200, 1024, 4096, "raised"),  # 256 + 8 x 201 = 1864 > 1024: the soft limit goes to the hard one
        (1000, 1024, 4096, "refused"),  # 8,264 > 4,096
    ],
)
def test_the_open_files_a_device_group_needs_are_made_available_or_refused(monkeypatch, workers, soft, hard, expect):
    import sys

    from msf import train

    limits = _Limits(soft, hard)
    monkeypatch.setitem(sys.modules, "resource", limits)
    cfg = Config(num_workers=workers, num_envs_per_worker=2, rollout=8, batch_size=16)
    need = train.FDS_BASE + train.FDS_PER_WORKER * (workers + cfg.policy_workers_per_policy)
    if expect == "refused":
        with pytest.raises(ConfigError) as e:
            train.check_file_descriptors(cfg)
        assert str(e.value).startswith("--num_workers: ") and f"about {need} open files" in str(e.value)
        assert f"limit here is {hard}" in str(e.value) and limits.set_to is None
        return
    note = train.check_file_descriptors(cfg)
    if expect == "kept":
        assert note is None and limits.set_to is None
    else:
        assert limits.set_to == (hard, hard) and need <= hard
        assert note == f"raised the limit of open files from {soft} to {hard} for {workers + 1} worker processes " + (
            "per device group"
        )
