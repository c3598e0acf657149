"""CartPole as a device-side vector env (``--env=torch_cartpole``): gymnasium's ``CartPole-v1``, batched in torch.

The physics is gymnasium's ``CartPoleEnv`` (its constants, Euler integration, the state in float64 and the
observation in float32, termination beyond 2.4 m or 12 degrees, reward 1 per step, the terminating one included)
with ``TimeLimit``'s truncation after 500 steps and a reset to ``uniform(-0.05, 0.05)`` per state variable, drawn from
a ``torch.Generator`` on the env's device. An ended instance resets in the same step: the observation it returns is
the next episode's first.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from msf.envs.device_env import register_device_env

GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
MAX_EPISODE_STEPS = 500
_HIGH = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)


class TorchCartPole:
    """``num_envs`` CartPoles on ``device`` (a :class:`~msf.envs.device_env.DeviceVectorEnv`).

    Args:
        num_envs: instances ``N``. device: where the state and every tensor live. seed: seeds the resets.
        env_config: unused (the factory signature of :func:`~msf.envs.device_env.register_device_env`).

    Attributes:
        state: ``[N, 4]`` float64 (x, x_dot, theta, theta_dot). elapsed: ``[N]`` int64 steps into the episode.
    """

    observation_space: gym.Space = gym.spaces.Box(-_HIGH, _HIGH, dtype=np.float32)
    action_space: gym.Space = gym.spaces.Discrete(2)

    def __init__(
        self, num_envs: int, device: torch.device | str = "cpu", seed: int = 0, env_config: dict | None = None
    ):
        self.num_envs, self.device = num_envs, torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.state = torch.zeros(num_envs, 4, dtype=torch.float64, device=self.device)
        self.elapsed = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _initial(self, n: int) -> torch.Tensor:
        u = torch.rand(n, 4, dtype=torch.float64, device=self.device, generator=self.generator)
        return u * 0.1 - 0.05

    def reset(self) -> torch.Tensor:
        """Every instance's first observation ``[N, 4]`` float32."""
        self.state = self._initial(self.num_envs)
        self.elapsed.zero_()
        return self.state.float()

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every instance (``actions`` ``[N]`` int64: 1 pushes right, 0 left); see
        :meth:`DeviceVectorEnv.step`."""
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(actions == 1, FORCE_MAG, -FORCE_MAG).to(torch.float64)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        state = torch.stack(
            [x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc], 1
        )
        x, theta = state[:, 0], state[:, 2]
        terminated = (x < -X_THRESHOLD) | (x > X_THRESHOLD) | (theta < -THETA_THRESHOLD) | (theta > THETA_THRESHOLD)
        self.elapsed += 1
        truncated = self.elapsed >= MAX_EPISODE_STEPS
        done = terminated | truncated
        obs = state.float()
        # same-step autoreset: the ended instances start again; the step's observation is the new episode's first
        fresh = self._initial(self.num_envs)  # drawn for every instance, so the stream does not depend on the ends
        self.state = torch.where(done[:, None], fresh, state)
        self.elapsed.masked_fill_(done, 0)
        obs = torch.where(done[:, None], self.state.float(), obs)
        rewards = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return obs, rewards, terminated, truncated

    def close(self) -> None:
        pass


register_device_env("torch_cartpole", TorchCartPole, TorchCartPole.observation_space, TorchCartPole.action_space)
