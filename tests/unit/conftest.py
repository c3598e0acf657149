"""What many unit tests build: the tiny config (one rollout worker with two envs, rollouts of 4, batches of 8) and
a CPU learner on observations of 3 floats with 2 discrete actions."""

from __future__ import annotations

import numpy as np
import torch

from msf.cfg.config import Config, Derived
from msf.distributed.collectives import Collectives
from msf.envs.registry import EnvSpaces
from msf.learning.learner import Learner

SPACES = EnvSpaces(obs_shape=(3,), obs_dtype=np.float32, discrete=True, num_actions=2)


def tiny_config(**changes) -> Config:
    """One rollout worker with 2 envs, rollouts of 4 steps, batches of 8 samples (an iteration is 4 trajectories,
    one minibatch), an MLP encoder of one 16-unit layer; ``changes`` override these or set other flags."""
    return Config(
        **{**dict(encoder_mlp_layers=[16], batch_size=8, rollout=4, num_workers=1, num_envs_per_worker=2), **changes}
    )


def make_learner(
    cfg: Config | None = None,
    spaces: EnvSpaces = SPACES,
    seed: int | None = None,
    collectives: Collectives | None = None,
) -> Learner:
    """A CPU learner of ``cfg`` (default: :func:`tiny_config`) on ``spaces``, its model initialised after
    ``torch.manual_seed(seed)`` (None: from torch's generator as it is)."""
    if seed is not None:
        torch.manual_seed(seed)
    cfg = tiny_config() if cfg is None else cfg
    return Learner(cfg, Derived.of(cfg), spaces, "cpu", collectives)
