"""Making environments by name.

``--env`` accepts a gymnasium id (``CartPole-v1``), a gymnasium id behind the module
that registers it (``my_pkg.envs:MyEnv-v0``: the module is imported first, in every
process, so this also works in spawned rollout workers), or a name given to
:func:`register_env` in a module that rollout workers import too.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, cast

import gymnasium as gym
import numpy as np

from msf.cfg.validation import ConfigError
from msf.runtime.registrations import registry, why_missing

MakeEnvFn = Callable[[str, dict], gym.Env]
MakeVectorEnvFn = Callable[[str, int, dict], Any]  # (name, num_envs, env_config) -> gymnasium.vector.VectorEnv
# carried to every process msf spawns (msf.runtime.registrations), so a registration made in a script's main() works
_REGISTRY: dict[str, MakeEnvFn] = registry("env")
_VECTOR: dict[str, MakeVectorEnvFn] = registry("vector_env")
_DECLARED: dict[str, "EnvSpaces"] = registry("declared")  # by short name (the ``Id`` of ``module:Id``)


def register_env(name: str, make_env_fn: MakeEnvFn) -> None:
    """Register ``make_env_fn(name, env_config) -> gymnasium.Env`` under ``name``.

    ``env_config`` holds ``worker_index`` (the rollout worker's index over the whole job, every device
    group and node: ``[0, total rollout workers)``), ``env_index`` (the env's, over the whole job:
    ``worker_index * num_envs_per_worker + i``, so every env of a run has its own, in ``[0, total envs)``),
    ``device_group`` (the rank of the env's device group) and ``seed``;
    for ``msf-enjoy`` also ``evaluation`` (True: leave out wrappers meant for training only) and
    ``render_mode`` (None, ``"rgb_array"`` or ``"human"``).
    The registration must happen at import of a module that the rollout workers also import
    (they do not inherit the main process's state: :mod:`msf.runtime.registrations`); pass
    ``--env=module:name`` to have it imported. An env that is slow to make should have its spaces declared
    there too (:func:`declare_spaces`).
    """
    _REGISTRY[name] = make_env_fn


def register_vector_env(name: str, make_vector_env_fn: MakeVectorEnvFn) -> None:
    """Register ``make_vector_env_fn(name, num_envs, env_config) -> gymnasium.vector.VectorEnv`` (numpy arrays in
    and out, ``num_envs`` sub-envs) under ``name``, for ``--env_backend=vector``: each rollout worker makes one per
    split. ``env_config`` is that of the split's first env (:func:`register_env`; its ``env_index`` and ``seed``
    are the first env's, the others' follow, ``+ i``). The env's ``metadata["autoreset_mode"]`` (gymnasium's
    ``AutoresetMode``; next-step if absent) says how it resets: every mode is served
    (:class:`msf.envs.vector.VectorSplit`). Its ``single_observation_space`` and ``single_action_space`` are one
    env's; declare them with :func:`declare_spaces` to spare ``msf-train`` making one, and every env made is checked
    against the declaration. The same rules of import as :func:`register_env` apply. A name with only a vector
    registration trains with ``--env_backend=vector`` only (``msf-enjoy`` steps one env: register that too)."""
    _VECTOR[name] = make_vector_env_fn


def vector_maker(name: str) -> tuple[str, MakeVectorEnvFn | None]:
    """``(key, maker)`` of the vector env registered as ``name`` (``module:name`` imports ``module`` first); the
    maker is None where none is."""
    key = name.rpartition(":")[2]
    if ":" in name:
        _resolve(name)  # imports the module, or names why it cannot
    return key, _VECTOR.get(key)


ONE_ENV_CONFIG = {"worker_index": 0, "env_index": 0, "device_group": 0, "seed": 0}  # an env made outside the workers


def one_vector_env(name: str, env_config: dict[str, Any] | None = None) -> Any:
    """The vector env registered as ``name`` (:func:`register_vector_env`) with one env, where msf needs one env."""
    key, maker = vector_maker(name)
    assert maker is not None, f"{name} is registered as a vector env"
    return maker(key, 1, dict(env_config or ONE_ENV_CONFIG))


def single_spaces(name: str, venv: Any) -> EnvSpaces:
    """The :class:`EnvSpaces` of one env of the vector env ``venv`` made for ``name`` (its ``single_*`` spaces),
    checked against those declared for ``name`` (:func:`declare_spaces`), if any.

    Raises:
        ValueError: they differ from the declared ones (both named). ConfigError: unsupported spaces, an
            observation space other than a ``Box`` among them.
    """
    if not isinstance(venv.single_observation_space, gym.spaces.Box):
        raise ConfigError(
            f"--env_backend=vector: {name}'s vector env has the observation space {venv.single_observation_space}, "
            "and a vector env's must be a Box: flatten it in the env, or register one env with msf.envs.register_env "
            "and use --env_backend=gymnasium"
        )
    spaces = spaces_of(_Declared(venv.single_observation_space, venv.single_action_space, 1))
    declared = _DECLARED.get(name.rpartition(":")[2])
    if declared is not None and spaces != declared:
        raise ValueError(
            f"{name}: the vector env has other spaces than were declared for it (msf.envs.declare_spaces): "
            f"declared {declared}, made {spaces}"
        )
    return spaces


def declare_spaces(name: str, observation_space: gym.Space, action_space: gym.Space, num_agents: int = 1) -> None:
    """Declare the spaces of the env ``name`` (a name given to :func:`register_env`, or a gymnasium id) as
    ``make_env`` will return them (one agent's, for a multi-agent env of ``num_agents``), so that
    ``msf-train`` reads them here instead of making an env in its own process before the workers start: an env
    whose constructor takes S seconds then costs its S once per env, not once more. Call it where the env is registered.
    Every env made afterwards is checked against the declaration (a mismatch is an error, naming both).

    Raises:
        TypeError: a space that is not a gymnasium space. ConfigError: spaces msf does not support.
    """
    if not isinstance(observation_space, gym.Space) or not isinstance(action_space, gym.Space):
        raise TypeError(
            f"declare_spaces({name!r}): observation_space and action_space must be gymnasium spaces, got "
            f"{type(observation_space).__name__} and {type(action_space).__name__}"
        )
    _DECLARED[name] = declared_spaces(observation_space, action_space, num_agents)


def declared_spaces(observation_space: gym.Space, action_space: gym.Space, num_agents: int = 1) -> EnvSpaces:
    """The :class:`EnvSpaces` of an env with these spaces (one agent's), read without making the env.

    Raises:
        ConfigError: spaces msf does not support."""
    return spaces_of(flatten_dict_obs(_Declared(observation_space, action_space, num_agents)))


class _Declared(gym.Env):
    """An env that is only its declared spaces (never reset or stepped): what :func:`spaces_of` reads."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, num_agents: int):
        self.observation_space, self.action_space = observation_space, action_space
        if num_agents != 1:
            self.num_agents = num_agents


def _check_declared(name: str, env: gym.Env) -> gym.Env:
    """``env`` as made for ``name``, after checking it has the spaces declared for it, if any.

    Raises:
        ValueError: it has others (both named).
    """
    declared = _DECLARED.get(name.rpartition(":")[2])
    if declared is not None:
        actual = spaces_of(env)
        if actual != declared:
            env.close()
            raise ValueError(
                f"{name}: the env has other spaces than were declared for it (msf.envs.declare_spaces): "
                f"declared {declared}, made {actual}"
            )
    return env


def _resolve(name: str) -> tuple[str, MakeEnvFn | None]:
    if ":" in name:
        module, _, short = name.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--env: cannot import module {module!r} named in {name!r} ({e})") from None
        if short in _REGISTRY:
            return short, _REGISTRY[short]
        return name, None
    if name in _REGISTRY:
        return name, _REGISTRY[name]
    from msf.envs.families import family_maker

    return name, family_maker(name)


def env_config_of(
    cfg: Any, worker_index: int = 0, env_index: int = 0, seed: int = 0, device_group: int = 0, **extra: Any
) -> dict[str, Any]:
    """The ``env_config`` every env maker receives: its indices (see :func:`register_env`) and seed, and the env
    flags of ``cfg``. ``extra`` adds keys: msf-enjoy's ``frameskip`` (``--eval_env_frameskip``) replaces the
    Atari and Doom makers' 4 frames per step."""
    return {
        "worker_index": worker_index,
        "env_index": env_index,
        "device_group": device_group,
        "seed": seed,
        "atari_sticky_actions": cfg.atari_sticky_actions,
        "atari_full_action_space": cfg.atari_full_action_space,
        "atari_screen_size": cfg.atari_screen_size,
        "unity_env_path": getattr(cfg, "unity_env_path", None),
        "res_w": cfg.res_w,
        "res_h": cfg.res_h,
        "wide_aspect_ratio": cfg.wide_aspect_ratio,
        "env_framestack": getattr(cfg, "env_framestack", None),
        "cfg": cfg,  # the whole config, for makers written against Sample Factory's API (msf.sf2)
        **extra,
    }


class MultiAgentFlatten(gym.Wrapper):
    """:func:`flatten_dict_obs` for a multi-agent env: each agent's ``Dict`` observation flattened alike."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.dict_space = cast(gym.spaces.Dict, env.observation_space)
        self.observation_space = gym.spaces.flatten_space(self.dict_space)

    def _flat(self, obs):
        return [gym.spaces.flatten(self.dict_space, o).astype(np.float32) for o in obs]

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._flat(obs), info

    def step(self, actions):
        obs, *rest = self.env.step(actions)
        return (self._flat(obs), *rest)


def flatten_dict_obs(env: gym.Env) -> gym.Env:
    """A ``Dict`` observation space becomes one float32 vector (gymnasium's ``FlattenObservation``, keys in the
    space's order, ``Discrete`` one-hot; per agent for a multi-agent env); the model splits it again by
    :attr:`EnvSpaces.obs_layout`."""
    if isinstance(env.observation_space, gym.spaces.Dict):
        return MultiAgentFlatten(env) if num_agents_of(env) > 1 else gym.wrappers.FlattenObservation(env)
    return env


def make_env(name: str, env_config: dict[str, Any] | None = None, render_mode: str | None = None) -> gym.Env:
    """Create one environment.

    Raises:
        ConfigError: the name is neither registered here nor a gymnasium id, or only as a vector env; or the env's
            maker (or constructor) raised: one line naming the env, the exception and where it was raised (the
            exception is its ``__cause__``).
        ValueError: the env's spaces are not those declared for it (:func:`declare_spaces`).
    """
    env_config = dict(env_config or {})
    key, fn = _resolve(name)
    check_single_env(name, (key, fn))
    if fn is not None:
        if render_mode is not None:
            env_config["render_mode"] = render_mode
        try:
            env = fn(key, env_config)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: any exception is named in one line
            maker_failed(name, e)
        return _check_declared(name, flatten_dict_obs(env))
    try:
        # the env checker costs ~10 us per step on tiny envs, and runs only on the first steps anyway
        env = flatten_dict_obs(gym.make(key, disable_env_checker=True, render_mode=render_mode))
    except gym.error.Error as e:
        unsent = why_missing("env", key)
        if unsent is not None:
            raise ConfigError(f"--env: environment {name!r} is not registered in this process: {unsent}") from None
        if _is_gym_id(key):  # registered: its constructor raised (a missing dependency, say)
            maker_failed(name, e)
        module, _, short = name.rpartition(":")
        nearest = _nearest(short)
        if module:  # imported without error (_resolve): nothing registers this name
            raise ConfigError(
                f"--env: {short!r} is not registered in this process after importing module {module!r}{nearest} "
                "(names given to msf.envs.register_env or gymnasium.register)"
            ) from None
        raise ConfigError(
            f"--env: unknown environment {name!r} ({e}){nearest}. Valid: a gymnasium id such as CartPole-v1, "
            "'module:Id' to import a module that registers it, or a name passed to msf.envs.register_env"
        ) from None
    except Exception as e:  # noqa: BLE001 - the env's constructor: any exception is named in one line
        maker_failed(name, e)
    return _check_declared(name, env)


def check_single_env(name: str, resolved: tuple[str, MakeEnvFn | None] | None = None) -> None:
    """Check that one env of ``name`` can be made (the gymnasium backend, ``msf-enjoy``); ``resolved``: the name's
    ``_resolve`` where the caller has it.

    Raises:
        ConfigError: ``name`` is registered only with :func:`register_vector_env` (not with :func:`register_env`,
            gymnasium or as a family).
    """
    if vector_only(name, resolved):
        raise ConfigError(
            f"--env_backend: {name!r} is registered only as a vector env (msf.envs.register_vector_env) and this "
            "needs one env: train it with --env_backend=vector, or register one env with msf.envs.register_env too"
        )


def vector_only(name: str, resolved: tuple[str, MakeEnvFn | None] | None = None) -> bool:
    """True when ``name`` is registered only with :func:`register_vector_env` (not with :func:`register_env`,
    gymnasium or as a family); ``resolved``: the name's ``_resolve`` where the caller has it."""
    key, fn = resolved or _resolve(name)
    return fn is None and name.rpartition(":")[2] in _VECTOR and not _is_gym_id(key)


def _nearest(short: str) -> str:
    """``; nearest registered names: 'A', 'B'``: the names registered in this process (msf's and gymnasium's)
    closest to ``short`` (difflib's ratio >= 0.6, at most 3), or "" when none is."""
    near = difflib.get_close_matches(short, sorted({*_REGISTRY, *_VECTOR, *gym.registry}), n=3, cutoff=0.6)
    return f"; nearest registered names: {', '.join(map(repr, near))}" if near else ""


def maker_failed(name: str, e: Exception) -> NoReturn:
    """Raise one line for an env maker that raised ``e``: the env, the exception's type and first line, and the
    innermost frame (file, line, function) it came from; ``e`` is its ``__cause__``.

    Raises:
        ConfigError: always.
    """
    raise ConfigError(f"--env={name}: making the env raised {raised(e)}") from e


def raised(e: BaseException) -> str:
    """``Type: first line of the message (file.py:line, in function)``: the exception and the innermost frame it
    came from, for a one-line message about the user's code."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}{where}"


@dataclass(frozen=True)
class EnvSpaces:
    """What the model and the trajectory buffer need to know about an environment.

    Attributes:
        obs_shape: shape of one observation: a vector (MLP encoder) or a 3-D image (conv encoder).
        obs_dtype: numpy dtype observations are stored as: uint8 for uint8 observations (images),
            else float32.
        discrete: True for a ``Discrete`` action space.
        num_actions: number of discrete actions (the sum over the dimensions of a multi-discrete
            action: the size of the logits), or the size of a ``Box`` action.
        action_nvec: the choices of each dimension of a ``MultiDiscrete`` action, or of a ``Tuple``
            of ``Discrete`` (actions ``[k]`` int64); None for one ``Discrete`` or a ``Box``.
        obs_layout: for a ``Dict`` observation space, flattened by gymnasium's ``FlattenObservation``
            into one float32 vector: per key, in order, ``(key, shape, size)``; a ``Discrete`` key is
            one-hot (shape ``(n,)``); an ``action_mask`` key masks the logits instead of being encoded.
            None otherwise.
        num_agents: agents per env: 1, or ``num_agents`` of a multi-agent env (see :func:`num_agents_of`);
            the spaces above are then those of one agent.
    """

    obs_shape: tuple[int, ...]
    obs_dtype: Any
    discrete: bool
    num_actions: int
    action_nvec: tuple[int, ...] | None = None
    obs_layout: tuple[tuple[str, tuple[int, ...], int], ...] | None = None
    num_agents: int = 1

    @property
    def action_shape(self) -> tuple[int, ...]:
        if self.action_nvec is not None:
            return (len(self.action_nvec),)
        return () if self.discrete else (self.num_actions,)


def num_agents_of(env: gym.Env) -> int:
    """Agents in ``env``: its ``num_agents`` attribute (through wrappers), else 1.

    The multi-agent env interface (Sample Factory's): ``num_agents`` (fixed) agents act at every step;
    ``observation_space`` and ``action_space`` are those of one agent (the same for all);
    ``reset(seed=...)`` returns ``(obs, info)`` with ``obs`` a sequence of ``num_agents`` observations;
    ``step(actions)`` takes a sequence of ``num_agents`` actions and returns ``(obs, rewards, terminated,
    truncated, info)``, each a sequence of ``num_agents``. The episode ends for all agents at once: msf
    resets the env when every agent is terminated or truncated. :mod:`msf.envs.pettingzoo` wraps a
    PettingZoo parallel env in this interface.
    """
    try:
        n = env.get_wrapper_attr("num_agents")
    except AttributeError:
        return 1
    return int(n)


def spaces_of(env: gym.Env) -> EnvSpaces:
    """Read the spaces of ``env`` (of one agent, for a multi-agent env).

    Raises:
        ConfigError: an observation or action space that this version does not support.
    """
    obs, act = env.observation_space, env.action_space
    agents = num_agents_of(env)
    if agents < 1:
        raise ConfigError(f"--env: num_agents must be at least 1, got {agents}")
    return dataclasses.replace(_spaces_of(env, obs, act), num_agents=agents)


def _spaces_of(env: gym.Env, obs: gym.Space, act: gym.Space) -> EnvSpaces:
    layout = None
    if isinstance(env, MultiAgentFlatten):
        layout = tuple(_layout_entry(k, sub) for k, sub in env.dict_space.spaces.items())
    elif isinstance(env, gym.wrappers.FlattenObservation) and isinstance(env.env.observation_space, gym.spaces.Dict):
        layout = tuple(_layout_entry(k, sub) for k, sub in env.env.observation_space.spaces.items())
    elif not isinstance(obs, gym.spaces.Box):
        raise ConfigError(f"--env: observation space {obs} is not supported (supported: Box, Dict of Box and Discrete)")
    shape = tuple(obs.shape or ())
    if len(shape) not in (1, 3):
        raise ConfigError(
            f"--env: observations of shape {obs.shape} are not supported (supported: vectors, and "
            "3-D images such as [C, H, W] or [H, W, C])"
        )
    dtype = np.uint8 if obs.dtype == np.uint8 and layout is None else np.float32
    if isinstance(act, gym.spaces.Discrete):
        return EnvSpaces(shape, dtype, True, int(act.n), obs_layout=layout)
    nvec = None
    if isinstance(act, gym.spaces.MultiDiscrete) and len(act.nvec.shape) == 1:
        nvec = tuple(int(n) for n in act.nvec)
    elif isinstance(act, gym.spaces.Tuple) and all(isinstance(a, gym.spaces.Discrete) for a in act.spaces):
        nvec = tuple(int(a.n) for a in act.spaces if isinstance(a, gym.spaces.Discrete))
    if nvec is not None:
        return EnvSpaces(shape, dtype, True, sum(nvec), action_nvec=nvec, obs_layout=layout)
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
        return EnvSpaces(shape, dtype, False, int(act.shape[0]), obs_layout=layout)
    raise ConfigError(
        f"--env: action space {act} is not supported (supported: Discrete, MultiDiscrete, a Tuple of Discrete, 1-D Box)"
    )


def _layout_entry(key: str, space: gym.Space) -> tuple[str, tuple[int, ...], int]:
    if isinstance(space, gym.spaces.Box) and len(space.shape) in (1, 3):
        return key, tuple(space.shape), int(np.prod(space.shape))
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiBinary)) or (
        isinstance(space, gym.spaces.Box) and len(space.shape) in (0, 2)
    ):
        n = gym.spaces.flatdim(space)
        return key, (n,), n
    raise ConfigError(
        f"--env: observation key {key!r} has space {space}, which is not supported in a Dict "
        "observation (supported: Box, Discrete, MultiBinary)"
    )


ENV_INFO_FILE = "env_info.json"


def env_info_key(cfg: Any) -> dict[str, Any]:
    """What the spaces of ``cfg``'s env may depend on: its name, the env flags makers receive (``env_config``,
    without the per-env indices and seed) and a launch script's own flags (``env_args``); JSON values."""
    config = env_config_of(cfg)
    for k in ("worker_index", "env_index", "device_group", "seed", "cfg"):
        config.pop(k, None)
    config["env"], config["env_args"] = cfg.env, dict(getattr(cfg, "env_args", {}) or {})
    return json.loads(json.dumps(config, default=str))


def save_env_info(exp_dir: str, name: str, spaces: EnvSpaces, key: dict[str, Any] | None = None) -> None:
    """Keep ``spaces`` of the env ``name`` in ``exp_dir/env_info.json`` (``--use_env_info_cache``), atomically,
    with the ``key`` they were read under (:func:`env_info_key`)."""
    d = dataclasses.asdict(spaces)
    d["obs_dtype"] = np.dtype(spaces.obs_dtype).str
    tmp = os.path.join(exp_dir, f".{ENV_INFO_FILE}.tmp")
    with open(tmp, "w") as f:
        json.dump({"env": name, "key": key, "spaces": d}, f)
    os.replace(tmp, os.path.join(exp_dir, ENV_INFO_FILE))


def load_env_info(exp_dir: str, name: str, key: dict[str, Any] | None = None) -> EnvSpaces | None:
    """The spaces :func:`save_env_info` kept for the env ``name`` in ``exp_dir``; None when there are none, or
    they were read for another env or another ``key`` (a changed env flag: the env is made again), or unreadable."""
    try:
        with open(os.path.join(exp_dir, ENV_INFO_FILE)) as f:
            saved = json.load(f)
        if saved.get("env") != name or saved.get("key") != key:
            return None
        d = saved["spaces"]

        def tuples(x):
            return tuple(tuples(v) for v in x) if isinstance(x, list) else x

        return EnvSpaces(
            obs_shape=tuple(d["obs_shape"]),
            obs_dtype=np.dtype(d["obs_dtype"]).type,
            discrete=bool(d["discrete"]),
            num_actions=int(d["num_actions"]),
            action_nvec=tuples(d["action_nvec"]),
            obs_layout=tuples(d["obs_layout"]),
            num_agents=int(d["num_agents"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def env_spaces(name: str, env_config: dict[str, Any] | None = None, note_after_s: float = 5.0) -> EnvSpaces:
    """The spaces of the env ``name``: those declared for it (:func:`declare_spaces`), without making it; else
    one env made in this process, read and closed (not reset: ViZDoom's engine starts at the first reset, so
    this costs a Doom env nothing). An env whose constructor takes longer than ``note_after_s`` is said to on
    stderr, with how to skip it, and how long it took (the workers start only after it).

    Raises:
        ConfigError: unknown env, a family whose extra is missing, or unsupported spaces.
    """
    key, fn = _resolve(name)
    short = name.rpartition(":")[2]
    declared, vector = _DECLARED.get(short), _VECTOR.get(short) if fn is None else None
    if declared is not None and (fn is not None or vector is not None or _is_gym_id(key)):
        return declared  # an unknown name is left to make_env, which names it
    if vector is not None:  # registered as a vector env only: one of one env
        venv = one_vector_env(name, env_config)
        try:
            return single_spaces(name, venv)
        finally:
            venv.close()
    t0 = time.monotonic()
    note = threading.Timer(
        note_after_s,
        lambda: print(
            f"msf: making one {name} env to read its observation and action spaces, before the workers "
            f"start (its constructor has taken {note_after_s:.0f} s so far; msf.envs.declare_spaces, where the "
            "env is registered, saves this; so does --use_env_info_cache=True from the second start on)",
            file=sys.stderr,
        ),
    )
    note.daemon = True
    note.start()
    try:
        env = make_env(name, env_config or dict(ONE_ENV_CONFIG))
    finally:
        note.cancel()
    took = time.monotonic() - t0
    if took >= note_after_s:
        print(f"msf: the {name} env for its spaces took {took:.0f} s to make", file=sys.stderr)
    try:
        return spaces_of(env)
    finally:
        env.close()


def _is_gym_id(key: str) -> bool:
    """``key`` (``Id`` or ``module:Id``, the module imported) is registered with gymnasium."""
    try:
        gym.spec(key.rpartition(":")[2])
    except gym.error.Error:
        return False
    return True
