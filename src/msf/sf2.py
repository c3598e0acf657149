"""Sample Factory 2's Python API, on msf: a launch script written as Sample Factory's documentation teaches runs
here with its ``from sample_factory... import X`` lines changed to ``from msf.sf2 import X``.

    from msf.sf2 import parse_sf_args, parse_full_cfg, register_env, run_rl

    def main():
        register_env("my_env", make_my_env)            # make_my_env(full_env_name, cfg, env_config, render_mode)
        parser, _ = parse_sf_args()
        add_extra_params(parser)                       # the env's own flags: cfg.my_flag
        parser.set_defaults(rnn_size=128)              # override_default_params
        cfg = parse_full_cfg(parser)
        return run_rl(cfg)                             # training: the exit code (0 done, 1 failed, 2 bad input)

The names (and where Sample Factory 2.1.1 has them): :func:`register_env` (``envs.env_utils``),
:func:`parse_sf_args` and :func:`parse_full_cfg` (``cfg.arguments``), :func:`run_rl` (``train``), :func:`enjoy`
(``enjoy``), :func:`global_model_factory` (``algo.utils.context``), :class:`Encoder` (``model.encoder``),
:func:`nonlinearity` (``model.model_utils``), :func:`calc_num_elements` (``algo.utils.torch_utils``),
:func:`str2bool` (``utils.utils``), :class:`ExperimentStatus` (``algo.utils.misc``),
:class:`TrainingInfoInterface` and :class:`RewardShapingInterface` (``envs.env_utils``), ``Config`` and
``ObsSpace`` (``utils.typing``).

``cfg`` is an ``argparse.Namespace`` of every flag, the script's own included, as in Sample Factory. Registrations
may be made in ``main()``: msf carries them to every process it spawns (:mod:`msf.runtime.registrations`), as
long as the functions are defined at the top level of a module or of the script.

What differs: ``run_rl`` returns msf's exit code and ``enjoy`` the exit code and the mean return, as Sample
Factory's (:class:`ExperimentStatus` names the codes); only a custom encoder can be registered (:class:`ModelFactory`,
:class:`Encoder`); the interfaces ``TrainingInfoInterface`` and ``RewardShapingInterface`` are never called.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import sys
import warnings
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from msf.cfg.arguments import EVALUATION_FLAGS, build_parser, given_flags, str2bool
from msf.cfg.config import ENV_ARG
from msf.cfg.config import Config as _MsfConfig
from msf.envs.registry import register_env as _register_msf_env
from msf.model.encoders import ACTIVATIONS
from msf.model.encoders import register_encoder as _register_msf_encoder

Config = Any  # Sample Factory's ``utils.typing.Config``: the namespace of flags
ObsSpace = gym.Space

__all__ = [
    "Config",
    "Encoder",
    "ExperimentStatus",
    "ObsSpace",
    "RewardShapingInterface",
    "TrainingInfoInterface",
    "calc_num_elements",
    "enjoy",
    "global_model_factory",
    "nonlinearity",
    "parse_full_cfg",
    "parse_sf_args",
    "register_env",
    "run_rl",
    "str2bool",
]

ENCODER_NAME = "sf2_encoder"
"""The ``--encoder_custom`` name under which :meth:`ModelFactory.register_encoder_factory` registers."""


class ExperimentStatus:
    """What :func:`run_rl` and :func:`enjoy` return: msf's exit codes under Sample Factory's names (its SUCCESS
    is 0 too; msf adds BAD_INPUT for flags refused before anything starts)."""

    SUCCESS = 0
    FAILURE = 1
    BAD_INPUT = 2
    INTERRUPTED = 130


# --- the command line ------------------------------------------------------------------------------------------
class _Parsed(argparse.Namespace):
    """Sample Factory's cfg: every flag as an attribute. It also remembers the argv it was parsed from, so that
    msf knows which flags were given (an env family's defaults yield to them)."""

    def __init__(self, argv: list[str], **values: Any):
        super().__init__(**values)
        object.__setattr__(self, "_msf_argv", list(argv))

    def _msf_values(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_msf_")}


def parse_sf_args(argv: list[str] | None = None, evaluation: bool = False) -> tuple[argparse.ArgumentParser, Any]:
    """msf's parser (``msf-enjoy``'s with ``evaluation``, else ``msf-train``'s, both of which take every Sample
    Factory flag) and the flags of ``argv`` it knows so far (a script adds its own to the parser next).

    Returns:
        ``(parser, partial_cfg)``, as Sample Factory's ``parse_sf_args``.
    """
    if evaluation:
        from msf.enjoy import build_enjoy_parser

        parser = build_enjoy_parser()
    else:
        parser = build_parser(prog="msf-train")
    argv = sys.argv[1:] if argv is None else argv
    partial, _ = parser.parse_known_args(argv)
    return parser, partial


def parse_full_cfg(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> Any:
    """Parse ``argv`` (default: the command line) with ``parser`` and the flags a script added to it.

    Raises:
        SystemExit: 2 for an unknown flag or a bad value, with one line (``msf-train: error: ...``).
    """
    argv = sys.argv[1:] if argv is None else argv
    return _Parsed(argv, **vars(parser.parse_args(argv)))


def _split(cfg: Any, enjoy_flags: set[str]) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """``cfg``'s values as (msf flags, the script's own flags, the names given): given are the flags of its argv
    and every flag whose value is not msf's default (a script's ``set_defaults`` or ``cfg.x = ...``)."""
    values = cfg._msf_values() if isinstance(cfg, _Parsed) else dict(vars(cfg))
    argv = cfg._msf_argv if isinstance(cfg, _Parsed) else []
    fields = {f.name: f for f in dataclasses.fields(_MsfConfig) if f.metadata.get("cli") is not False}
    defaults = _MsfConfig()
    ours = {k: v for k, v in values.items() if k in fields or k in enjoy_flags}
    extra = {k: v for k, v in values.items() if k not in ours and k not in EVALUATION_FLAGS}
    given = given_flags(argv, values) | {k for k in ours if k in fields and getattr(defaults, k) != values[k]}
    if ENCODER_NAME in _factory.encoders and "encoder_custom" not in given:
        ours["encoder_custom"] = ENCODER_NAME
        given.add("encoder_custom")
    given |= {ENV_ARG + k for k in given_flags(argv, extra)}  # the script's own flags on its command line
    return ours, extra, given


def run_rl(cfg: Any) -> int:
    """Train with ``cfg`` (from :func:`parse_full_cfg`), as ``msf-train`` would with the same command line;
    return the exit code (:class:`ExperimentStatus`)."""
    from msf.train import main

    ours, extra, given = _split(cfg, set())
    ours = {k: v for k, v in ours.items() if k not in EVALUATION_FLAGS}
    return main(parsed=(_MsfConfig(**ours, env_args=extra), {g for g in given if g in ours or g.startswith(ENV_ARG)}))


def enjoy(cfg: Any) -> tuple[int, float | None]:
    """Evaluate the experiment of ``cfg`` (parsed with ``evaluation=True``), as ``msf-enjoy`` would.

    Returns:
        ``(status, mean return)``, as Sample Factory's ``enjoy``: the exit code (:class:`ExperimentStatus`) and
        the mean return of the episodes played (the mean over agents of a multi-agent env), the ``return_mean``
        ``msf-enjoy`` writes to ``TRAIN_DIR/EXPERIMENT/eval.json``; None when nothing was played.
    """
    from msf.enjoy import build_enjoy_parser, main

    parser = build_enjoy_parser()
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    ours, extra, given = _split(cfg, dests)
    ns = {**vars(parser.parse_args([])), **{k: v for k, v in ours.items() if k in dests}, "env_args": extra}
    status = main(parsed=(ns, given))
    result = os.path.join(ns["train_dir"], ns["experiment"], "eval.json")
    if status != ExperimentStatus.SUCCESS or not os.path.exists(result):
        return status, None
    with open(result) as f:
        return status, json.load(f)["return_mean"]


# --- environments ------------------------------------------------------------------------------------------------
class _EnvConfig(dict):
    """Sample Factory's ``env_config``: ``worker_index``, ``vector_index`` (the env's place in its worker) and
    ``env_id``, by key or attribute; msf's own keys too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclasses.dataclass(frozen=True)
class _SFMaker:
    """An env maker of Sample Factory's signature, ``make(full_env_name, cfg, env_config, render_mode)``, as msf
    calls makers (``make(name, env_config)``). Pickles by reference to ``make``."""

    make: Callable[..., gym.Env]

    def __call__(self, name: str, env_config: dict[str, Any]) -> gym.Env:
        cfg = env_config.get("cfg") or _MsfConfig()
        per_worker = int(getattr(cfg, "num_envs_per_worker", 1))
        worker, env_index = int(env_config.get("worker_index", 0)), int(env_config.get("env_index", 0))
        sf_config = _EnvConfig(env_config)
        sf_config.update(worker_index=worker, vector_index=env_index - worker * per_worker, env_id=env_index)
        return self.make(name, cfg, sf_config, env_config.get("render_mode"))


def register_env(env_name: str, make_env_func: Callable[..., gym.Env]) -> None:
    """Register ``make_env_func(full_env_name, cfg, env_config, render_mode=None) -> gymnasium.Env`` as
    ``--env=env_name`` (Sample Factory's signature; ``cfg`` has every flag, the script's own too).

    msf's worker processes receive the maker pickled (by reference); one that does not pickle (a lambda, a nested
    function) reaches them only if a module they import registers it at import: a warning says so at once, and a
    worker without it names that cause."""
    maker = _SFMaker(make_env_func)
    try:
        pickle.dumps(maker)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
        warnings.warn(
            f"register_env({env_name!r}, ...): {getattr(make_env_func, '__qualname__', make_env_func)} does not "
            f"pickle ({type(e).__name__}: {e}), so msf's worker processes receive it only if a module they import "
            "registers it at import; define it at the top level of a module or of the script",
            stacklevel=2,
        )
    _register_msf_env(env_name, maker)


class TrainingInfoInterface:
    """Sample Factory's interface of an env that receives training statistics: accepted, never called by msf."""

    def __init__(self) -> None:
        self.training_info: dict[str, Any] = {}

    def set_training_info(self, training_info: dict[str, Any]) -> None:
        self.training_info = training_info


class RewardShapingInterface:
    """Sample Factory's interface of an env whose reward shaping PBT tunes: accepted, never called by msf."""

    def get_default_reward_shaping(self) -> dict[str, Any] | None:
        return None

    def set_reward_shaping(self, reward_shaping: dict[str, Any], agent_idx: int | slice) -> None:
        pass


# --- models ------------------------------------------------------------------------------------------------------
class Encoder(nn.Module):
    """Sample Factory's base of a custom encoder: ``__init__(cfg)``, ``forward(obs_dict) -> [N, out]`` with the
    observations in ``obs_dict["obs"]`` (``[N, *obs_shape]`` float32: vectors normalised with ``--normalize_input``,
    images as the env gives them), and ``get_out_size() -> out``."""

    def __init__(self, cfg: Any):
        super().__init__()
        self.cfg = cfg

    def get_out_size(self) -> int:
        raise NotImplementedError("a custom Encoder must define get_out_size()")


class _EncoderAdapter(nn.Module):
    """msf's encoder interface (``[N, *obs_shape]`` -> ``[N, out_size]``, an ``out_size`` attribute) around a
    Sample Factory :class:`Encoder`."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder
        self.out_size = int(encoder.get_out_size())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder({"obs": obs.float()})


@dataclasses.dataclass(frozen=True)
class _EncoderFactory:
    """``make(cfg, obs_space) -> Encoder`` (Sample Factory's factory) as msf's ``factory(cfg, obs_shape)``; the
    observation space is Sample Factory's dict of one key, ``obs``."""

    make: Callable[..., Encoder]

    def __call__(self, cfg: Any, obs_shape: tuple[int, ...]) -> nn.Module:
        box = gym.spaces.Box(-float("inf"), float("inf"), tuple(obs_shape), dtype=np.float32)
        return _EncoderAdapter(self.make(cfg, gym.spaces.Dict({"obs": box})))


class ModelFactory:
    """Sample Factory's model factory: :meth:`register_encoder_factory` only."""

    def __init__(self) -> None:
        self.encoders: dict[str, Callable] = {}

    def register_encoder_factory(self, make_encoder: Callable[..., Encoder]) -> None:
        """Use ``make_encoder(cfg, obs_space) -> Encoder`` for the policy's encoder (``--encoder_custom`` is
        then ``sf2_encoder`` unless given)."""
        self.encoders[ENCODER_NAME] = make_encoder
        _register_msf_encoder(ENCODER_NAME, _EncoderFactory(make_encoder))

    def _refuse(self, what: str) -> None:
        raise NotImplementedError(
            f"msf.sf2: a custom {what} is not supported (msf builds its own core, decoder and heads; "
            "--use_rnn, --rnn_type, --decoder_mlp_layers set them); register_encoder_factory is"
        )

    def register_decoder_factory(self, make_decoder: Callable) -> None:
        self._refuse("decoder")

    def register_model_core_factory(self, make_core: Callable) -> None:
        self._refuse("model core")

    def register_actor_critic_factory(self, make_actor_critic: Callable) -> None:
        self._refuse("actor-critic")


_factory = ModelFactory()


def global_model_factory() -> ModelFactory:
    """The model factory of this process (Sample Factory's name)."""
    return _factory


def nonlinearity(cfg: Any, inplace: bool = False) -> nn.Module:
    """The activation of ``cfg.nonlinearity`` (elu, relu, tanh) as a module.

    Raises:
        ValueError: another name.
    """
    kind = cfg.nonlinearity
    if kind not in ACTIVATIONS:
        raise ValueError(f"--nonlinearity: unknown {kind!r} (elu, relu, tanh)")
    return nn.Tanh() if kind == "tanh" else ACTIVATIONS[kind](inplace=inplace)


def calc_num_elements(module: nn.Module, module_input_shape: tuple[int, ...]) -> int:
    """Elements of ``module``'s output for one input of ``module_input_shape`` (no batch dimension)."""
    with torch.no_grad():
        return int(module(torch.zeros(1, *module_input_shape)).numel())
