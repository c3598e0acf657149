"""Validation of a :class:`Config`, once, before any process is spawned.

Every problem is reported as a :class:`ConfigError` whose message names the flag
and what would be valid; ``msf-train`` prints it on one line and exits with code 2.
"""

from __future__ import annotations

import os
import tempfile

from msf.cfg.config import Config


class ConfigError(ValueError):
    """A flag has an invalid value. The message starts with the flag's name."""


def _check(ok: bool, flag: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"--{flag}: {msg}")


def validate(cfg: Config) -> None:
    """Check flag values and their combinations; check that ``train_dir`` is writable.

    The environment itself is checked by :func:`msf.envs.registry.env_spaces`.

    Raises:
        ConfigError: on the first invalid flag found.
    """
    if cfg.nproc_per_node is not None:
        _check(cfg.nproc_per_node >= 1, "nproc_per_node", f"must be a positive integer, got {cfg.nproc_per_node}")
        _check(
            cfg.num_workers >= cfg.nproc_per_node,
            "num_workers",
            f"must be at least nproc_per_node={cfg.nproc_per_node} (every device group needs a rollout worker), "
            f"got {cfg.num_workers}",
        )
    _check(0 <= cfg.master_port < 65536, "master_port", f"must be a TCP port in [0, 65535], got {cfg.master_port}")
    _check(cfg.dist_timeout >= 1, "dist_timeout", f"must be a positive number of seconds, got {cfg.dist_timeout}")
    _check(cfg.ddp_check_interval >= 0, "ddp_check_interval", f"must not be negative, got {cfg.ddp_check_interval}")
    _check(
        -20 <= cfg.default_niceness <= 19,
        "default_niceness",
        f"must be in [-20, 19] (Linux niceness), got {cfg.default_niceness}",
    )
    _check(
        cfg.learner_threads >= 0,
        "learner_threads",
        f"must be 0 (automatic) or a number of threads, got {cfg.learner_threads}",
    )
    for name in (
        "num_workers",
        "num_envs_per_worker",
        "worker_num_splits",
        "policy_workers_per_policy",
        "rollout",
        "batch_size",
        "num_batches_per_epoch",
        "num_epochs",
        "env_frameskip",
        "keep_checkpoints",
        "stats_avg",
        "train_for_env_steps",
        "train_for_seconds",
        "num_batches_to_accumulate",
        "res_w",
        "res_h",
    ):
        v = getattr(cfg, name)
        _check(v >= 1, name, f"must be a positive integer, got {v}")
    _check(1 <= cfg.num_policies <= 64, "num_policies", f"must be in [1, 64], got {cfg.num_policies}")
    _check(not cfg.with_pbt or cfg.num_policies >= 2, "with_pbt", "needs --num_policies of at least 2")
    _check(
        0.0 < cfg.pbt_replace_fraction <= 0.5,
        "pbt_replace_fraction",
        f"must be in (0, 0.5], got {cfg.pbt_replace_fraction}",
    )
    _check(0.0 <= cfg.pbt_mutation_rate <= 1.0, "pbt_mutation_rate", f"must be in [0, 1], got {cfg.pbt_mutation_rate}")
    _check(
        1.0 <= cfg.pbt_perturb_min <= cfg.pbt_perturb_max,
        "pbt_perturb_min",
        f"must satisfy 1 <= pbt_perturb_min <= pbt_perturb_max, got {cfg.pbt_perturb_min} and {cfg.pbt_perturb_max}",
    )
    _check(
        cfg.pbt_period_env_steps >= 1,
        "pbt_period_env_steps",
        f"must be a positive integer, got {cfg.pbt_period_env_steps}",
    )
    _check(
        cfg.num_envs_per_worker % cfg.worker_num_splits == 0,
        "worker_num_splits",
        f"must divide num_envs_per_worker={cfg.num_envs_per_worker}, got {cfg.worker_num_splits}",
    )
    groups = cfg.nproc_per_node or 1
    _check(
        cfg.policy_workers_per_policy <= cfg.num_workers // groups,
        "policy_workers_per_policy",
        f"must be at most the rollout workers of one device group, num_workers // nproc_per_node = "
        f"{cfg.num_workers // groups} (each inference worker serves whole rollout workers), "
        f"got {cfg.policy_workers_per_policy}",
    )
    _check(cfg.rollout >= 2, "rollout", f"must be at least 2, got {cfg.rollout}")
    _check(
        cfg.recurrence == -1 or cfg.recurrence >= 1,
        "recurrence",
        f"must be -1 or a positive integer, got {cfg.recurrence}",
    )
    if cfg.recurrence != -1:
        _check(
            cfg.recurrence <= cfg.rollout,
            "recurrence",
            f"must not be longer than rollout={cfg.rollout}, got {cfg.recurrence}",
        )
        _check(
            cfg.rollout % cfg.recurrence == 0, "recurrence", f"must divide rollout={cfg.rollout}, got {cfg.recurrence}"
        )
    _check(
        cfg.batch_size % cfg.rollout == 0,
        "batch_size",
        f"must be a multiple of rollout={cfg.rollout} (the learner trains on whole trajectories), got {cfg.batch_size}",
    )
    for name in ("gamma", "gae_lambda"):
        v = getattr(cfg, name)
        _check(0.0 <= v <= 1.0, name, f"must be in [0, 1], got {v}")
    for name in (
        "learning_rate",
        "ppo_clip_ratio",
        "ppo_clip_value",
        "adam_eps",
        "vtrace_rho",
        "vtrace_c",
        "lr_schedule_kl_threshold",
        "lr_adaptive_min",
        "lr_adaptive_max",
        "reward_clip",
        "initial_stddev",
    ):
        v = getattr(cfg, name)
        _check(v > 0, name, f"must be positive, got {v}")
    for name in (
        "value_loss_coeff",
        "exploration_loss_coeff",
        "max_grad_norm",
        "max_policy_lag",
        "save_every_sec",
        "experiment_summaries_interval",
        "save_best_every_sec",
        "save_best_after",
    ):
        v = getattr(cfg, name)
        _check(v >= 0, name, f"must not be negative, got {v}")
    _check(
        cfg.lr_adaptive_min <= cfg.lr_adaptive_max,
        "lr_adaptive_min",
        f"must not exceed lr_adaptive_max={cfg.lr_adaptive_max}, got {cfg.lr_adaptive_min}",
    )
    _check(
        len(cfg.encoder_mlp_layers) >= 1 and all(n >= 1 for n in cfg.encoder_mlp_layers),
        "encoder_mlp_layers",
        f"must be one or more positive layer sizes, got {cfg.encoder_mlp_layers}",
    )
    _check(
        bool(cfg.experiment) and os.sep not in cfg.experiment,
        "experiment",
        f"must be a non-empty name without '{os.sep}', got {cfg.experiment!r}",
    )
    _check(cfg.rnn_size >= 1, "rnn_size", f"must be a positive integer, got {cfg.rnn_size}")
    _check(cfg.rnn_num_layers >= 1, "rnn_num_layers", f"must be a positive integer, got {cfg.rnn_num_layers}")
    _check(
        len(cfg.encoder_conv_mlp_layers) >= 0 and all(n >= 1 for n in cfg.encoder_conv_mlp_layers),
        "encoder_conv_mlp_layers",
        f"must be positive layer sizes, got {cfg.encoder_conv_mlp_layers}",
    )
    if cfg.use_rnn:
        _check(
            cfg.actor_critic_share_weights,
            "actor_critic_share_weights",
            "must be True with --use_rnn (one encoder and recurrent core for actor and critic)",
        )
    _check(
        cfg.save_milestones_sec == -1 or cfg.save_milestones_sec >= 1,
        "save_milestones_sec",
        f"must be -1 (no milestones) or a positive number of seconds, got {cfg.save_milestones_sec}",
    )
    if cfg.with_wandb:
        import importlib.util

        _check(
            importlib.util.find_spec("wandb") is not None,
            "with_wandb",
            "wandb is not installed: pip install 'multi-sample-factory[wandb]' (or pip install wandb)",
        )
    _check_writable(cfg.train_dir)


def _check_writable(train_dir: str) -> None:
    try:
        os.makedirs(train_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=train_dir, prefix=".msf-write-test"):
            pass
    except OSError as e:
        raise ConfigError(f"--train_dir: {train_dir!r} is not a writable folder ({e.strerror or e})") from None
