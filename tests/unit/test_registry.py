"""Declared spaces (``msf.envs.declare_spaces``): read without making an env, and held to by every env made."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest

from msf.cfg.validation import ConfigError
from msf.envs import registry
from msf.envs.registry import EnvSpaces, declare_spaces, env_spaces, make_env, register_env, spaces_of


class _Pair(gym.Env):
    """Two agents, a Dict observation each (one-hot room, a position), three actions."""

    num_agents = 2

    def __init__(self, rooms: int = 3):
        self.observation_space = gym.spaces.Dict(
            {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "room": gym.spaces.Discrete(rooms)}
        )
        self.action_space = gym.spaces.Discrete(3)


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_DECLARED", dict(registry._DECLARED))


def test_declared_spaces_are_read_without_making_the_env_and_equal_the_made_ones():
    made = []
    register_env("pair", lambda name, env_config: made.append(env_config) or _Pair())
    declare_spaces("pair", _Pair().observation_space, _Pair().action_space, num_agents=2)
    spaces = env_spaces("pair")
    assert made == []  # nothing was made to read them
    assert spaces == EnvSpaces(
        obs_shape=(5,),
        obs_dtype=np.float32,
        discrete=True,
        num_actions=3,
        obs_layout=(("pos", (2,), 2), ("room", (3,), 3)),
        num_agents=2,
    )
    env = make_env("pair")  # the made env holds to them, so it is made as usual
    assert len(made) == 1 and spaces_of(env) == spaces
    # undeclared, the spaces come from one env made here
    register_env("pair_undeclared", lambda name, env_config: made.append(env_config) or _Pair())
    assert env_spaces("pair_undeclared") == spaces and len(made) == 2


def test_an_env_that_does_not_match_its_declaration_is_refused_with_both():
    register_env("pair", lambda name, env_config: _Pair(rooms=4))
    declare_spaces("pair", _Pair().observation_space, _Pair().action_space, num_agents=2)
    with pytest.raises(ValueError, match=r"pair: the env has other spaces than were declared") as e:
        make_env("pair")
    assert "obs_shape=(5,)" in str(e.value) and "obs_shape=(6,)" in str(e.value)  # declared, then made


def test_a_declaration_needs_gymnasium_spaces_and_names_that_exist():
    with pytest.raises(TypeError, match="must be gymnasium spaces"):
        declare_spaces("x", (4,), gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match="not supported"):
        declare_spaces("x", gym.spaces.Box(0, 1, (2, 2)), gym.spaces.Discrete(2))  # 2-D observations
    # a declared name that no gymnasium id and no registration carries is still unknown
    declare_spaces("NoSuchEnv-v0", gym.spaces.Box(0, 1, (4,)), gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match="unknown environment 'NoSuchEnv-v0'"):
        env_spaces("NoSuchEnv-v0")


def test_an_env_maker_that_cannot_travel_to_the_workers_is_named_with_the_reason_there(monkeypatch):
    """A maker registered in the launching process that does not pickle (a lambda) cannot reach a spawned worker;
    the worker's error names that cause instead of "unknown environment". Simulated in this process: the snapshot
    a child receives, restored after the entry is gone (as in a fresh child)."""
    from msf.runtime import registrations

    monkeypatch.setattr(registry, "_REGISTRY", registrations.registry("env"))  # the registry snapshots read
    register_env("msf_test_lambda_env", lambda name, env_config: gym.make("CartPole-v1"))
    try:
        snap = registrations.snapshot()
        assert "msf_test_lambda_env" not in snap.get("env", {})
        del registrations.registry("env")["msf_test_lambda_env"]  # the child never had it
        registrations.restore(snap)
        with pytest.raises(ConfigError) as e:
            make_env("msf_test_lambda_env")
        msg = str(e.value)
        assert "could not be sent" in msg and "lambda" in msg and "top level" in msg, msg
        # an env never registered anywhere keeps the plain message
        with pytest.raises(ConfigError, match="unknown environment 'msf_test_no_such_env'"):
            make_env("msf_test_no_such_env")
    finally:
        registrations.registry("env").pop("msf_test_lambda_env", None)
        registrations._UNSENT.pop(("env", "msf_test_lambda_env"), None)


USER_MODULE = """
import gymnasium as gym
from msf.envs import register_env

def make_my_game(name, env_config):
    return gym.make("CartPole-v1")

def make_with_a_typo(name, env_config):
    return gym.make(CartPol)

register_env("my_game", make_my_game)
register_env("my_typo_game", make_with_a_typo)
gym.register("MyGame-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=500)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's module registering envs both ways docs/environments.md shows (msf's register_env, gymnasium's
    register), importable as ``msf_test_user_envs``."""
    (tmp_path / "msf_test_user_envs.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "msf_test_user_envs"
    sys.modules.pop("msf_test_user_envs", None)
    gym.registry.pop("MyGame-v0", None)


@pytest.mark.parametrize("short, nearest", [("my_gamee", "my_game"), ("MyGamme-v0", "MyGame-v0")])
def test_a_misspelt_name_after_a_module_says_what_is_registered_nearest(user_module, short, nearest):
    """``--env=module:Nam`` where the module registers ``Name``: the module was imported, so the name is simply
    not registered in this process; the message names the module and the nearest registered names."""
    make_env(f"{user_module}:{nearest}").close()  # the name spelt right makes the env
    with pytest.raises(ConfigError) as e:
        make_env(f"{user_module}:{short}")
    (msg,) = e.value.problems
    assert "unknown environment" not in msg, msg
    assert msg.startswith(f"--env: {short!r} is not registered in this process after importing module {user_module!r}")
    assert f"; nearest registered names: {nearest!r}" in msg, msg


def test_a_misspelt_gymnasium_id_names_the_nearest_one():
    with pytest.raises(ConfigError) as e:
        make_env("CartPol-v1")
    msg = str(e.value)
    assert (
        msg.startswith("--env: unknown environment 'CartPol-v1'") and "nearest registered names: 'CartPole-v1'" in msg
    )


def test_a_maker_that_raises_is_one_line_naming_the_env_the_exception_and_where(user_module):
    """As msf-train's probe meets it in its own process: one line (a ConfigError, printed as ``msf-train:
    error:``) naming the env, the exception and the line of the user's code that raised it."""
    with pytest.raises(ConfigError) as e:
        env_spaces(f"{user_module}:my_typo_game")
    (line,) = e.value.problems
    assert line == (
        f"--env={user_module}:my_typo_game: making the env raised NameError: name 'CartPol' is not defined "
        "(msf_test_user_envs.py:9, in make_with_a_typo)"
    )
    assert isinstance(e.value.__cause__, NameError)
