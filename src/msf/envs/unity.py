"""Unity ML-Agents scenes (``unity_*``) as msf multi-agent envs, through ML-Agents' low-level Python API.

Every agent of every behavior (team) of the scene is one agent of the msf env, in a fixed order: behaviors
sorted by name, then agents in the order of the first ``DecisionSteps``. An agent with several observations
gets a ``Dict`` observation (``obs_0``, ``obs_1``, ... in the order of the behavior's observation specs),
which msf flattens and its model splits again (one encoder per observation). All behaviors must share
observation and action specs (one policy network serves them).

Unity resets an agent by itself when its episode ends: the observation returned with an end is the first of
its next episode, as msf expects. When every agent is done, msf calls ``reset``, which resets the scene.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from msf.cfg.validation import ConfigError


def _team(behavior: str) -> int:
    """The team of a behavior name ``Name?team=N`` (0 without one)."""
    _, _, query = behavior.partition("?")
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "team" and value.isdigit():
            return int(value)
    return 0


class UnityMultiAgent(gym.Env):
    """A low-level ML-Agents environment (``mlagents_envs.environment.UnityEnvironment`` or an object with the
    same methods: ``reset``, ``step``, ``close``, ``behavior_specs``, ``get_steps``, ``set_actions``) in msf's
    multi-agent interface.

    Attributes:
        num_agents: agents of all behaviors. agent_teams: the team of each agent (from ``?team=N``).
        behaviors: the behavior names, sorted.

    Raises:
        ValueError: the behaviors' observation or action specs differ, or hybrid (discrete and continuous)
            actions.
    """

    def __init__(self, unity_env: Any):
        self.env = unity_env
        self.env.reset()
        self.behaviors = sorted(self.env.behavior_specs.keys())
        specs = [self.env.behavior_specs[b] for b in self.behaviors]
        first = specs[0]
        for b, spec in zip(self.behaviors[1:], specs[1:]):
            if [o.shape for o in spec.observation_specs] != [
                o.shape for o in first.observation_specs
            ] or spec.action_spec != first.action_spec:
                raise ValueError(
                    f"UnityMultiAgent: behavior {b!r} has other observation or action specs than "
                    f"{self.behaviors[0]!r}; msf needs the same for all behaviors"
                )
        self.agents: list[tuple[str, int]] = []  # (behavior, agent id) per msf agent
        for b in self.behaviors:
            decisions, _ = self.env.get_steps(b)
            self.agents.extend((b, int(a)) for a in decisions.agent_id)
        self.num_agents = len(self.agents)
        self.agent_teams = [_team(b) for b, _ in self.agents]
        shapes = [tuple(o.shape) for o in first.observation_specs]
        boxes = [gym.spaces.Box(-np.inf, np.inf, s, dtype=np.float32) for s in shapes]
        self.observation_space = (
            boxes[0] if len(boxes) == 1 else gym.spaces.Dict({f"obs_{i}": box for i, box in enumerate(boxes)})
        )
        act = first.action_spec
        if act.continuous_size and act.discrete_size:
            raise ValueError("UnityMultiAgent: hybrid (continuous and discrete) actions are not supported")
        self.discrete = act.discrete_size > 0
        if self.discrete:
            branches = tuple(int(n) for n in act.discrete_branches)
            self.action_space = (
                gym.spaces.Discrete(branches[0]) if len(branches) == 1 else gym.spaces.MultiDiscrete(list(branches))
            )
        else:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (act.continuous_size,), dtype=np.float32)
        self.index = {agent: i for i, agent in enumerate(self.agents)}
        self.last_obs = [None] * self.num_agents
        self._read_first()

    def _obs_of(self, steps: Any, j: int) -> Any:
        obs = [np.asarray(o[j], dtype=np.float32) for o in steps.obs]
        return obs[0] if len(obs) == 1 else {f"obs_{i}": o for i, o in enumerate(obs)}

    def _read_first(self) -> list:
        for b in self.behaviors:
            decisions, _ = self.env.get_steps(b)
            for j, a in enumerate(decisions.agent_id):
                self.last_obs[self.index[(b, int(a))]] = self._obs_of(decisions, j)
        missing = [self.agents[i] for i, o in enumerate(self.last_obs) if o is None]
        if missing:
            raise ValueError(f"UnityMultiAgent: agents {missing} asked for no decision at the start of an episode")
        self.fresh = True
        return list(self.last_obs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if not self.fresh:  # right after construction the scene is already reset
            self.env.reset()
            self._read_first()
        self.fresh = False
        return list(self.last_obs), {}

    def step(self, actions):
        from mlagents_envs.base_env import ActionTuple

        self.fresh = False
        for b in self.behaviors:
            decisions, _ = self.env.get_steps(b)
            if len(decisions) == 0:
                continue
            rows = np.asarray([actions[self.index[(b, int(a))]] for a in decisions.agent_id])
            if self.discrete:
                self.env.set_actions(b, ActionTuple(discrete=rows.reshape(len(rows), -1).astype(np.int32)))
            else:
                self.env.set_actions(b, ActionTuple(continuous=rows.reshape(len(rows), -1).astype(np.float32)))
        self.env.step()
        rewards = np.zeros(self.num_agents, dtype=np.float32)
        term = [False] * self.num_agents
        trunc = [False] * self.num_agents
        for b in self.behaviors:
            decisions, terminals = self.env.get_steps(b)
            for j, a in enumerate(terminals.agent_id):
                i = self.index[(b, int(a))]
                rewards[i] += float(terminals.reward[j])
                trunc[i] = bool(terminals.interrupted[j])  # ended by a step limit
                term[i] = not trunc[i]
                self.last_obs[i] = self._obs_of(terminals, j)
            ended = set(int(a) for a in terminals.agent_id)
            for j, a in enumerate(decisions.agent_id):
                i = self.index[(b, int(a))]
                if int(a) not in ended:
                    rewards[i] += float(decisions.reward[j])
                self.last_obs[i] = self._obs_of(decisions, j)  # after an end: the next episode's first
        return list(self.last_obs), rewards, term, trunc, {}

    def close(self):
        self.env.close()


def make_unity(name: str, env_config: dict[str, Any]) -> gym.Env:
    """``unity_*``: the built scene at ``--unity_env_path``, one Unity process per env (``worker_id`` = the
    env's global index, so ports differ), without graphics.

    Raises:
        ConfigError: no ``--unity_env_path``, or ML-Agents' Python package cannot be imported.
    """
    path = env_config.get("unity_env_path")
    if not path:
        raise ConfigError(f"--unity_env_path: {name} needs the path of a built Unity scene (an executable)")
    try:
        from mlagents_envs.environment import UnityEnvironment
    except ImportError as e:
        raise ConfigError(
            f"--env: {name} needs ML-Agents' Python API: pip install 'multi-sample-factory[unity]' ({e})"
        ) from None
    except Exception as e:  # noqa: BLE001 - e.g. its generated protobuf code under a newer protobuf
        raise ConfigError(
            f"--env: mlagents_envs cannot be imported here ({type(e).__name__}: {e}); its "
            "protobuf code may need an older protobuf"
        ) from None
    env = UnityEnvironment(
        file_name=path,
        worker_id=int(env_config.get("env_index", 0)),
        seed=int(env_config.get("seed", 0)),
        no_graphics=True,
    )
    return UnityMultiAgent(env)
