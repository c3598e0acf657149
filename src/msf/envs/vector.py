"""The envs of one split of a rollout worker, stepped together: the env backend.

A rollout worker steps its ``num_envs_per_worker`` envs in ``worker_num_splits`` groups (splits);
each split is one :class:`EnvSplit`. Two backends (``--env_backend``):

* ``gymnasium`` (default): one gymnasium env per slot, stepped in a Python loop (:class:`GymSplit`);
* ``envpool``: one EnvPool instance per split (:class:`EnvPoolSplit`), which steps all of the split's
  envs in one C++ call; for ``atari_*``, ``mujoco_*`` and gymnasium's classic-control ids
  (``msf.cfg.validation.ENVPOOL_CLASSIC``, e.g. ``CartPole-v1``), whose step costs a few microseconds, less than one
  Python call of a wrapped gymnasium env.

Both return the observation *after* an episode end as the first observation of the next episode
(gymnasium's autoreset within the step), so the rollout worker does not know which backend it drives.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from msf.cfg.validation import ENVPOOL_CLASSIC, ENVPOOL_SERVES, ConfigError, envpool_serves
from msf.envs.registry import env_config_of, make_env, num_agents_of

DECORRELATION_ROLLOUTS = 16
"""With ``--decorrelate_envs_on_one_worker``, no env takes this many rollouts of random steps or more."""


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
        self.name = cfg.env
        self.ended = np.zeros(len(self.envs) * self.A, dtype=bool)  # rows whose episode ended at the last step

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
        for i, env in enumerate(self.envs):
            if A == 1:
                obs, r, te, tr, _ = env.step(self._action(actions[i]))
                rew[i], term[i], trunc[i] = r, te, tr
                if te or tr:
                    obs, _ = env.reset()
                obs_out[i] = obs
                continue
            lo = i * A
            obs, r, te, tr, _ = env.step([self._action(a) for a in actions[lo : lo + A]])
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

    task = envpool_task(cfg.env)
    kw: dict[str, Any] = {}
    if cfg.env.startswith("atari_"):
        kw = dict(
            stack_num=int(getattr(cfg, "env_framestack", None) or 4),
            frame_skip=4,
            noop_max=30,
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


class EnvPoolSplit:
    """``n`` envs in one EnvPool, stepped in one call.

    EnvPool resets an env on the step *after* its episode ended (that step ignores its action and returns
    the first observation with reward 0). Here the ended envs are stepped once more at once, alone (EnvPool's
    ``env_id`` argument), so the observation returned with the end is already the next episode's first, as
    with :class:`GymSplit`.
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
        self.pool = make_envpool(cfg, len(env_indices), seed + env_indices[0])
        if on_env is not None:
            for _ in env_indices:
                on_env("made")
                on_env("started")
        self.action_space = self.pool.action_space
        self.n = len(env_indices)
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)

    def reset(self) -> np.ndarray:
        return self.pool.reset()[0]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        actions = np.asarray(actions)
        obs, rew, term, trunc, info = self.pool.step(actions, np.arange(self.n, dtype=np.int32))
        order = info["env_id"]
        if not np.array_equal(order, np.arange(self.n)):  # a synchronous pool keeps the order; be sure
            inv = np.argsort(order)
            obs, rew, term, trunc = obs[inv], rew[inv], term[inv], trunc[inv]
        ended = np.nonzero(term | trunc)[0].astype(np.int32)
        if len(ended):
            obs = obs.copy()
            first = self.pool.step(actions[ended], ended)
            obs[first[4]["env_id"]] = first[0]
        return obs, rew.astype(np.float32), term.astype(bool), trunc.astype(bool)

    def close(self) -> None:
        self.pool.close()


def make_split(
    cfg: Any,
    worker_index: int,
    env_indices: list[int],
    seed: int,
    device_group: int = 0,
    on_env: Callable[[str], None] | None = None,
) -> GymSplit | EnvPoolSplit:
    """The envs ``env_indices`` of rollout worker ``worker_index`` with the backend of ``--env_backend`` (the
    arguments are :class:`GymSplit`'s)."""
    if getattr(cfg, "env_backend", "gymnasium") == "envpool":
        return EnvPoolSplit(cfg, worker_index, env_indices, seed, device_group, on_env)
    return GymSplit(cfg, worker_index, env_indices, seed, device_group, on_env)


def check_envpool(cfg: Any, spaces: Any) -> None:
    """Before spawning: EnvPool serves ``cfg.env`` with the spaces of the gymnasium backend, and for a
    classic-control id with gymnasium's episode limit (the step at which an episode is truncated).

    Raises:
        ConfigError: see :func:`envpool_task`; or the pool's spaces or episode limit differ (both named).
    """
    pool = make_envpool(cfg, 1, 0)
    try:
        obs, act = pool.observation_space, pool.action_space
        n = int(act.n) if isinstance(act, gym.spaces.Discrete) else int(act.shape[0])
        if tuple(obs.shape) != tuple(spaces.obs_shape) or n != spaces.num_actions:
            raise ConfigError(
                f"--env_backend=envpool: EnvPool's {cfg.env} has observations {tuple(obs.shape)} and "
                f"{n} actions, the gymnasium env {tuple(spaces.obs_shape)} and {spaces.num_actions}"
            )
        if cfg.env in ENVPOOL_CLASSIC:
            ours, theirs = pool.spec.config.max_episode_steps, gym.spec(cfg.env).max_episode_steps
            if ours != theirs:
                raise ConfigError(
                    f"--env_backend=envpool: EnvPool's {cfg.env} truncates episodes at {ours} steps, gymnasium's "
                    f"at {theirs}; use --env_backend=gymnasium"
                )
    finally:
        pool.close()
