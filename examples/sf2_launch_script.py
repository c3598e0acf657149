"""A launch script in Sample Factory 2's style, on msf: its own env, its own flags and its own encoder.

    python examples/sf2_launch_script.py --env=beacon --experiment=beacon --train_for_env_steps=60000
    python examples/sf2_launch_script.py --env=beacon --experiment=beacon --enjoy --max_num_episodes=5

The script is what Sample Factory's documentation teaches (register the env and the encoder, add the env's flags,
override defaults, parse, ``run_rl``), with its ``from sample_factory... import`` lines replaced by one
``from msf.sf2 import ...``. The registrations are made in ``main()``, not at import: msf carries them to the
processes it spawns.

The env, *beacon*: each step shows a 1 x 6 x 6 image with one lit cell, in the left or the right half; action 0
says "left", 1 "right"; a right answer earns 1, an episode lasts ``--beacon_episode_len`` steps (20). A random
policy earns half of them; a trained one (this script's budget: 60,000 steps) nearly all.
"""

from __future__ import annotations

import sys
from typing import Optional

import gymnasium as gym
import numpy as np
from torch import nn

from msf.sf2 import (
    Encoder,
    calc_num_elements,
    enjoy,
    global_model_factory,
    nonlinearity,
    parse_full_cfg,
    parse_sf_args,
    register_env,
    run_rl,
)

SIZE = 6


class Beacon(gym.Env):
    """One lit cell per step, in the left or the right half of a ``[1, 6, 6]`` float32 image; say which."""

    def __init__(self, episode_len: int, render_mode: Optional[str] = None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1, SIZE, SIZE), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode_len, self.render_mode = episode_len, render_mode
        self.t, self.side = 0, 0

    def _obs(self) -> np.ndarray:
        self.side = int(self.np_random.integers(2))
        obs = np.zeros((1, SIZE, SIZE), dtype=np.float32)
        col = int(self.np_random.integers(SIZE // 2)) + self.side * (SIZE // 2)
        obs[0, int(self.np_random.integers(SIZE)), col] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.side else 0.0
        self.t += 1
        return self._obs(), reward, False, self.t >= self.episode_len, {}

    def render(self):
        return np.repeat(np.repeat(self._obs()[0] * 255, 16, 0), 16, 1).astype(np.uint8)[..., None].repeat(3, 2)


def make_beacon(full_env_name, cfg=None, env_config=None, render_mode: Optional[str] = None):
    return Beacon(cfg.beacon_episode_len, render_mode=render_mode)


def add_extra_params(parser):
    parser.add_argument("--beacon_episode_len", default=20, type=int, help="Steps per episode of the beacon env")


def override_default_params(parser):
    # small and quick to learn: a small batch, a larger learning rate, no recurrent core
    parser.set_defaults(
        num_workers=2,
        num_envs_per_worker=8,
        batch_size=256,
        learning_rate=1e-3,
        encoder_conv_mlp_layers=[],
        device="cpu",
    )


class BeaconEncoder(Encoder):
    """Two small convolutions over ``obs_dict["obs"]`` ``[N, 1, 6, 6]``, flattened: ``[N, 8 x 4 x 4]``."""

    def __init__(self, cfg, obs_space):
        super().__init__(cfg)
        shape = obs_space["obs"].shape
        self.conv = nn.Sequential(nn.Conv2d(shape[0], 8, 3, padding=1), nonlinearity(cfg), nn.Conv2d(8, 8, 3))
        self.out = calc_num_elements(self.conv, shape)

    def forward(self, obs_dict):
        return self.conv(obs_dict["obs"]).flatten(1)

    def get_out_size(self) -> int:
        return self.out


def make_beacon_encoder(cfg, obs_space):
    return BeaconEncoder(cfg, obs_space)


def register_custom_components():
    register_env("beacon", make_beacon)
    global_model_factory().register_encoder_factory(make_beacon_encoder)


def parse_custom_args(argv=None, evaluation=False):
    parser, _ = parse_sf_args(argv, evaluation=evaluation)
    add_extra_params(parser)
    override_default_params(parser)
    return parse_full_cfg(parser, argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    evaluation = "--enjoy" in argv
    if evaluation:
        argv.remove("--enjoy")
    register_custom_components()
    cfg = parse_custom_args(argv, evaluation=evaluation)
    if not evaluation:
        return run_rl(cfg)
    status, mean_return = enjoy(cfg)  # Sample Factory's enjoy: the status and the episodes' mean return
    print(f"mean return {mean_return}")
    return status


if __name__ == "__main__":
    sys.exit(main())
