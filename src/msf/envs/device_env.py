"""Device-side vector envs: many env instances stepped in one call, their observations, rewards and actions torch
tensors on the device group's device (Isaac Lab, Brax/MJX, ManiSkill, Genesis; :mod:`msf.envs.torch_cartpole`).

Such an env is registered with :func:`register_device_env` and trained with ``--env_gpu_actions=True
--env_gpu_observations=True`` (Sample Factory's names): each device group then makes one of them with
``--num_envs_per_worker`` instances on its own device, and :class:`msf.sampling.device_sampler.DeviceSampler`
steps it in the group's process. :func:`resolve_device_env` holds the flags' rules.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import gymnasium as gym

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError, Problems
from msf.envs.registry import EnvSpaces, declared_spaces, maker_failed
from msf.runtime.registrations import registry

if TYPE_CHECKING:  # torch is imported by what steps the env, not by msf.envs
    import torch


class DeviceVectorEnv(Protocol):
    """``num_envs`` instances of one env, stepped together on ``device``, with same-step autoreset.

    Attributes:
        num_envs: the instances ``N``. device: where every tensor it takes and returns lives.
        observation_space, action_space: ONE instance's gymnasium spaces (as registered).
    """

    num_envs: int
    device: torch.device
    observation_space: gym.Space
    action_space: gym.Space

    def reset(self) -> torch.Tensor:
        """The first observations ``[N, *obs_shape]`` (seeded by the factory's ``seed``)."""
        ...

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step instance ``i`` with ``actions[i]`` (``[N]`` int64, or ``[N, A]`` float32 clipped to the action
        space's bounds). Returns (observations ``[N, *obs_shape]``, where an episode ended the next episode's
        first; rewards ``[N]`` float32; terminated ``[N]`` bool; truncated ``[N]`` bool), all on ``device``."""
        ...

    def close(self) -> None: ...


DeviceEnvFactory = Callable[[int, "torch.device", int, dict], DeviceVectorEnv]


@dataclass(frozen=True)
class DeviceEnvEntry:
    """A registered device env: ``factory(num_envs, device, seed, env_config)`` and one instance's spaces."""

    factory: DeviceEnvFactory
    observation_space: gym.Space
    action_space: gym.Space


# carried to every process msf spawns (msf.runtime.registrations), like msf.envs.register_env's
_REGISTRY: dict[str, DeviceEnvEntry] = registry("device_env")
_BUILTIN = {"torch_cartpole": "msf.envs.torch_cartpole"}  # name -> the module that registers it at import


def register_device_env(
    name: str, factory: DeviceEnvFactory, observation_space: gym.Space, action_space: gym.Space
) -> None:
    """Register a device-side vector env under ``name`` (``--env=name``, or ``--env=module:name`` to have the
    registering module imported in every process).

    Args:
        factory: ``factory(num_envs, device, seed, env_config) -> DeviceVectorEnv``: ``num_envs`` instances on
            ``device`` (a ``torch.device``), seeded by ``seed`` (``--seed`` and the group's first env index);
            ``env_config`` as :func:`msf.envs.register_env` describes it (``env_index``: the job-wide index of
            instance 0). A top-level function or class, so that it reaches spawned ranks.
        observation_space, action_space: one instance's gymnasium spaces. msf sizes its model and buffer from
            them, and every step is checked against them.

    Raises:
        TypeError: an observation space that is not a ``Box``, an action space that is not a gymnasium space.
    """
    if not isinstance(observation_space, gym.spaces.Box) or not isinstance(action_space, gym.Space):
        raise TypeError(
            f"register_device_env({name!r}): the observation space must be a gymnasium Box (one tensor per step) "
            f"and the action space a gymnasium space, got {type(observation_space).__name__} and "
            f"{type(action_space).__name__}"
        )
    _REGISTRY[name] = DeviceEnvEntry(factory, observation_space, action_space)


def device_env_entry(name: str) -> DeviceEnvEntry | None:
    """The registration of ``--env=name`` (``module:name``: the module imported first; a built-in name such as
    ``torch_cartpole``: its module imported), or None when ``name`` is not a device env."""
    module, _, short = name.rpartition(":")
    if not module and short in _BUILTIN and short not in _REGISTRY:
        module = _BUILTIN[short]
    if module and short not in _REGISTRY:
        try:
            importlib.import_module(module)
        except ImportError:
            return None  # the CPU env registry names the import error
    return _REGISTRY.get(short)


def device_env_spaces(entry: DeviceEnvEntry) -> EnvSpaces:
    """The spaces a device env was registered with, as the model and the buffer read them.

    Raises:
        ConfigError: spaces msf does not support."""
    return declared_spaces(entry.observation_space, entry.action_space)


def resolve_device_env(cfg: Config, given: set[str], nproc_per_node: int) -> Config:
    """The rules of ``--env_gpu_actions``, ``--env_gpu_observations`` and ``--actor_worker_gpus``, and the
    layout of a device env's run: each device group steps one vector env of ``--num_envs_per_worker`` instances
    in its own process (``--num_workers`` becomes the device groups of the node, ``--worker_num_splits`` 1).

    Returns:
        ``cfg``, with ``num_workers`` and ``worker_num_splits`` set for a device env.

    Raises:
        ConfigError: one line per contradiction: a device env without both flags, ``--env_gpu_actions`` with a CPU
            env, ``--actor_worker_gpus`` given, or a device env with flags that need rollout worker processes,
            several policies, EnvPool or sampler nodes.
    """
    p = Problems()
    p.check(
        not cfg.actor_worker_gpus,
        "actor_worker_gpus",
        "msf's rollout workers step CPU envs and use no GPU; a device-side env (--env_gpu_actions=True) steps on "
        "its device group's own device: leave it out",
    )
    if device_env_entry(cfg.env) is None:
        p.check(
            not cfg.env_gpu_actions,
            "env_gpu_actions",
            f"True needs an env registered with msf.envs.register_device_env; {cfg.env} is stepped on the CPU by "
            "rollout workers (NumPy actions): leave it out",
        )
        p.raise_if_any()
        return cfg
    why = f"{cfg.env} is a device-side env (msf.envs.register_device_env)"
    for name in ("env_gpu_actions", "env_gpu_observations"):
        p.check(getattr(cfg, name), name, f"{why}: its tensors stay on the device; pass --{name}=True")
    for name in ("worker_num_splits", "policy_workers_per_policy", "num_policies"):
        p.check(
            getattr(cfg, name) == 1 or (name == "worker_num_splits" and name not in given),
            name,
            f"{why}, stepped in its device group's process with its learner's model: must be 1",
        )
    p.check(
        "num_workers" not in given or cfg.num_workers == nproc_per_node,
        "num_workers",
        f"{why}: each device group steps one vector env of --num_envs_per_worker instances and runs no rollout "
        "worker process: leave it out",
    )
    p.check(cfg.env_backend == "gymnasium", "env_backend", f"{why}: it steps itself; leave --env_backend out")
    p.check(
        not cfg.sampler_port,
        "sampler_port",
        f"{why}: sampler nodes feed rollout worker trajectories, and it has none; leave --sampler_port out",
    )
    p.raise_if_any()
    return dataclasses.replace(cfg, num_workers=nproc_per_node, worker_num_splits=1)


def make_device_env(cfg: Any, num_envs: int, device: torch.device, seed: int, env_config: dict) -> DeviceVectorEnv:
    """The device env of ``cfg.env`` with ``num_envs`` instances on ``device``.

    Raises:
        ConfigError: ``cfg.env`` is not a registered device env, or its factory raised (one line naming the env,
            the exception and where it was raised: :func:`msf.envs.registry.maker_failed`).
    """
    entry = device_env_entry(cfg.env)
    if entry is None:
        raise ConfigError(f"--env: {cfg.env} is not registered with msf.envs.register_device_env in this process")
    try:
        return entry.factory(num_envs, device, seed, env_config)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: any exception is named in one line
        maker_failed(cfg.env, e)
