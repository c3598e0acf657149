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

from msf.envs import declare_spaces, register_env, register_vector_env


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


class CrashingCartPole(CartPoleEnv):
    """CartPole whose process dies by SIGSEGV (as a crash in an env's native code does, with no Python
    exception to report) once ``MSF_TEST_FAIL_AFTER_S`` seconds (default 4) have passed, in rollout worker
    0 only."""

    def __init__(self, worker_index: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = time.monotonic() + float(os.environ.get("MSF_TEST_FAIL_AFTER_S", "4"))
        self.crashes = worker_index == 0

    def step(self, action):
        if self.crashes and time.monotonic() > self.fail_at:
            import signal

            signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # faulthandler would print a traceback first
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().step(action)


def _make_crashing(name, env_config):
    return gym.wrappers.TimeLimit(CrashingCartPole(worker_index=env_config["worker_index"]), 500)


register_env("MsfCrashingCartPole", _make_crashing)  # an msf registration: the maker sees worker_index


class NonFiniteCartPole(CartPoleEnv):
    """CartPole whose env ``MSF_TEST_BAD_ENV`` (global env index, default 5) returns a NaN observation (``field``
    "observation") or an infinite reward ("reward") at step 5 of its episode ``MSF_TEST_BAD_EPISODE`` (default
    30, counted from its first reset; every CartPole episode is longer than 5 steps)."""

    def __init__(self, field: str, env_index: int, **kwargs):
        super().__init__(**kwargs)
        self.field = field if env_index == int(os.environ.get("MSF_TEST_BAD_ENV", "5")) else None
        self.bad_episode = int(os.environ.get("MSF_TEST_BAD_EPISODE", "30"))
        self.episode, self.t = 0, 0

    def reset(self, **kwargs):
        self.episode, self.t = self.episode + 1, 0
        return super().reset(**kwargs)

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        self.t += 1
        if self.field is not None and (self.episode, self.t) == (self.bad_episode, 5):
            if self.field == "observation":
                obs = obs.copy()
                obs[0] = np.nan
            else:
                r = float("inf")
        return obs, r, te, tr, info


def _make_non_finite(name, env_config):
    field = "observation" if name == "MsfNanCartPole" else "reward"
    return gym.wrappers.TimeLimit(NonFiniteCartPole(field, env_config["env_index"]), 500)


register_env("MsfNanCartPole", _make_non_finite)  # a NaN observation
register_env("MsfInfRewardCartPole", _make_non_finite)  # an infinite reward


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


class DictMaskEnv(gym.Env):
    """Dict observations with an action mask: ``cue`` (Discrete(3), the rewarded action), ``noise``
    (Box(4)) and ``action_mask`` (MultiBinary(3), one action other than the cue forbidden each step).
    Reward 1 for the cue, 0 for the other allowed action, -10 for the forbidden one; 20 steps. A policy
    that reads the cue scores 20; a forbidden action can only be taken if the mask is ignored."""

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Dict(
            {
                "cue": gym.spaces.Discrete(3),
                "noise": gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32),
                "action_mask": gym.spaces.MultiBinary(3),
            }
        )
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0

    def _obs(self):
        self.cue = int(self.np_random.integers(3))
        self.forbidden = int((self.cue + 1 + self.np_random.integers(2)) % 3)
        mask = np.ones(3, dtype=np.int8)
        mask[self.forbidden] = 0
        return {"cue": self.cue, "noise": self.np_random.uniform(-1, 1, 4).astype(np.float32), "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a = int(action)
        reward = -10.0 if a == self.forbidden else float(a == self.cue)
        self.t += 1
        return self._obs(), reward, False, self.t >= 20, {}


class MultiChoiceEnv(gym.Env):
    """Two choices per step: observations show two targets in {0, 1, 2} (one-hot, 6 floats); each action
    dimension that names its target earns 0.5; 20 steps. ``MultiDiscrete([3, 3])`` actions, or with
    ``tuple_actions`` a ``Tuple`` of two ``Discrete(3)``."""

    def __init__(self, tuple_actions: bool = False, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (6,), dtype=np.float32)
        self.action_space = (
            gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(3)))
            if tuple_actions
            else gym.spaces.MultiDiscrete([3, 3])
        )
        self.t = 0

    def _obs(self):
        self.targets = self.np_random.integers(3, size=2)
        o = np.zeros(6, dtype=np.float32)
        o[self.targets[0]] = o[3 + self.targets[1]] = 1.0
        return o

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = 0.5 * sum(int(a) == int(t) for a, t in zip(action, self.targets))
        self.t += 1
        return self._obs(), reward, False, self.t >= 20, {}


gym.register("MsfDictMask-v0", entry_point=DictMaskEnv)
gym.register("MsfMultiDiscrete-v0", entry_point=MultiChoiceEnv)
gym.register("MsfTupleActions-v0", entry_point=MultiChoiceEnv, kwargs={"tuple_actions": True})


class CoinRaceGame:
    """Two players on a line of ``L`` cells chase one coin. Each step both move (0 left, 1 stay, 2 right);
    a player on the coin's cell earns 1 (both, if both are there) and the coin reappears on a free cell.
    Each player sees itself, the other and the coin as one-hots, ``[3 L]`` float32 (its own view, so one
    policy can play either side). ``steps`` steps per episode (truncated). A random player collects about
    one coin per episode; one that walks to the coin about one every three or four steps."""

    L = 9

    def __init__(self, steps: int = 40):
        self.steps = steps
        self.rng = np.random.default_rng()

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.pos = self.rng.choice(self.L, size=2, replace=False)
        self._new_coin()
        return self.observations()

    def _new_coin(self):
        free = [c for c in range(self.L) if c not in self.pos]
        self.coin = int(self.rng.choice(free))

    def observations(self):
        obs = []
        for i in range(2):
            o = np.zeros(3 * self.L, dtype=np.float32)
            o[self.pos[i]] = o[self.L + self.pos[1 - i]] = o[2 * self.L + self.coin] = 1.0
            obs.append(o)
        return obs

    def step(self, actions):
        self.pos = np.clip(self.pos + np.asarray(actions, dtype=np.int64) - 1, 0, self.L - 1)
        rewards = [float(p == self.coin) for p in self.pos]
        if any(rewards):
            self._new_coin()
        self.t += 1
        return self.observations(), rewards, self.t >= self.steps


class CoinRace(gym.Env):
    """:class:`CoinRaceGame` in msf's multi-agent env interface (``num_agents = 2``, lists per agent)."""

    num_agents = 2

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3 * CoinRaceGame.L,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.game = CoinRaceGame()

    def reset(self, *, seed=None, options=None):
        return self.game.reset(seed), {}

    def step(self, actions):
        obs, rewards, over = self.game.step(actions)
        return obs, rewards, [False, False], [over, over], {}


gym.register("MsfCoinRace-v0", entry_point=CoinRace)


def coin_race_parallel_env():
    """:class:`CoinRaceGame` as a PettingZoo parallel env (agents ``player_0``, ``player_1``)."""
    from pettingzoo import ParallelEnv

    class CoinRaceParallel(ParallelEnv):
        metadata = {"name": "coin_race_v0"}

        def __init__(self):
            self.possible_agents = ["player_0", "player_1"]
            self.agents = []
            self.game = CoinRaceGame()
            self._obs_space = gym.spaces.Box(0.0, 1.0, (3 * CoinRaceGame.L,), dtype=np.float32)

        def observation_space(self, agent):
            return self._obs_space

        def action_space(self, agent):
            return gym.spaces.Discrete(3)

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            obs = self.game.reset(seed)
            return dict(zip(self.agents, obs)), {a: {} for a in self.agents}

        def step(self, actions):
            obs, rewards, over = self.game.step([actions[a] for a in self.possible_agents])
            agents = self.agents
            if over:
                self.agents = []
            return (
                dict(zip(agents, obs)),
                dict(zip(agents, rewards)),
                {a: False for a in agents},
                {a: over for a in agents},
                {a: {} for a in agents},
            )

    return CoinRaceParallel()


def _register_pettingzoo():
    from msf.envs.pettingzoo import PettingZooParallel
    from msf.envs.registry import register_env

    register_env("msf_coin_race_pz", lambda name, env_config: PettingZooParallel(coin_race_parallel_env()))


_register_pettingzoo()


def _register_fake_unity():
    import importlib.util

    if importlib.util.find_spec("mlagents_envs") is None:
        return
    from msf.envs.registry import register_env
    from msf.envs.unity import UnityMultiAgent

    def make(name, env_config):
        from fake_unity import FakeDuel

        return UnityMultiAgent(FakeDuel(seed=env_config.get("seed", 0)))

    register_env("unity_fake_duel", make)


_register_fake_unity()


class StallingCartPole(CartPoleEnv):
    """CartPole whose steps take ``MSF_TEST_STALL_S`` seconds (default 0.5) in the envs of device group
    ``MSF_TEST_STALL_RANK`` (default 1); elsewhere a plain CartPole."""

    def __init__(self, device_group: int = 0, **kwargs):
        super().__init__(**kwargs)
        stalls = device_group == int(os.environ.get("MSF_TEST_STALL_RANK", "1"))
        self.delay = float(os.environ.get("MSF_TEST_STALL_S", "0.5")) if stalls else 0.0

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        return super().step(action)


def _make_stalling(name, env_config):
    import multiprocessing

    # the process name ("rank1/rollout_worker_0") where env_config has no device_group (msf before it had one)
    process = multiprocessing.current_process().name
    group = env_config.get("device_group", int(process[4]) if process.startswith("rank") else 0)
    return gym.wrappers.TimeLimit(StallingCartPole(group), 500)


register_env("MsfStallingCartPole", _make_stalling)


def _make_recording(name, env_config):
    """CartPole that writes the ``env_config`` it was made with (and its process's name) as one JSON file into
    ``MSF_TEST_RECORD_DIR``."""
    import json
    import multiprocessing
    import uuid

    record = {k: v for k, v in env_config.items() if isinstance(v, (int, float, str, bool, type(None)))}
    record["process"] = multiprocessing.current_process().name
    path = os.path.join(os.environ["MSF_TEST_RECORD_DIR"], f"{uuid.uuid4().hex}.json")
    with open(path, "w") as f:
        json.dump(record, f)
    return gym.wrappers.TimeLimit(CartPoleEnv(), 500)


register_env("MsfRecordingCartPole", _make_recording)


class SlowStartCartPole(CartPoleEnv):
    """CartPole whose constructor takes ``MSF_TEST_SLOW_START_S`` seconds (default 3); each construction appends
    one line (the process's name) to the file ``MSF_TEST_CONSTRUCTIONS``, where that is set."""

    def __init__(self, **kwargs):
        time.sleep(float(os.environ.get("MSF_TEST_SLOW_START_S", "3")))
        super().__init__(**kwargs)
        record = os.environ.get("MSF_TEST_CONSTRUCTIONS")
        if record:
            import multiprocessing

            with open(record, "a") as f:  # one short write per line: whole lines, whichever process appends
                f.write(f"{multiprocessing.current_process().name}\n")


gym.register("MsfSlowStartCartPole-v0", entry_point=SlowStartCartPole, max_episode_steps=500)
# the same env with its spaces declared: msf-train reads them without making one
gym.register("MsfDeclaredSlowStartCartPole-v0", entry_point=SlowStartCartPole, max_episode_steps=500)
declare_spaces(
    "MsfDeclaredSlowStartCartPole-v0",
    gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
    gym.spaces.Discrete(2),
)


def _make_doom(name, env_config):
    """``doom_basic`` as a busy machine starts it: the first reset of an env outside rollout worker 0 takes
    ``MSF_TEST_DOOM_SLOW_START_S`` seconds more (default 0), after its engine has started; with
    ``MSF_TEST_DOOM_FAIL=1`` the first reset of rollout worker 0's second env raises, after its first engine
    has started (an env that fails to start while the other workers' engines are still starting)."""
    from msf.envs.families import make_doom

    env = make_doom("doom_basic", env_config)
    worker, index = env_config["worker_index"], env_config["env_index"]
    n = int(os.environ.get("MSF_TEST_DOOM_ENVS_PER_WORKER", "8"))
    fails = os.environ.get("MSF_TEST_DOOM_FAIL") == "1" and worker == 0 and index % n == 1
    delay = float(os.environ.get("MSF_TEST_DOOM_SLOW_START_S", "0")) if worker != 0 else 0.0

    class Starting(gym.Wrapper):
        started = False

        def reset(self, **kwargs):
            if fails:
                raise RuntimeError("deliberate failure of a Doom environment's start (msf test)")
            out = self.env.reset(**kwargs)
            if not self.started:
                self.started = True
                time.sleep(delay)
            return out

    return Starting(env)


register_env("MsfDoom", _make_doom)


class UnseededCartPole(CartPoleEnv):
    """CartPole whose reset ignores the seed it is given (it draws its start state from the OS): what
    ``--deterministic`` warns about."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=int.from_bytes(os.urandom(4), "little"), options=options)


gym.register("MsfUnseededCartPole-v0", entry_point=UnseededCartPole, max_episode_steps=500)


class TargetReach(gym.Env):
    """Continuous control in one step of thought: the observation is a target ``x`` in [-0.8, 0.8] (float32
    ``[1]``, plus a constant 1), the action ``a`` (``Box(-1, 1, (1,))``) earns ``1 - (a - x)^2``; 10 steps per
    episode, a new target each step. A policy that outputs its observation earns 10; a zero-mean unit Gaussian
    about 10 x (1 - 1.32) < 0 (actions clipped to [-1, 1]: about -0.3 per step)."""

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
        self.t, self.x = 0, 0.0

    def _obs(self):
        self.x = float(self.np_random.uniform(-0.8, 0.8))
        return np.array([self.x, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a = float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
        reward = 1.0 - (a - self.x) ** 2
        self.t += 1
        return self._obs(), reward, False, self.t >= 10, {}


gym.register("MsfTargetReach-v0", entry_point=TargetReach)


class SlowCloseCartPole(CartPoleEnv):
    """CartPole whose ``close`` takes ``MSF_TEST_SLOW_CLOSE_S`` seconds (default 8): the workers are still closing
    their envs for that long after a stop, until the stop's grace ends them. Its spaces are declared, so that
    msf-train's launcher does not make (and close) one to read them."""

    def close(self):
        time.sleep(float(os.environ.get("MSF_TEST_SLOW_CLOSE_S", "8")))
        super().close()


gym.register("MsfSlowCloseCartPole-v0", entry_point=SlowCloseCartPole, max_episode_steps=500)
declare_spaces("MsfSlowCloseCartPole-v0", gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))


FIVE_STEPS = 5


class FiveStepVectorEnv(gym.vector.VectorEnv):
    """A deterministic ``VectorEnv`` of ``num_envs`` envs whose episodes last :data:`FIVE_STEPS` steps, in the
    autoreset mode ``autoreset_mode`` (gymnasium's rules for each: next-step, same-step, disabled).

    Observation ``[env index, episode, step in the episode, 0]`` float32 (the env index is the job-wide one,
    ``first + i``); the ``k``-th step of an episode (k = 1..5) earns reward ``k`` (return 15); an episode ends at its
    5th step, terminated for an even env index and truncated for an odd one. ``taken`` records every real
    transition ``(env, episode, step before, action)``; ``autoresets`` counts the next-step reset steps. Stepping an
    ended env without resetting it in disabled mode raises ``RuntimeError``."""

    def __init__(self, num_envs: int, first: int = 0, autoreset_mode: str = "NextStep"):
        self.num_envs, self.first = num_envs, first
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode(autoreset_mode)}
        self.single_observation_space = gym.spaces.Box(-1.0, 1e6, (4,), dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(3)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.episode = np.zeros(num_envs, dtype=np.int64)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.ended = np.zeros(num_envs, dtype=bool)
        self.taken: list[tuple[int, int, int, int]] = []
        self.autoresets = 0

    def _obs(self) -> np.ndarray:
        envs = self.first + np.arange(self.num_envs)
        return np.stack([envs, self.episode, self.t, np.zeros(self.num_envs)], axis=1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, dtype=bool))
        self.episode[mask & (self.t > 0)] += 1
        self.t[mask], self.ended[mask] = 0, False
        return self._obs(), {}

    def step(self, actions):
        actions = np.asarray(actions)
        mode = self.metadata["autoreset_mode"]
        if mode == gym.vector.AutoresetMode.DISABLED and self.ended.any():
            raise RuntimeError(f"envs {np.nonzero(self.ended)[0].tolist()} stepped after their end, not reset")
        resetting = self.ended & (mode == gym.vector.AutoresetMode.NEXT_STEP)
        self.autoresets += int(resetting.sum())
        for i in np.nonzero(~resetting)[0]:
            self.taken.append((self.first + int(i), int(self.episode[i]), int(self.t[i]), int(actions[i])))
        self.episode[resetting] += 1
        self.t[resetting] = 0
        self.t[~resetting] += 1
        rew = np.where(resetting, 0, self.t).astype(np.float64)
        ended = (self.t == FIVE_STEPS) & ~resetting
        odd = (self.first + np.arange(self.num_envs)) % 2 == 1
        self.ended = ended
        info = {}
        if mode == gym.vector.AutoresetMode.SAME_STEP and ended.any():
            info = {"final_obs": self._obs()[ended]}
            self.episode[ended] += 1
            self.t[ended] = 0
            self.ended = np.zeros(self.num_envs, dtype=bool)
        return self._obs(), rew, ended & ~odd, ended & odd, info

    def close(self, **kwargs):
        pass


def make_five_step_next(name, num_envs, env_config):
    return FiveStepVectorEnv(num_envs, env_config["env_index"], "NextStep")


def make_five_step_same(name, num_envs, env_config):
    return FiveStepVectorEnv(num_envs, env_config["env_index"], "SameStep")


def make_five_step_disabled(name, num_envs, env_config):
    return FiveStepVectorEnv(num_envs, env_config["env_index"], "Disabled")


register_vector_env("MsfFiveStepNext", make_five_step_next)
register_vector_env("MsfFiveStepSame", make_five_step_same)
register_vector_env("MsfFiveStepDisabled", make_five_step_disabled)
# declared for one of them: msf-train reads the spaces here; the others are made once to read them
declare_spaces("MsfFiveStepSame", gym.spaces.Box(-1.0, 1e6, (4,), dtype=np.float32), gym.spaces.Discrete(3))


def make_five_step_misdeclared(name, num_envs, env_config):
    return FiveStepVectorEnv(num_envs, env_config["env_index"], "NextStep")


register_vector_env("MsfFiveStepMisdeclared", make_five_step_misdeclared)
declare_spaces("MsfFiveStepMisdeclared", gym.spaces.Box(-1.0, 1e6, (5,), dtype=np.float32), gym.spaces.Discrete(3))


def _make_with_a_typo(name, env_config):
    """A user's maker with a bug: a name that does not exist (the NameError is the test's point)."""
    return gym.make(CartPol)  # noqa: F821


# its spaces declared, so msf-train makes no env itself: the first to make one is a rollout worker
register_env("MsfTypoCartPole", _make_with_a_typo)
declare_spaces("MsfTypoCartPole", gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
