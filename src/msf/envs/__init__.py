"""Environment registry: gymnasium ids and user-registered environments."""

from msf.envs.device_env import register_device_env
from msf.envs.registry import EnvSpaces, declare_spaces, env_spaces, make_env, register_env, register_vector_env

__all__ = [
    "EnvSpaces",
    "declare_spaces",
    "env_spaces",
    "make_env",
    "register_device_env",
    "register_env",
    "register_vector_env",
]
