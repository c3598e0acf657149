"""Device-side test envs, registered at import (``--env=device_test_envs:NAME``; tests/helpers is on the PYTHONPATH of
the runs the integration tests start)."""

from __future__ import annotations

import torch

from msf.envs.device_env import register_device_env
from msf.envs.torch_cartpole import TorchCartPole


class NanCartPole(TorchCartPole):
    """The torch CartPole whose env ``num_envs - 1`` returns a NaN observation at vector step 200 (episode step 200
    unless an episode of that instance ended before)."""

    calls = 0

    def step(self, actions: torch.Tensor):
        obs, rew, term, trunc = super().step(actions)
        self.calls += 1
        if self.calls == 200:
            obs[-1, 2] = float("nan")
        return obs, rew, term, trunc


register_device_env("nan_cartpole", NanCartPole, TorchCartPole.observation_space, TorchCartPole.action_space)
