"""Whether an env's reset honours its seed: what ``--deterministic`` can vouch for depends on it."""

from __future__ import annotations

from typing import Any

import numpy as np

from msf.envs.registry import make_env, one_vector_env, vector_only


def reset_ignores_seed(name: str, env_config: dict[str, Any] | None = None, seed: int = 12345) -> bool:
    """True when two resets of one env made by ``make_env(name, env_config)`` with the same ``seed`` give
    different first observations (the env, or a wrapper, ignores the seed); the env is closed after.

    A multi-agent env's first observation is compared whole (all agents). Observations that are dicts or tuples
    are compared entry by entry. A name registered only as a vector env (:func:`msf.envs.register_vector_env`) is
    made as a vector env of one env, the form in which msf steps it."""
    env = one_vector_env(name, env_config) if vector_only(name) else make_env(name, env_config)
    try:
        first = env.reset(seed=seed)[0]
        env.step(env.action_space.sample()) if hasattr(env, "action_space") else None
        second = env.reset(seed=seed)[0]
    finally:
        env.close()
    return not _equal(first, second)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))
