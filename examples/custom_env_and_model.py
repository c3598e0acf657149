"""Train your own environment with your own encoder.

    python examples/custom_env_and_model.py --experiment=custom --train_for_env_steps=100000

Two registrations, made at import of this module (every process of the run imports it again:
rollout workers, inference workers and the learner are spawned, so registrations made only
under ``if __name__ == "__main__"`` would not reach them):

* ``register_env("gridwalk", make_gridwalk)``: a tiny 1-D walk to a goal, a gymnasium ``Env``;
* ``register_encoder("wide_mlp", WideEncoder)``: an encoder with a skip connection.

The run names them as ``--env=custom_env_and_model:gridwalk`` and
``--encoder_custom=custom_env_and_model:wide_mlp``; ``main`` adds this folder to ``PYTHONPATH`` so
that the spawned processes can import the module.

The walk is tiny, so ``main`` also sets ``--learning_rate=0.001`` (Sample Factory's default 1e-4 needs
several times more steps here); flags given on the command line come later and win. These flags are
passed at every start, resumes included: resuming an experiment in which you changed one of them needs
that flag again (msf-train warns when a resume changes a flag).

Evaluate the trained policy with ``PYTHONPATH=examples msf-enjoy --experiment=custom --eval_deterministic=True``.
"""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from msf.envs import register_env
from msf.model import register_encoder

GOAL = 6


class GridWalk(gym.Env):
    """Walk on cells 0..GOAL: actions 0 (left) and 1 (right); +1 on reaching GOAL, -0.01 per step,
    at most 50 steps. Observations: the one-hot cell, float32 ``[GOAL + 1]``."""

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (GOAL + 1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.render_mode, self.pos, self.t = render_mode, 0, 0

    def _obs(self):
        o = np.zeros(GOAL + 1, dtype=np.float32)
        o[self.pos] = 1.0
        return o

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = min(GOAL, max(0, self.pos + (1 if int(action) == 1 else -1)))
        self.t += 1
        reached = self.pos == GOAL
        return self._obs(), (1.0 if reached else -0.01), reached, self.t >= 50 and not reached, {}


def make_gridwalk(name: str, env_config: dict) -> gym.Env:
    """``env_config`` holds worker_index, env_index and seed (and, in msf-enjoy, evaluation and render_mode)."""
    return GridWalk(render_mode=env_config.get("render_mode"))


class WideEncoder(nn.Module):
    """``[N, obs_size]`` -> ``[N, 64]``: one wide hidden layer plus a linear skip connection."""

    def __init__(self, cfg, obs_shape: tuple[int, ...]):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(obs_shape[0], 256), nn.ELU(), nn.Linear(256, 64))
        self.skip = nn.Linear(obs_shape[0], 64)
        self.out_size = 64

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.elu(self.hidden(obs) + self.skip(obs))


register_env("gridwalk", make_gridwalk)
register_encoder("wide_mlp", WideEncoder)


def main(argv: list[str] | None = None) -> int:
    from msf.train import main as train

    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, here)
    args = [
        "--env=custom_env_and_model:gridwalk",
        "--encoder_custom=custom_env_and_model:wide_mlp",
        "--num_workers=2",
        "--num_envs_per_worker=8",
        "--batch_size=256",
        "--device=cpu",
        "--learning_rate=0.001",
    ]
    return train([*args, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
