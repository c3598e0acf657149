"""Environment registry: gymnasium ids and user-registered environments."""

from msf.envs.registry import EnvSpaces, env_spaces, make_env, register_env

__all__ = ["EnvSpaces", "env_spaces", "make_env", "register_env"]
