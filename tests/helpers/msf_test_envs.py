"""Environments for the integration tests, registered with gymnasium at import.

Use them as ``--env=msf_test_envs:MsfFailingCartPole-v0`` with ``tests/helpers`` on PYTHONPATH:
the module is imported in every process, spawned rollout workers included.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FailingCartPole(CartPoleEnv):
    """CartPole that raises ``RuntimeError`` once ``MSF_TEST_FAIL_AFTER_S`` seconds (default 4) have
    passed since its creation."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = time.monotonic() + float(os.environ.get("MSF_TEST_FAIL_AFTER_S", "4"))

    def step(self, action):
        if time.monotonic() > self.fail_at:
            raise RuntimeError("deliberate failure inside the environment (msf test)")
        return super().step(action)


gym.register("MsfFailingCartPole-v0", entry_point=FailingCartPole, max_episode_steps=500)


class FailOnceCartPole(CartPoleEnv):
    """CartPole whose first env to pass ``MSF_TEST_FAIL_AFTER_S`` seconds (default 4) raises, once per
    marker file ``MSF_TEST_FAIL_ONCE_MARKER``: it creates the file exclusively, so after a restart (or
    in any other env) the file exists and nothing fails."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = time.monotonic() + float(os.environ.get("MSF_TEST_FAIL_AFTER_S", "4"))
        self.marker = os.environ["MSF_TEST_FAIL_ONCE_MARKER"]

    def step(self, action):
        if self.fail_at is not None and time.monotonic() > self.fail_at:
            self.fail_at = None
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("deliberate one-time failure inside the environment (msf test)")
        return super().step(action)


gym.register("MsfFailOnceCartPole-v0", entry_point=FailOnceCartPole, max_episode_steps=500)
