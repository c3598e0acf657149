"""Environments for the integration tests, registered with gymnasium at import.

Use them as ``--env=msf_test_envs:MsfFailingCartPole-v0`` with ``tests/helpers`` on PYTHONPATH:
the module is imported in every process, spawned rollout workers included.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
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


class CueMemory(gym.Env):
    """A memory task: the first observation shows one of two cues, then ``delay`` (default 8)
    observations carry nothing, then a query observation asks which cue it was. The action taken at
    the query is rewarded 1 when it names the cue, else 0, and the episode ends; actions before it are
    ignored. A policy without memory can only guess (an expected return of 0.5).

    Observations: ``[cue_0, cue_1, query]`` float32. Actions: Discrete(2).
    """

    def __init__(self, delay: int = 8, render_mode=None):
        self.delay, self.render_mode = delay, render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t, self.cue = 0, 0

    def _obs(self):
        o = np.zeros(3, dtype=np.float32)
        if self.t == 0:
            o[self.cue] = 1.0
        elif self.t == self.delay + 1:
            o[2] = 1.0
        return o

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        if self.t == self.delay + 1:
            return self._obs(), float(int(action) == self.cue), True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}


gym.register("MsfCueMemory-v0", entry_point=CueMemory)
