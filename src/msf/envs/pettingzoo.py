"""PettingZoo parallel environments in msf's multi-agent env interface.

Usage, in a module that the rollout workers import too (``--env=my_module:my_pz_env``)::

    from msf.envs.pettingzoo import PettingZooParallel
    from msf.envs.registry import register_env

    register_env("my_pz_env", lambda name, env_config: PettingZooParallel(my_parallel_env()))

See :func:`msf.envs.registry.num_agents_of` for the interface.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PettingZooParallel(gym.Env):
    """A PettingZoo ``ParallelEnv`` as an msf multi-agent env: agents in ``possible_agents`` order,
    observations, rewards, terminations and truncations as lists of ``num_agents``.

    Args:
        env: the parallel env. Every agent must have the same observation and action space.

    Raises:
        ValueError: the agents' spaces differ (at construction); an agent left the episode while others
            played on (at ``step``): msf needs every agent until the episode ends for all of them.
    """

    def __init__(self, env: Any):
        self.env = env
        self.agents = list(env.possible_agents)
        self.num_agents = len(self.agents)
        first = self.agents[0]
        self.observation_space = env.observation_space(first)
        self.action_space = env.action_space(first)
        for a in self.agents[1:]:
            if env.observation_space(a) != self.observation_space or env.action_space(a) != self.action_space:
                raise ValueError(
                    f"PettingZooParallel: agent {a!r} has other spaces than {first!r} "
                    f"({env.observation_space(a)}, {env.action_space(a)} vs "
                    f"{self.observation_space}, {self.action_space}); msf needs the same for all"
                )
        self.render_mode = getattr(env, "render_mode", None)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, infos = self.env.reset(seed=seed, options=options)
        return [obs[a] for a in self.agents], infos

    def step(self, actions):
        obs, rewards, terms, truncs, infos = self.env.step(dict(zip(self.agents, actions)))
        missing = [a for a in self.agents if a not in obs]
        if missing:
            raise ValueError(
                f"PettingZooParallel: agent(s) {missing} left the episode before the others; msf "
                "needs every agent until the episode ends for all (end it for all at once)"
            )
        ended = [bool(terms[a]) or bool(truncs[a]) for a in self.agents]
        if any(ended) and not all(ended):
            raise ValueError(
                "PettingZooParallel: some agents' episode ended while others played on; msf needs "
                "the episode to end for all agents at once"
            )
        return (
            [obs[a] for a in self.agents],
            np.asarray([rewards[a] for a in self.agents], dtype=np.float32),
            [bool(terms[a]) for a in self.agents],
            [bool(truncs[a]) for a in self.agents],
            infos,
        )

    def render(self):
        return self.env.render()

    def close(self):
        self.env.close()
