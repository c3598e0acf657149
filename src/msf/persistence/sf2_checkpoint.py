"""Sample Factory 2.1.1 experiment folders, read by msf: their ``config.json`` and checkpoints converted on load.

A folder that Sample Factory 2.1.1 wrote (``train_dir/EXP/config.json``, ``checkpoint_p{p}/checkpoint_*.pth``,
``best_*.pth``, ``milestones/``) is recognised by its ``config.json`` (Sample Factory's records of its command line,
``command_line`` and ``cli_args``, which no msf config has) and by its checkpoints (the learner's dict:
``train_step``, ``env_steps``, ``best_performance``, ``model``, ``optimizer``, ``curr_lr``; no ``msf_version``).
``msf-enjoy`` plays it and ``msf-train`` resumes it; nothing of Sample Factory's is ever changed, renamed or
deleted: in such a folder msf writes its config to ``msf_config.json`` (read before ``config.json`` from then on)
and its checkpoints beside Sample Factory's, whose files its keep-N rotation and best-checkpoint replacement leave
alone (the writer's ``spared`` files: :func:`sf2_files`).

The standard model maps tensor for tensor: Sample Factory's prefixes to msf's as :data:`_TOP` lists them (an
encoder's names within it as :data:`_ENCODER`: MLP, convnet_simple, convnet_atari, resnet_impala; separate
weights' actor and critic parts to msf's), ``action_parameterization.learned_stddev`` to ``log_std``, the running
statistics of the observation normaliser to ``obs_normalizer.*`` (vectors) or to each encoder's ``normalizer.*``
(images), and those of the returns normaliser (shape ``[1]``) to ``returns_normalizer.*`` (shape ``[]``).

Sample Factory normalises ``(obs - s) / k`` (``obs_subtract_mean``, ``obs_scale``) by statistics ``m``, ``v`` of
the scaled values; msf keeps statistics of the raw values, so ``mean = s + k m``, ``var = k^2 v`` and the float32
standard deviation ``k sqrt(v + 1e-5)``: the same normalisation. An image normaliser of a ``[C, H, W]`` Sample
Factory observation is moved to the channel axis of msf's observation when that differs (``[H, W, C]``).

Refused, with one line naming what could not be mapped (:class:`Sf2Refused`; the callers make it their
``ConfigError``, exit code 2, before anything is written): a config that is not Sample Factory 2.1.1's (its keys), a
Sample Factory tensor without a counterpart in msf's model (a custom encoder, other observation keys than ``obs``),
an msf tensor without one, a shape that differs, observation scaling or a squashed Gaussian that msf's model does
not do, and resuming a run of several policies (their env-step counters are per policy in Sample Factory).

This module sits with the checkpoints, below the model and the config: the callers pass what it needs of them
(the config class, the model, its optimiser).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
import re
import sys
from typing import Collection, NoReturn, TypeGuard

import torch

from msf.persistence.checkpoint import CheckpointError, checkpoint_dir, list_checkpoints

log = logging.getLogger("msf")

SF2_VERSION = "2.1.1"
MSF_CONFIG = "msf_config.json"
"""msf's own config in a folder whose ``config.json`` is Sample Factory's."""

# Every key Sample Factory 2.1.1 writes into config.json (its parser's flags, and its records of how it was started);
# env families add their own flags to these
SF2_CONFIG_KEYS = frozenset(
    """help algo env experiment train_dir restart_behavior device seed num_policies async_rl serial_mode
    batched_sampling num_batches_to_accumulate worker_num_splits policy_workers_per_policy max_policy_lag num_workers
    num_envs_per_worker batch_size num_batches_per_epoch num_epochs rollout recurrence shuffle_minibatches gamma
    reward_scale reward_clip value_bootstrap normalize_returns exploration_loss_coeff value_loss_coeff kl_loss_coeff
    exploration_loss gae_lambda ppo_clip_ratio ppo_clip_value with_vtrace vtrace_rho vtrace_c optimizer adam_eps
    adam_beta1 adam_beta2 max_grad_norm learning_rate lr_schedule lr_schedule_kl_threshold lr_adaptive_min
    lr_adaptive_max obs_subtract_mean obs_scale normalize_input normalize_input_keys decorrelate_experience_max_seconds
    decorrelate_envs_on_one_worker actor_worker_gpus set_workers_cpu_affinity force_envs_single_thread
    default_niceness log_to_file experiment_summaries_interval flush_summaries_interval stats_avg
    summaries_use_frameskip heartbeat_interval heartbeat_reporting_interval train_for_env_steps train_for_seconds
    save_every_sec keep_checkpoints load_checkpoint_kind save_milestones_sec save_best_every_sec save_best_metric
    save_best_after benchmark encoder_mlp_layers encoder_conv_architecture encoder_conv_mlp_layers use_rnn rnn_size
    rnn_type rnn_num_layers decoder_mlp_layers nonlinearity policy_initialization policy_init_gain
    actor_critic_share_weights adaptive_stddev continuous_tanh_scale initial_stddev use_env_info_cache
    env_gpu_actions env_gpu_observations env_frameskip env_framestack pixel_format use_record_episode_statistics
    with_wandb wandb_user wandb_project wandb_group wandb_job_type wandb_tags with_pbt pbt_mix_policies_in_one_env
    pbt_period_env_steps pbt_start_mutation pbt_replace_fraction pbt_mutation_rate pbt_replace_reward_gap
    pbt_replace_reward_gap_absolute pbt_optimize_gamma pbt_target_objective pbt_perturb_min pbt_perturb_max
    command_line cli_args git_hash git_repo_name""".split()
)
SF2_CHECKPOINT_KEYS = frozenset({"train_step", "env_steps", "best_performance", "model", "optimizer", "curr_lr"})

_RECORDS = frozenset({"help", "command_line", "cli_args", "git_hash", "git_repo_name"})
# where the folder was when Sample Factory wrote it: msf takes these from its own command line
_WHERE = frozenset({"train_dir", "experiment"})
# flags that shape the model: without an msf flag of the same name, only this value (what msf's model does) maps
_NEUTRAL = {"decoder_mlp_layers": [], "continuous_tanh_scale": 0.0, "obs_subtract_mean": 0.0}
_SHAPING = frozenset(
    {
        "encoder_mlp_layers",
        "encoder_conv_architecture",
        "encoder_conv_mlp_layers",
        "use_rnn",
        "rnn_size",
        "rnn_type",
        "rnn_num_layers",
        "nonlinearity",
        "actor_critic_share_weights",
        "normalize_input",
        "normalize_returns",
        "adaptive_stddev",
        *_NEUTRAL,
    }
)
_OBS_NORM = "obs_normalizer.running_mean_std.running_mean_std.obs."
_NORMALIZERS = ("obs_normalizer.", "returns_normalizer.")
_SF_EPS = 1e-5  # Sample Factory's variance epsilon of its running mean/std

# Sample Factory's prefix, msf's
_TOP = (
    ("encoder.encoders.obs.", "actor_encoder."),
    ("actor_encoder.encoders.obs.", "actor_encoder."),
    ("critic_encoder.encoders.obs.", "critic_encoder."),
    ("core.core.", "core."),
    ("actor_core.core.", "core."),
    ("critic_core.core.", "critic_core."),
    ("decoder.mlp.", "decoder."),
    ("actor_decoder.mlp.", "decoder."),
    ("critic_decoder.mlp.", "critic_decoder."),
    ("critic_linear.", "value_head."),
    ("action_parameterization.distribution_linear.", "action_head."),
)
# within an encoder: Sample Factory's name, msf's
_ENCODER = tuple(
    (re.compile(sf), msf)
    for sf, msf in (
        (r"mlp_head\.(\d+)\.(weight|bias)", r"\1.\2"),
        (r"enc\.conv_head\.(\d+)\.(weight|bias)", r"conv.\1.\2"),
        (r"enc\.mlp_layers\.(\d+)\.(weight|bias)", r"mlp.\1.\2"),
        (r"conv_head\.(\d+)\.res_block_core\.(\d+)\.(weight|bias)", r"conv.\1.body.\2.\3"),
        (r"conv_head\.(\d+)\.(weight|bias)", r"conv.\1.\2"),
        (r"mlp_layers\.(\d+)\.(weight|bias)", r"mlp.\1.\2"),
    )
)


class Sf2Refused(CheckpointError, ValueError):
    """A Sample Factory folder that msf cannot use as it is. The message is one line, ``--experiment: ...``, and
    names what could not be mapped."""


def _refuse(what: str) -> NoReturn:
    raise Sf2Refused(f"--experiment: {what}")


def _say(line: str) -> None:
    """``line`` to the log where logging is set up for it (a device group's process), else to stderr."""
    if logging.getLogger().handlers and log.isEnabledFor(logging.INFO):
        log.info("%s", line)
    else:
        print(f"msf: {line}", file=sys.stderr)


def is_sf2_config(d: object) -> TypeGuard[dict]:
    """Whether a loaded ``config.json`` is Sample Factory's: it has Sample Factory's records of its command line."""
    return isinstance(d, dict) and ("command_line" in d or "cli_args" in d)


def is_sf2_checkpoint(state: object) -> bool:
    """Whether a loaded checkpoint is Sample Factory's (its learner's keys, none of msf's)."""
    return (
        isinstance(state, dict)
        and SF2_CHECKPOINT_KEYS <= state.keys()
        and "msf_version" not in state
        and "policy_version" not in state
    )


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_sf2_folder(exp_dir: str) -> bool:
    """Whether ``exp_dir/config.json`` is Sample Factory's."""
    return is_sf2_config(_read_json(os.path.join(exp_dir, "config.json")))


def config_file(exp_dir: str) -> str:
    """The config msf reads for an experiment: ``msf_config.json`` where msf wrote one (a Sample Factory folder it
    resumed), else ``config.json``."""
    own = os.path.join(exp_dir, MSF_CONFIG)
    return own if os.path.isfile(own) else os.path.join(exp_dir, "config.json")


def config_file_to_write(exp_dir: str) -> str:
    """Where msf writes its config: ``msf_config.json`` in a Sample Factory folder (its ``config.json`` is left as
    it is), else ``config.json``."""
    own = os.path.join(exp_dir, MSF_CONFIG)
    return own if os.path.isfile(own) or is_sf2_folder(exp_dir) else os.path.join(exp_dir, "config.json")


def _check_version(d: dict, path: str) -> None:
    """Raises:
    Sf2Refused: ``d`` lacks keys that Sample Factory 2.1.1 writes, or is not an APPO run."""
    missing = sorted(SF2_CONFIG_KEYS - d.keys())
    if missing:
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        _refuse(
            f"{path} is a Sample Factory config, but not one of Sample Factory {SF2_VERSION}, the version msf reads: "
            f"it lacks {', '.join(missing[:4])}{more}"
        )
    if d.get("algo") != "APPO":
        _refuse(f"{path}: algo={d.get('algo')!r}; msf reads Sample Factory's APPO runs")


def msf_config_dict(d: dict, path: str, config_cls: type, command_flags: Collection[str] = ()) -> dict:
    """The msf config of a loaded ``config.json``: ``d`` itself when it is msf's; a Sample Factory 2.1.1 one
    converted (its values under msf's names, which are Sample Factory's), with a line that names the keys that have
    no msf counterpart and were left out.

    Args:
        d: the loaded file. path: its path (for the messages). config_cls: msf's config dataclass
            (:class:`msf.cfg.config.Config`): its fields are the flags, with their ``choices`` in ``metadata``.
        command_flags: flags msf takes from each command's line, not from a saved config (msf-enjoy's
            evaluation flags): left out without being named as having no counterpart.

    Returns:
        a dict for ``config_cls.from_dict``: ``train_dir`` and ``experiment`` are left out (msf takes them from its
        command line), ``normalize_input`` is False when ``normalize_input_keys`` leaves out ``obs``.

    Raises:
        Sf2Refused: not Sample Factory 2.1.1's; a flag that shapes the model with a value msf's model does not have
            (an encoder architecture msf has not, for a model whose checkpoint has a convolutional encoder or cannot
            be read).
    """
    if not is_sf2_config(d):
        return d
    _check_version(d, path)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    out: dict = {}
    dropped = []
    for key, value in d.items():
        if key in _RECORDS or key in _WHERE or key in command_flags:
            continue
        if key not in fields:
            if key in _NEUTRAL and value != _NEUTRAL[key]:
                _refuse(f"{path}: {key}={value!r} shapes the model, and msf's has no such option")
            dropped.append(key)
            continue
        choices = fields[key].metadata.get("choices")
        if choices and value not in choices:
            if key == "encoder_conv_architecture" and not _has_conv_encoder(os.path.dirname(path)):
                continue  # a vector model: msf's default, which it does not use
            if key in _SHAPING:
                _refuse(f"{path}: {key}={value!r} shapes the model, and msf has only {', '.join(map(str, choices))}")
            dropped.append(f"{key}={value!r}")
            continue
        out[key] = value
    keys = d.get("normalize_input_keys")
    out["normalize_input"] = bool(d["normalize_input"]) and (keys is None or "obs" in keys)
    if "normalize_input_keys" in out:
        out["normalize_input_keys"] = None
    if dropped:
        _say(
            f"read the Sample Factory {SF2_VERSION} config {path}; left out, having no msf counterpart: "
            + ", ".join(sorted(dropped))
        )
    return out


def _has_conv_encoder(exp_dir: str) -> bool:
    """Whether the newest readable Sample Factory checkpoint of policy 0 has a convolutional encoder (True when none
    can be read: the architecture cannot then be ruled out)."""
    for path in reversed(list_checkpoints(exp_dir, 0)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - any unreadable file: try the one before
            continue
        return any("conv_head." in k for k in state.get("model", {}))
    return True


def _config_beside(path: str) -> tuple[dict, str]:
    """The Sample Factory ``config.json`` of the experiment a checkpoint file belongs to (its folder's parents).

    Raises:
        Sf2Refused: there is none.
    """
    d = os.path.dirname(os.path.abspath(path))
    for _ in range(3):  # checkpoint_p0/ or checkpoint_p0/milestones/
        d = os.path.dirname(d)
        cfg = _read_json(os.path.join(d, "config.json"))
        if is_sf2_config(cfg):
            return cfg, os.path.join(d, "config.json")
    _refuse(f"{path} is a Sample Factory checkpoint without its Sample Factory config.json beside it")


def _msf_name(key: str) -> str | None:
    """msf's name of a Sample Factory parameter (None: it has no counterpart)."""
    if key == "action_parameterization.learned_stddev":
        return "log_std"
    for sf, msf in _TOP:
        if key.startswith(sf):
            rest = key[len(sf) :]
            if not msf.endswith("encoder."):
                return msf + rest
            for pattern, repl in _ENCODER:
                if pattern.fullmatch(rest):
                    return msf + pattern.sub(repl, rest)
            return None
    return None


def _hint(key: str) -> str:
    if "core." in key:
        return " (use_rnn, rnn_type, rnn_num_layers)"
    if "decoder." in key:
        return " (decoder_mlp_layers)"
    if key.startswith(_NORMALIZERS):
        return " (an observation key other than 'obs', or normalize_input)"
    if "encoder." in key:
        return " (an encoder msf does not have: a custom one, another observation key than 'obs', or its conv net)"
    return ""


def _fit(t: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """``t`` as ``shape``: the same, a scalar from ``[1]``, or an image statistic ``[C, H, W]`` with its channel axis
    moved to where msf's observation has it (None: it does not fit)."""
    if t.shape == shape:
        return t
    if t.numel() == 1 and shape.numel() == 1 and len(shape) == 0:
        return t.reshape(shape)
    if t.dim() == 3 and len(shape) == 3:
        for axis in (1, 2):
            if t.movedim(0, axis).shape == shape:
                return t.movedim(0, axis).contiguous()
    return None


def _check_scaling(
    sf_model: dict, sf_cfg: dict, model: torch.nn.Module, target: dict, source: str
) -> tuple[float, float]:
    """Sample Factory's observation scaling ``(obs_scale, obs_subtract_mean)``, which must be the model's.

    Raises:
        Sf2Refused: the model scales its observations otherwise, or does not squash a Gaussian's means as Sample
            Factory's ``continuous_tanh_scale`` did.
    """
    image = any(k.startswith("actor_encoder.conv.") for k in target)
    k, s = float(sf_cfg["obs_scale"]), float(sf_cfg["obs_subtract_mean"])
    want = (float(getattr(model, "obs_scale", 255.0 if image else 1.0)), float(getattr(model, "obs_subtract", 0.0)))
    if (k, s) != want:
        _refuse(
            f"{source}: Sample Factory scaled its observations as (obs - {s:g}) / {k:g} (obs_scale, "
            f"obs_subtract_mean), msf's model as (obs - {want[1]:g}) / {want[0]:g}"
        )
    tanh = float(sf_cfg.get("continuous_tanh_scale") or 0.0)
    if (
        "action_parameterization.learned_stddev" in sf_model
        and tanh > 0
        and float(getattr(model, "tanh_scale", 0.0)) != tanh
    ):
        _refuse(f"{source}: continuous_tanh_scale={tanh:g} squashes the Gaussian's means, and msf's model does not")
    return k, s


def _normalizer(sf_model: dict, sf: str, p: str, k: float, s: float) -> dict[str, torch.Tensor]:
    """msf's normaliser ``p`` (``mean``, ``var``, ``count`` and the float32 ``mean_f32``, ``std_f32``) from Sample
    Factory's running statistics under ``sf`` of values scaled as ``(x - s) / k``: statistics of the raw values
    (the module's docstring)."""
    m, v = sf_model[sf + "running_mean"].double(), sf_model[sf + "running_var"].double()
    return {
        p + "mean": s + k * m,
        p + "var": k * k * v,
        p + "count": sf_model[sf + "count"].double(),
        p + "mean_f32": (s + k * m).float(),
        p + "std_f32": (k * torch.sqrt(v + _SF_EPS)).float(),
    }


def convert_model_state(sf_model: dict, sf_cfg: dict, model: torch.nn.Module, source: str) -> dict:
    """msf's state dict for ``model`` from a Sample Factory model state dict (see the module's table).

    Args:
        sf_model: the checkpoint's ``model`` (name -> tensor). sf_cfg: its experiment's ``config.json``.
        model: the msf actor-critic built from the converted config for the env's spaces (only its ``state_dict()``
            and its observation scaling, ``obs_scale`` / ``obs_subtract`` / ``tanh_scale`` where it has them, are read).
        source: the checkpoint's path, for the messages.

    Returns:
        ``{name: tensor}`` with exactly the keys, shapes and dtypes of ``model.state_dict()``.

    Raises:
        Sf2Refused: a tensor of either side without a counterpart, a shape that differs, or observation scaling or a
            squashed Gaussian that the model does not do (the first problem, and how many there are).
    """
    target = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}  # msf name -> Sample Factory's
    unmapped = []
    for key, value in sf_model.items():
        if key.startswith(_NORMALIZERS):
            continue
        name = _msf_name(key)
        if name is None:
            unmapped.append(key)
            continue
        out[name], origin[name] = value, key
    k, s = _check_scaling(sf_model, sf_cfg, model, target, source)
    for key in sf_model:
        if key.startswith("obs_normalizer.") and not (
            key.startswith(_OBS_NORM) and key[len(_OBS_NORM) :] in ("running_mean", "running_var", "count")
        ):
            unmapped.append(key)
    obs = [
        p
        for p in ("obs_normalizer.", "actor_encoder.normalizer.", "critic_encoder.normalizer.")
        if p + "mean" in target
    ]
    if _OBS_NORM + "running_mean" in sf_model and not obs:
        unmapped.append(_OBS_NORM + "running_mean")
    for sf, dests, scale, shift in ((_OBS_NORM, obs, k, s), ("returns_normalizer.", ["returns_normalizer."], 1.0, 0.0)):
        if sf + "running_mean" in sf_model:
            for p in dests:
                out.update(_normalizer(sf_model, sf, p, scale, shift))
                origin.update(
                    {p + key: sf + ("running_" + key if key != "count" else key) for key in ("mean", "var", "count")}
                )
    problems = [
        f"its {key} has no counterpart in msf's model{_hint(key)}"
        for key in unmapped + [origin.get(n, n) for n in out if n not in target]
    ]
    problems += [f"it has nothing for msf's {n}{_missing_hint(n)}" for n in target if n not in out]
    fitted = {}
    for n, t in target.items():
        if n in out and not problems:
            f = _fit(out[n], t.shape)
            if f is None:
                problems.append(f"its {origin.get(n, n)} is {list(out[n].shape)}, msf's {n} is {list(t.shape)}")
            else:
                fitted[n] = f.detach().to(t.dtype).clone()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        _refuse(f"cannot map the Sample Factory checkpoint {source}: {problems[0]}{more}")
    return fitted


def _missing_hint(name: str) -> str:
    if name == "log_std":
        return " (adaptive_stddev=True: Sample Factory's head gives the standard deviations)"
    if "normalizer." in name:
        return " (normalize_input / normalize_returns)"
    return ""


def _optimizer_state(
    sf_opt: dict, sf_model: dict, origin: dict[str, str], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict, str]:
    """The state dict of msf's ``optimizer`` carrying Sample Factory's Adam moments over, parameter by parameter
    (Sample Factory's optimiser indexes its parameters in the order of its model's ``parameters()``, msf's alike);
    ``optimizer``'s own fresh state where that cannot be done. Returns it and a note for the log."""
    fresh = optimizer.state_dict()
    sf_params = [key for key in sf_model if not key.startswith(_NORMALIZERS)]
    groups = sf_opt.get("param_groups", [])
    names = [n for n, _ in model.named_parameters()]
    if not isinstance(optimizer, torch.optim.Adam) or not isinstance(sf_opt.get("state"), dict):
        return fresh, "its optimiser state is not carried over (msf's optimiser here is not Adam)"
    if (
        len(groups) != 1
        or list(groups[0].get("params", [])) != list(range(len(sf_params)))
        or len(fresh["param_groups"]) != 1
        or fresh["param_groups"][0]["params"] != list(range(len(names)))
    ):
        return fresh, "its optimiser state is not carried over (its parameter groups are not one of all parameters)"
    index = {key: i for i, key in enumerate(sf_params)}
    state = {}
    for j, n in enumerate(names):
        moments = sf_opt["state"].get(index[origin[n]])
        if moments:
            state[j] = {key: v.clone() if torch.is_tensor(v) else v for key, v in moments.items()}
    return {
        "state": state,
        "param_groups": fresh["param_groups"],
    }, f"Adam's moments of {len(state)} tensors carried over"


def _policy_of(path: str) -> int:
    found = re.search(r"checkpoint_p(\d+)", path)
    return int(found[1]) if found else 0


def as_msf_checkpoint(
    state: dict | None,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    resume: bool = False,
    announce: bool = True,
) -> dict | None:
    """A loaded checkpoint as msf's: ``state`` itself when it is msf's (or None); a Sample Factory 2.1.1 one
    converted for ``model``, with one line (``announce``) that says from which file and Sample Factory version.

    Args:
        state: a checkpoint as :func:`msf.persistence.checkpoint.load_checkpoint_file` gives it (with ``path``).
        model: the msf actor-critic it is for (see :func:`convert_model_state`).
        optimizer: the learner's optimiser (a resumed run): Sample Factory's Adam moments are carried over into its
            state dict where they map, else its own fresh state is used (the line says which).
        resume: for ``msf-train``: refuse a run of several policies.

    Returns:
        msf's checkpoint: ``model``; ``train_step`` and ``policy_version`` (Sample Factory's ``train_step``);
        ``env_steps`` in msf's unit, agent steps (Sample Factory counts frames with ``summaries_use_frameskip``);
        ``lr`` (``curr_lr``); ``best_metric`` (``best_performance``, None while it is Sample Factory's -1e9); with
        ``optimizer`` its ``optimizer``; the counters msf keeps and Sample Factory does not (episodes, returns) empty.

    Raises:
        Sf2Refused: the conversion is refused (see :func:`convert_model_state`), there is no Sample Factory 2.1.1
            config beside the file, or (``resume``) the run had several policies.
    """
    if state is None or not is_sf2_checkpoint(state):
        return state
    path = state["path"]
    sf_cfg, cfg_path = _config_beside(path)
    _check_version(sf_cfg, cfg_path)
    if resume and int(sf_cfg.get("num_policies", 1)) > 1:
        _refuse(
            f"{cfg_path}: a Sample Factory run of {sf_cfg['num_policies']} policies counts env steps per policy, "
            "msf for the whole run: msf-enjoy plays each of them (--policy_index), msf-train does not resume them"
        )
    model_state = convert_model_state(state["model"], sf_cfg, model, path)
    frameskip = int(sf_cfg["env_frameskip"]) if sf_cfg["summaries_use_frameskip"] else 1
    train_step = int(state["train_step"])
    best = float(state.get("best_performance", -1e9))
    out = {
        "model": model_state,
        "train_step": train_step,
        "policy_version": train_step,
        "lr": float(state.get("curr_lr") or sf_cfg["learning_rate"]),
        "hyperparameters": {},
        "env_steps": int(state["env_steps"]) // max(1, frameskip),
        "episodes": 0,
        "policy": _policy_of(path),
        "config": {"learning_rate": sf_cfg["learning_rate"]},
        "world_size": 1,
        "converted_from": f"Sample Factory {SF2_VERSION}",
        "episode_returns": [],
        "episode_lengths": [],
        "dropped_trajectories": 0,
        "best_metric": best if math.isfinite(best) and best > -1e8 else None,
        "pbt_round": 0,
        "pbt_replacements": [],
        "path": path,
    }
    note = ""
    if optimizer is not None:
        origin = {n: k for k, n in ((k, _msf_name(k)) for k in state["model"]) if n is not None}
        out["optimizer"], note = _optimizer_state(state["optimizer"], state["model"], origin, model, optimizer)
        note = f"; {note}"
    if announce:
        _say(
            f"converted the Sample Factory {SF2_VERSION} checkpoint {path} (with {cfg_path}) to msf's model: "
            f"{len(model_state)} tensors{note}; Sample Factory's files are left as they are"
        )
    return out


def sf2_files(exp_dir: str, policy: int = 0) -> frozenset[str]:
    """The files of ``checkpoint_p{policy}/`` (and its ``milestones/``) that msf must leave alone: in a Sample
    Factory folder, its checkpoints (and any file that cannot be read, which could be one); nothing elsewhere."""
    if not is_sf2_folder(exp_dir):
        return frozenset()
    d = checkpoint_dir(exp_dir, policy)
    kept = set()
    for path in glob.glob(os.path.join(d, "*.pth")) + glob.glob(os.path.join(d, "milestones", "*.pth")):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - unreadable: it may be Sample Factory's, so it stays
            kept.add(path)
            continue
        if is_sf2_checkpoint(state):
            kept.add(path)
    return frozenset(kept)
