"""The envs of one split of a rollout worker, stepped together: the env backend.

A rollout worker steps its ``num_envs_per_worker`` envs in ``worker_num_splits`` groups (splits);
each split is one :class:`EnvSplit`. Three backends (``--env_backend``):

* ``gymnasium`` (default): one gymnasium env per slot, stepped in a Python loop (:class:`GymSplit`);
* ``vector``: one gymnasium ``VectorEnv`` per split, stepped in one call (:class:`VectorSplit`): a registered
  factory (:func:`msf.envs.register_vector_env`), ale-py's ``AtariVectorEnv`` for ``atari_*``, or a gymnasium id's
  vector entry point (classic control: ``CartPole-v1``, ...);
* ``envpool``: one EnvPool per split, behind the same :class:`VectorSplit` (:class:`EnvPoolVector`); for ``atari_*``,
  ``mujoco_*`` and gymnasium's classic-control ids (``msf.cfg.validation.ENVPOOL_CLASSIC``).

All return the observation *after* an episode end as the first observation of the next episode (same-step
autoreset), whatever the env's own autoreset mode (:class:`VectorSplit`), so the rollout worker does not know which
backend it drives.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from msf.cfg.validation import ENVPOOL_CLASSIC, ENVPOOL_SERVES, ConfigError, envpool_serves
from msf.envs.registry import env_config_of, make_env, num_agents_of, raised, single_spaces, vector_maker
from msf.runtime.spawning import OneLineFailure

DECORRELATION_ROLLOUTS = 16
"""With ``--decorrelate_envs_on_one_worker``, no env takes this many rollouts of random steps or more."""


class EnvStepFailed(RuntimeError):
    """An env's ``step`` raised: one line naming the env, the exception and the innermost frame it came from, the
    rollout worker, its env (gymnasium backend) or envs (vector env) and the split's step; the env's exception is
    the ``__cause__``."""


def decorrelation_steps(j: int, n: int, rollout: int) -> int:
    """The random steps env ``j`` of a worker's ``n`` takes after its first reset (--decorrelate_envs_on_one_worker):
    ``j x rollout`` (Sample Factory's rule) while ``n`` <= :data:`DECORRELATION_ROLLOUTS`; with more envs, ``j x
    rollout x D / n`` (rounded down) of ``D`` = :data:`DECORRELATION_ROLLOUTS`: spread as evenly over ``D``
    rollouts, so that the start-up grows with ``n``, not with its square (256 envs of rollout 32: 65,280 steps in
    all, against 1,044,480)."""
    return j * rollout * min(n, DECORRELATION_ROLLOUTS) // max(n, 1)


class GymSplit:
    """``n`` gymnasium envs made by :func:`msf.envs.registry.make_env`, stepped one after the other; with a
    multi-agent env (``num_agents`` = A > 1, see :func:`msf.envs.registry.num_agents_of`) ``n x A`` rows,
    env ``i``'s agents at rows ``i * A .. i * A + A - 1``.

    Args:
        cfg: the run's config. worker_index: the rollout worker (global: over every device group).
        env_indices: global indices of the envs (their seeds are ``seed + index``). seed: the device group's
        seed. device_group: the device group's rank (in ``env_config``). on_env: called with ``"made"`` after
        each env is made and with ``"started"`` after its first reset, which is when a ViZDoom engine starts
        (start-up progress; it may raise to stop the start-up: the envs made so far are closed).
    """

    def __init__(
        self,
        cfg: Any,
        worker_index: int,
        env_indices: list[int],
        seed: int,
        device_group: int = 0,
        on_env: Callable[[str], None] | None = None,
    ):
        self.envs: list[gym.Env] = []
        try:
            for i in env_indices:
                config = env_config_of(cfg, worker_index, i, seed + i, device_group=device_group)
                self.envs.append(make_env(cfg.env, config))
                if on_env is not None:
                    on_env("made")
        except BaseException:
            self.close()  # an env that starts a process (ViZDoom's engine) must not outlive a failed start
            raise
        self.seeds = [seed + i for i in env_indices]
        per_worker = int(getattr(cfg, "num_envs_per_worker", 1))
        decorrelate = bool(getattr(cfg, "decorrelate_envs_on_one_worker", False))
        self.random_steps = [
            decorrelation_steps(i - worker_index * per_worker, per_worker, int(cfg.rollout)) if decorrelate else 0
            for i in env_indices
        ]
        self.on_env = on_env
        self.action_space = self.envs[0].action_space
        self.tuple_actions = isinstance(self.action_space, gym.spaces.Tuple)
        self.A = num_agents_of(self.envs[0])
        self.name, self.env_indices, self.steps = cfg.env, env_indices, 0
        self.where = f"rollout worker {worker_index}, env"  # of the failure line (with the env index)
        self.ended = np.zeros(len(self.envs) * self.A, dtype=bool)  # rows whose episode ended at the last step
        self.autoreset_rows: np.ndarray | None = None  # every step is a transition (see VectorSplit)

    def _action(self, a: np.ndarray) -> Any:
        return tuple(a.tolist()) if self.tuple_actions else a

    def reset(self) -> list[np.ndarray]:
        """The first observation of every env (seeded), a list of ``n`` (``n x A``) arrays; with
        ``--decorrelate_envs_on_one_worker``, the observation after its random steps (:meth:`_random_steps`)."""
        firsts = []
        for env, s, steps in zip(self.envs, self.seeds, self.random_steps):
            obs = env.reset(seed=s)[0]
            if self.on_env is not None:
                self.on_env("started")
            firsts.append(self._random_steps(env, obs, s, steps))
        self.on_env = None  # the start-up is over
        return firsts if self.A == 1 else [o for obs in firsts for o in obs]

    def _random_steps(self, env: gym.Env, obs: Any, seed: int, steps: int) -> Any:
        """Step ``env`` ``steps`` times with random actions from its action space (seeded by ``seed``, so that a run
        repeats), resetting it after an episode end; return the last observation (Sample Factory's decorrelation
        of the envs of one worker)."""
        if steps <= 0:
            return obs
        space = env.action_space
        space.seed(seed)
        for _ in range(steps):
            action = space.sample() if self.A == 1 else [space.sample() for _ in range(self.A)]
            obs, _, te, tr, _ = env.step(action)
            if np.all(np.asarray(te) | np.asarray(tr)):
                obs, _ = env.reset()
        return obs

    def step(self, actions: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """Step every env with ``actions[i]`` (a multi-agent env with ``actions[i * A:(i + 1) * A]``).

        Returns:
            obs (``n`` (``n x A``) arrays; after an episode end, the next episode's first observation),
            rewards ``[n]`` float32, terminated ``[n]`` bool, truncated ``[n]`` bool (``[n x A]`` each).
        """
        A = self.A
        rows = len(self.envs) * A
        rew = np.empty(rows, dtype=np.float32)
        term = np.zeros(rows, dtype=bool)
        trunc = np.zeros(rows, dtype=bool)
        obs_out: list = [None] * rows
        self.steps += 1
        for i, env in enumerate(self.envs):
            if A == 1:
                obs, r, te, tr, _ = self._env_step(i, self._action(actions[i]))
                rew[i], term[i], trunc[i] = r, te, tr
                if te or tr:
                    obs, _ = env.reset()
                obs_out[i] = obs
                continue
            lo = i * A
            obs, r, te, tr, _ = self._env_step(i, [self._action(a) for a in actions[lo : lo + A]])
            rew[lo : lo + A], term[lo : lo + A], trunc[lo : lo + A] = r, te, tr
            ended = term[lo : lo + A] | trunc[lo : lo + A]
            if np.all(ended):
                obs, _ = env.reset()
                ended = np.zeros(A, dtype=bool)
            elif np.any(ended & self.ended[lo : lo + A]):
                agent = int(np.nonzero(ended & self.ended[lo : lo + A])[0][0])
                raise ValueError(
                    f"{self.name}: agent {agent} reported its episode's end on two steps in a row while other agents "
                    "played on. After its end an agent must start a new episode at once (its next observation "
                    "is the new episode's first, as Unity's agents do), or the episode must end for all agents "
                    "in the same step"
                )
            self.ended[lo : lo + A] = ended
            obs_out[lo : lo + A] = list(obs)
        return obs_out, rew, term, trunc

    def _env_step(self, i: int, action: Any) -> tuple:
        try:
            return self.envs[i].step(action)
        except Exception as e:  # the env's code: named in one line; its traceback is the cause's, in log.txt
            at = f"{self.env_indices[i]}, at step {self.steps}"
            raise EnvStepFailed(f"{self.name}'s step raised {raised(e)}, on {self.where} {at}") from e

    def close(self) -> None:
        """Close every env, even when one of them fails to (the first failure is raised after)."""
        close_all(env.close for env in self.envs)


def close_all(closers: Any) -> None:
    """Call every one of ``closers``; then raise the first exception one of them raised, if any."""
    first: BaseException | None = None
    for close in closers:
        try:
            close()
        except Exception as e:  # noqa: BLE001 - the others must still be closed
            first = first or e
    if first is not None:
        raise first


def envpool_task(name: str) -> str:
    """The EnvPool task id of an msf env name: ``atari_space_invaders`` -> ``SpaceInvaders-v5``,
    ``mujoco_hopper`` -> ``Hopper-v5``, ``CartPole-v1`` -> ``CartPole-v1`` (the classic-control ids of
    ``msf.cfg.validation.ENVPOOL_CLASSIC`` are EnvPool's too).

    Raises:
        ConfigError: EnvPool is not installed (names the pip command), the env is not one EnvPool
            serves here (names those it serves), or EnvPool has no such task.
    """
    from msf.envs.families import MUJOCO, family_of

    family = family_of(name)
    if not envpool_serves(name):
        raise ConfigError(
            f"--env_backend=envpool: serves {ENVPOOL_SERVES} only, not {name!r}; use --env_backend=gymnasium"
        )
    try:
        import envpool
    except ImportError:
        raise ConfigError(
            "--env_backend=envpool needs the envpool extra: pip install 'multi-sample-factory[envpool]'"
        ) from None
    if name in ENVPOOL_CLASSIC:
        task: str | None = name
    elif family == "mujoco_":
        task = MUJOCO.get(name[len("mujoco_") :])
        if task is None:
            raise ConfigError(
                f"--env: unknown MuJoCo task {name!r}; valid: " + ", ".join(f"mujoco_{k}" for k in MUJOCO)
            )
    else:
        key = name[len("atari_") :].replace("_", "").lower() + "-v5"
        task = next((t for t in envpool.list_all_envs() if t.lower() == key), None)
        if task is None:
            raise ConfigError(f"--env: EnvPool has no Atari game {name!r} (atari_<game>, e.g. atari_pong)")
    if task not in envpool.list_all_envs():
        raise ConfigError(f"--env_backend=envpool: EnvPool {envpool.__version__} has no task {task}")
    return task


def make_envpool(cfg: Any, num_envs: int, seed: int, evaluation: bool = False) -> Any:
    """An EnvPool (gymnasium API, synchronous, one thread) of ``num_envs`` envs of ``cfg.env``, with the
    preprocessing of the gymnasium backend: for Atari 30 no-op starts, frameskip 4 with max-pooling, S x S grayscale
    (S: ``--atari_screen_size``, 84), ``env_framestack`` (4) stacked frames ``[4, S, S]`` uint8, no fire on reset, at
    most 27,000 steps (108,000 frames), and for training life loss as episode end (the game goes on) and rewards
    clipped to their sign; sticky actions and the full action set from the ``atari_*`` flags."""
    import envpool

    from msf.envs.families import ATARI_NOOP_MAX

    task = envpool_task(cfg.env)
    kw: dict[str, Any] = {}
    if cfg.env.startswith("atari_"):
        kw = dict(
            stack_num=int(getattr(cfg, "env_framestack", None) or 4),
            frame_skip=4,
            noop_max=ATARI_NOOP_MAX,
            img_height=cfg.atari_screen_size,
            img_width=cfg.atari_screen_size,
            gray_scale=True,
            episodic_life=not evaluation,
            reward_clip=not evaluation,
            use_fire_reset=False,
            max_episode_steps=27_000,
            repeat_action_probability=0.25 if cfg.atari_sticky_actions else 0.0,
            full_action_space=bool(cfg.atari_full_action_space),
        )
    with warnings.catch_warnings():
        # EnvPool builds its Box spaces from float64 bounds; gymnasium warns of the cast to float32 in every worker
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32", category=UserWarning)
        pool = envpool.make(
            task, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, num_threads=1, seed=int(seed), **kw
        )
        pool.observation_space, pool.action_space  # noqa: B018 - built here, on first use, with the warning
    return pool


class VectorSplit:
    """``n`` envs in one vectorised env, stepped in one call (``--env_backend=vector`` and ``envpool``): a gymnasium
    ``VectorEnv`` (numpy arrays of ``n`` in and out), made by :func:`make_vector_env`.

    The contract with the rollout worker is :class:`GymSplit`'s: the observation returned with an episode's end is
    the next episode's first. How it is met depends on the env's autoreset mode (``metadata["autoreset_mode"]``,
    gymnasium's ``AutoresetMode``; next-step where the key is missing):

    * same-step: the env's own.
    * disabled: the ended envs are reset in the same call, ``reset(options={"reset_mask": ended})``.
    * next-step, where the env can reset some envs at once (``reset_now``: gymnasium's ``SyncVectorEnv`` and
      ``AsyncVectorEnv`` by a masked reset, which also cancels their pending autoreset; EnvPool by stepping the ended
      envs alone, which is their reset step): as disabled. No step is wasted.
    * next-step otherwise (gymnasium's ``CartPoleVectorEnv``, whose ``reset`` resets every env): the env hands the
      next episode's first observation back one step late, on a step that ignores the action and returns reward 0.
      The observation returned with the end is then the final one, a placeholder; on the next call those rows are
      :attr:`autoreset_rows`: their observation is the next episode's first, and their step is no transition (its
      reward, terminated and truncated are 0): the rollout worker writes the observation over the placeholder at
      the row's cursor, which does not move, counts no step, reward or frame for it, and asks for its action again.
      The price is one policy row (the placeholder's action, never used) and one env step per episode end. Where
      the end is a trajectory's last step, the placeholder stays its bootstrap row ``obs[slot, T]`` (the slot is
      the learner's by then); after a done that row's value is multiplied by 0, and no statistics read it.

    Attributes:
        autoreset_rows: bool ``[n]``, the rows whose last :meth:`step` was such a reset step; None when there were
            none (every other backend: always None).

    Args:
        venv: the vector env. name: the env's name (messages). worker_index, env_indices: see :class:`GymSplit`.
        seed: the first env's seed (the others' follow, + i, where the env seeds each). reset_now: ``(ended,
        actions, obs) -> obs`` with the ended rows' next first observations, in the same call (None: next-step
        without it). pad_stack: Atari: the frame stack of an episode's first observation repeats its newest
        frame instead of zeros (gymnasium's ``FrameStackObservation``).

    Raises:
        OneLineFailure: its spaces differ from those declared for ``name`` (:func:`msf.envs.declare_spaces`), or a
            step returns observations of another shape than its space's (naming the env, the worker and the step).
    """

    def __init__(
        self,
        venv: Any,
        name: str,
        worker_index: int,
        env_indices: list[int],
        seed: int,
        reset_now: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None,
        pad_stack: bool = False,
    ):
        self.env, self.name, self.seed, self.pad_stack = venv, name, seed, pad_stack
        self.where = f"rollout worker {worker_index}, envs {env_indices[0]}..{env_indices[-1]}"
        try:
            single_spaces(name, venv)
        except (ValueError, ConfigError) as e:
            venv.close()
            raise OneLineFailure(f"{e} ({self.where}, at its creation)") from None
        self.action_space = venv.single_action_space
        self.shape = (len(env_indices), *venv.single_observation_space.shape)
        mode = AutoresetMode(venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        if mode is AutoresetMode.DISABLED or (mode is AutoresetMode.NEXT_STEP and reset_now is None and _masks(venv)):
            reset_now = partial(_masked_reset, venv)
        self.reset_now = None if mode is AutoresetMode.SAME_STEP else reset_now
        self.lazy = mode is AutoresetMode.NEXT_STEP and self.reset_now is None
        self.autoreset_rows: np.ndarray | None = None
        self.pending = np.zeros(len(env_indices), dtype=bool)  # lazy: rows whose next step is their reset step
        self.age = np.zeros(len(env_indices), dtype=np.int64)  # pad_stack: steps since the row's episode started
        self.steps = 0

    def reset(self) -> np.ndarray:
        """The first observation of every env (seeded): ``[n, *obs_shape]``."""
        obs = np.asarray(self.env.reset(seed=self.seed)[0])
        return self._checked(obs, np.ones(len(obs), dtype=bool))

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every env with ``actions[i]``; see the class docstring for the observation after an episode end.

        Returns:
            obs ``[n, *obs_shape]``, rewards ``[n]`` float32, terminated ``[n]`` bool, truncated ``[n]`` bool.
        """
        try:
            obs, rew, term, trunc, _ = self.env.step(actions)
        except Exception as e:  # the env's code: named in one line; its traceback is the cause's, in log.txt
            raise EnvStepFailed(
                f"{self.name}'s step raised {raised(e)}, on {self.where}, at step {self.steps + 1}"
            ) from e
        obs, rew = np.asarray(obs), np.asarray(rew, dtype=np.float32)
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        self.steps += 1
        started = self.pending
        self.autoreset_rows = started if started.any() else None
        if self.autoreset_rows is not None:  # reset steps: no transition, whatever the env says of them
            rew, term, trunc = np.where(started, 0.0, rew).astype(np.float32), term & ~started, trunc & ~started
        ended = term | trunc
        if self.lazy:
            self.pending = ended
        elif ended.any():
            started = ended
            if self.reset_now is not None:
                obs = self.reset_now(ended, actions, obs)
        return self._checked(obs, started), rew, term, trunc

    def _checked(self, obs: np.ndarray, started: np.ndarray) -> np.ndarray:
        """``obs``, after checking its shape; with ``pad_stack``, the frames of a stack ``[S, H, W]`` older than its
        episode (zeros) replaced by the episode's first frame, as gymnasium's ``FrameStackObservation`` pads (the
        rows that ``started`` an episode now; the rows ``a < S - 1`` steps into one)."""
        if obs.shape != self.shape:
            raise OneLineFailure(
                f"{self.name} returned observations of shape {obs.shape}, not {self.shape} as its "
                f"single_observation_space says, on {self.where}, at step {self.steps}"
            )
        if not self.pad_stack:
            return obs
        self.age = np.where(started, 0, self.age + 1)
        young = self.age < obs.shape[1] - 1
        if young.any():
            obs = obs.copy()
            for a in np.unique(self.age[young]).tolist():
                rows, first = self.age == a, obs.shape[1] - 1 - a  # the episode's first frame
                obs[rows, :first] = obs[rows, first : first + 1]
        return obs

    def close(self) -> None:
        self.env.close()


def _masks(venv: Any) -> bool:
    """Whether ``venv`` resets some of its envs with ``reset(options={"reset_mask": ...})`` and cancels their pending
    next-step autoreset: gymnasium's own ``SyncVectorEnv`` and ``AsyncVectorEnv``."""
    return isinstance(getattr(venv, "unwrapped", venv), (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))


def _masked_reset(venv: Any, ended: np.ndarray, actions: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """``obs`` with the ``ended`` rows' next first observations, from a masked reset of ``venv``."""
    first = np.asarray(venv.reset(options={"reset_mask": ended})[0])
    obs = obs.copy()
    obs[ended] = first[ended]
    return obs


class EnvPoolVector:
    """An EnvPool as the vector env :class:`VectorSplit` steps: results in env order, next-step autoreset, and
    :meth:`reset_now`, which steps the ended envs alone (EnvPool's ``env_id``): their reset step."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, pool: Any, n: int):
        self.pool, self.all = pool, np.arange(n, dtype=np.int32)
        self.single_observation_space, self.single_action_space = pool.observation_space, pool.action_space

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        return self.pool.reset()  # seeded when made

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rew, term, trunc, info = self.pool.step(np.asarray(actions), self.all)
        if not np.array_equal(info["env_id"], self.all):  # a synchronous pool keeps the order; be sure
            inv = np.argsort(info["env_id"])
            obs, rew, term, trunc = obs[inv], rew[inv], term[inv], trunc[inv]
        return obs, rew, term, trunc, info

    def reset_now(self, ended: np.ndarray, actions: np.ndarray, obs: np.ndarray) -> np.ndarray:
        ids = np.nonzero(ended)[0].astype(np.int32)
        first = self.pool.step(np.asarray(actions)[ids], ids)
        obs = obs.copy()
        obs[first[4]["env_id"]] = first[0]
        return obs

    def close(self) -> None:
        self.pool.close()


def make_atari_vector(cfg: Any, num_envs: int, evaluation: bool = False) -> Any:
    """ale-py's ``AtariVectorEnv`` of ``num_envs`` envs of ``atari_<game>`` (C++, one thread), with the preprocessing
    of :func:`msf.envs.families.make_atari` and same-step autoreset.

    Raises:
        ConfigError: ale-py has no vector env (ale-py >= 0.10) or no such game.
    """
    from msf.envs import families

    try:
        from ale_py import roms
        from ale_py.vector_env import AtariVectorEnv
    except ImportError:
        raise ConfigError(
            "--env_backend=vector: atari_* needs ale-py's AtariVectorEnv (ale-py >= 0.10): "
            "pip install 'multi-sample-factory[atari]'"
        ) from None
    game = cfg.env[len("atari_") :]
    if game not in roms.get_all_rom_ids():
        raise ConfigError(f"--env: ale-py has no Atari game {cfg.env!r} (atari_<game>, e.g. atari_pong)")
    size = int(cfg.atari_screen_size)
    return AtariVectorEnv(
        game,
        num_envs,
        num_threads=1,
        frameskip=4,
        stack_num=int(getattr(cfg, "env_framestack", None) or 4),
        img_height=size,
        img_width=size,
        grayscale=True,
        maxpool=True,
        noop_max=families.ATARI_NOOP_MAX,
        episodic_life=not evaluation,
        reward_clipping=not evaluation,
        use_fire_reset=False,
        max_num_frames_per_episode=108_000,
        repeat_action_probability=0.25 if cfg.atari_sticky_actions else 0.0,
        full_action_space=bool(cfg.atari_full_action_space),
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def make_vector_env(
    cfg: Any, worker_index: int, env_indices: list[int], seed: int, device_group: int = 0
) -> tuple[Any, Callable | None, bool]:
    """``(vector env, reset_now, pad_stack)`` of :class:`VectorSplit` for the envs ``env_indices`` of ``cfg.env``:
    with ``--env_backend=envpool`` an EnvPool (:func:`make_envpool`); else a vector env registered under the name
    (:func:`msf.envs.register_vector_env`), ale-py's ``AtariVectorEnv`` for ``atari_*``, or
    ``gymnasium.make_vec(id, n, vectorization_mode="vector_entry_point")`` for a gymnasium id.

    Raises:
        ConfigError: a gymnasium id without a vector entry point, an unknown name, a missing package.
    """
    n, first = len(env_indices), seed + env_indices[0]
    if cfg.env_backend == "envpool":
        pool = EnvPoolVector(make_envpool(cfg, n, first), n)
        return pool, pool.reset_now, False
    key, maker = vector_maker(cfg.env)
    if maker is not None:
        return maker(key, n, env_config_of(cfg, worker_index, env_indices[0], first, device_group)), None, False
    if cfg.env.startswith("atari_"):
        return make_atari_vector(cfg, n), None, True
    try:
        return gym.make_vec(key, num_envs=n, vectorization_mode="vector_entry_point"), None, False
    except gym.error.Error as e:
        raise ConfigError(
            f"--env_backend=vector: {cfg.env!r} is neither a gymnasium id with a vector entry point (such as "
            f"CartPole-v1) nor registered with msf.envs.register_vector_env ({e}); use --env_backend=gymnasium"
        ) from None


def make_split(
    cfg: Any,
    worker_index: int,
    env_indices: list[int],
    seed: int,
    device_group: int = 0,
    on_env: Callable[[str], None] | None = None,
) -> GymSplit | VectorSplit:
    """The envs ``env_indices`` of rollout worker ``worker_index`` with the backend of ``--env_backend`` (the
    arguments are :class:`GymSplit`'s): ``gymnasium``, or one vector env (``vector``, ``envpool``)."""
    if getattr(cfg, "env_backend", "gymnasium") == "gymnasium":
        return GymSplit(cfg, worker_index, env_indices, seed, device_group, on_env)
    venv, reset_now, pad_stack = make_vector_env(cfg, worker_index, env_indices, seed, device_group)
    split = VectorSplit(venv, cfg.env, worker_index, env_indices, seed + env_indices[0], reset_now, pad_stack)
    try:
        if on_env is not None:
            for _ in env_indices:
                on_env("made")
                on_env("started")
    except BaseException:
        split.close()
        raise
    return split


def check_backend(cfg: Any, spaces: Any) -> None:
    """Before spawning, for ``--env_backend=vector`` or ``envpool``: one vector env of one env made here has the
    spaces ``spaces`` (the gymnasium env's, or those declared), and EnvPool's classic-control ids have gymnasium's
    episode limit (the step at which an episode is truncated).

    Raises:
        ConfigError: see :func:`make_vector_env` and :func:`envpool_task`; or the spaces or episode limit differ
            (both named).
    """
    venv = make_vector_env(cfg, 0, [0], 0)[0]
    try:
        try:
            theirs = single_spaces(cfg.env, venv)
        except ValueError as e:
            raise ConfigError(f"--env_backend={cfg.env_backend}: {e}") from None
        if (theirs.obs_shape, theirs.discrete, theirs.num_actions) != (
            tuple(spaces.obs_shape),
            spaces.discrete,
            spaces.num_actions,
        ):
            raise ConfigError(
                f"--env_backend={cfg.env_backend}: its {cfg.env} has observations {theirs.obs_shape} and "
                f"{theirs.num_actions} actions, the gymnasium env {tuple(spaces.obs_shape)} and {spaces.num_actions}"
            )
        if cfg.env_backend == "envpool" and cfg.env in ENVPOOL_CLASSIC:
            ours, theirs_limit = venv.pool.spec.config.max_episode_steps, gym.spec(cfg.env).max_episode_steps
            if ours != theirs_limit:
                raise ConfigError(
                    f"--env_backend=envpool: EnvPool's {cfg.env} truncates episodes at {ours} steps, gymnasium's "
                    f"at {theirs_limit}; use --env_backend=gymnasium"
                )
    finally:
        venv.close()
