"""A small fake of ML-Agents' low-level API (``UnityEnvironment``'s methods), with its real step and spec
types from ``mlagents_envs.base_env``: no Unity build can be downloaded here.

The scene "Duel": two teams (behaviors ``Duel?team=0`` and ``Duel?team=1``) of two agents each; every agent
has two observations: a cue, one-hot of 3 (``obs_0``), and its team and the episode's progress (``obs_1``).
One discrete branch of 3 actions; naming the cue earns 1. Episodes last 20 decisions (then all agents are
interrupted together), except agent 3's, which end after 10 (terminated) and restart at once, as Unity
restarts an agent by itself. A random agent earns about 1/3 per step.
"""

from __future__ import annotations

import numpy as np
from mlagents_envs.base_env import (
    ActionSpec,
    BehaviorSpec,
    DecisionSteps,
    DimensionProperty,
    ObservationSpec,
    ObservationType,
    TerminalSteps,
)

EPISODE = 20
SHORT_AGENT, SHORT = 3, 10


class FakeDuel:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.teams = {"Duel?team=0": [0, 1], "Duel?team=1": [2, 3]}
        obs_specs = [
            ObservationSpec((3,), (DimensionProperty.NONE,), ObservationType.DEFAULT, "cue"),
            ObservationSpec((2,), (DimensionProperty.NONE,), ObservationType.DEFAULT, "info"),
        ]
        spec = BehaviorSpec(obs_specs, ActionSpec.create_discrete((3,)))
        self.behavior_specs = {b: spec for b in self.teams}
        self.actions: dict[str, np.ndarray] = {}
        self.closed = False
        self.resets = 0

    def _observe(self, agent: int):
        cue = np.zeros(3, dtype=np.float32)
        cue[self.cue[agent]] = 1.0
        t = self.short_t if agent == SHORT_AGENT else self.t
        return cue, np.array([float(agent >= 2), t / EPISODE], dtype=np.float32)

    def _new_cues(self):
        self.cue = {a: int(self.rng.integers(3)) for a in range(4)}

    def reset(self):
        self.resets += 1
        self.t = self.short_t = 0
        self._new_cues()
        self.steps = {
            b: (self._decisions(agents, np.zeros(len(agents))), self._terminals([], [], []))
            for b, agents in self.teams.items()
        }

    def _decisions(self, agents, rewards):
        obs = [self._observe(a) for a in agents]
        return DecisionSteps(
            [np.stack([o[0] for o in obs]), np.stack([o[1] for o in obs])],
            np.asarray(rewards, dtype=np.float32),
            np.asarray(agents, dtype=np.int32),
            None,
            np.zeros(len(agents), dtype=np.int32),
            np.zeros(len(agents), dtype=np.float32),
        )

    def _terminals(self, agents, rewards, interrupted, obs=None):
        n = len(agents)
        obs = obs or [np.zeros((0, 3), np.float32), np.zeros((0, 2), np.float32)]
        return TerminalSteps(
            obs,
            np.asarray(rewards, dtype=np.float32),
            np.asarray(interrupted, dtype=bool),
            np.asarray(agents, dtype=np.int32),
            np.zeros(n, dtype=np.int32),
            np.zeros(n, dtype=np.float32),
        )

    def get_steps(self, behavior):
        return self.steps[behavior]

    def set_actions(self, behavior, action):
        assert action.discrete.shape == (len(self.teams[behavior]), 1), action.discrete.shape
        self.actions[behavior] = action.discrete[:, 0]

    def step(self):
        rewards = {}
        for b, agents in self.teams.items():
            acts = self.actions.pop(b)
            for a, act in zip(agents, acts):
                rewards[a] = float(int(act) == self.cue[a])
        self.t += 1
        self.short_t += 1
        all_end = self.t >= EPISODE
        short_end = self.short_t >= SHORT or all_end
        ended_obs = {a: self._observe(a) for a in range(4)}
        self._new_cues()
        if all_end:
            self.t = 0
        if short_end:
            self.short_t = 0
        steps = {}
        for b, agents in self.teams.items():
            ended = [a for a in agents if all_end or (a == SHORT_AGENT and short_end)]
            term_obs = [np.stack([ended_obs[a][k] for a in ended]) for k in (0, 1)] if ended else None
            terminals = self._terminals(ended, [rewards[a] for a in ended], [all_end for _ in ended], term_obs)
            # Unity restarts an ended agent at once: it asks for a decision in the same step, reward 0
            steps[b] = (self._decisions(agents, [0.0 if a in ended else rewards[a] for a in agents]), terminals)
        self.steps = steps

    def close(self):
        self.closed = True
