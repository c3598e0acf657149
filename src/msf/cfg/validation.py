"""Validation of a :class:`Config`, once, before any process is spawned.

Every invalid flag is reported at once, in one :class:`ConfigError`: one line per flag, naming the flag
and what would be valid, in the order of ``--help``; ``msf-train`` prints each line and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile

from msf.cfg.config import Config


class ConfigError(ValueError):
    """One or more flags have invalid values: one line per flag, each starting with ``--name:``."""

    @property
    def problems(self) -> list[str]:
        """The lines of the message, one per flag."""
        return str(self).splitlines()


class Problems:
    """Collects the invalid flags of one validation: at most one message per flag (the first found).

    Each check returns whether it passed, so that a check that needs a valid value (a divisor, say)
    runs only when that value passed its own check.
    """

    def __init__(self) -> None:
        self.by_flag: dict[str, str] = {}

    def check(self, ok: bool, flag: str, msg: str) -> bool:
        """Record ``--flag: msg`` unless ``ok``; return ``ok``."""
        if not ok:
            self.by_flag.setdefault(flag, msg)
        return ok

    def add(self, error: ConfigError) -> None:
        """Record the flags of an error raised by another check (each line ``--name: ...``)."""
        for line in error.problems:
            flag, _, msg = line.removeprefix("--").partition(": ")
            self.by_flag.setdefault(flag, msg)

    def raise_if_any(self, order: list[str] | None = None) -> None:
        """Raises:
        ConfigError: with every recorded flag, one per line, in ``order`` (``--help``'s by default), then
            any flag not in it."""
        if not self.by_flag:
            return
        order = [f.name for f in dataclasses.fields(Config)] if order is None else order
        rank = {name: i for i, name in enumerate(order)}
        flags = sorted(self.by_flag, key=lambda f: rank.get(f, len(rank)))
        raise ConfigError("\n".join(f"--{f}: {self.by_flag[f]}" for f in flags))


POSITIVE_INTS = (
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
    "atari_screen_size",
    "res_w",
    "res_h",
    "pbt_period_env_steps",
    "rnn_size",
    "rnn_num_layers",
    "heartbeat_interval",
    "heartbeat_reporting_interval",
    "flush_summaries_interval",
)
POSITIVE = (
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
)
NON_NEGATIVE = (
    "value_loss_coeff",
    "exploration_loss_coeff",
    "max_grad_norm",
    "max_policy_lag",
    "num_batches_to_accumulate",
    "save_every_sec",
    "experiment_summaries_interval",
    "save_best_every_sec",
    "save_best_after",
    "ddp_check_interval",
    "kl_loss_coeff",
    "continuous_tanh_scale",
    "decorrelate_experience_max_seconds",
)
FRACTIONS = ("gamma", "gae_lambda", "pbt_mutation_rate")


def validate(cfg: Config) -> None:
    """Check flag values and their combinations; check that ``train_dir`` is writable.

    The environment itself is checked by :func:`msf.envs.registry.env_spaces`, the node layout (torchrun,
    Slurm, host names) by :func:`msf.distributed.nodes.discover`: both need valid flags first.

    Raises:
        ConfigError: every invalid flag, one line each (see :class:`Problems`).
    """
    p = Problems()
    # the distributed checks first: for num_workers, "at least nproc_per_node" says more than "positive"
    _check_distributed(cfg, p)
    _check_sampler_nodes(cfg, p)
    for name in POSITIVE_INTS:
        v = getattr(cfg, name)
        p.check(v >= 1, name, f"must be a positive integer, got {v}")
    for name in POSITIVE:
        v = getattr(cfg, name)
        p.check(v > 0, name, f"must be positive, got {v}")
    for name in NON_NEGATIVE:
        v = getattr(cfg, name)
        p.check(v >= 0, name, f"must not be negative, got {v}")
    for name in FRACTIONS:
        v = getattr(cfg, name)
        p.check(0.0 <= v <= 1.0, name, f"must be in [0, 1], got {v}")
    p.check(cfg.seed is None or 0 <= cfg.seed < 2**32, "seed", f"must be in [0, 2**32), got {cfg.seed}")
    for name in ("env_framestack", "eval_env_frameskip"):
        v = getattr(cfg, name)
        p.check(v is None or v >= 1, name, f"must be a positive integer, got {v}")
    p.check(
        cfg.obs_scale is None or cfg.obs_scale > 0,
        "obs_scale",
        f"must be positive (observations are divided by it), got {cfg.obs_scale}",
    )
    p.check(
        not (cfg.deterministic and cfg.decorrelate_experience_max_seconds > 0),
        "decorrelate_experience_max_seconds",
        "must be 0 with --deterministic=True: the random steps it adds are timed, so no two runs would take the same",
    )
    _check_sampling(cfg, p)
    _check_learning(cfg, p)
    _check_model(cfg, p)
    _check_policies(cfg, p)
    _check_persistence(cfg, p)
    p.raise_if_any()


def check_node_flags(cfg: Config, p: Problems) -> None:
    """Record in ``p`` the invalid node flags among those that need no environment: ``nnodes >= 1``,
    ``node_rank >= 0``, ``max_restarts >= 0``."""
    p.check(cfg.nnodes >= 1, "nnodes", f"must be a positive integer, got {cfg.nnodes}")
    p.check(cfg.node_rank >= 0, "node_rank", f"must be in [0, nnodes) = [0, {cfg.nnodes}), got {cfg.node_rank}")
    p.check(cfg.max_restarts >= 0, "max_restarts", f"must not be negative, got {cfg.max_restarts}")


def _check_distributed(cfg: Config, p: Problems) -> None:
    if cfg.nproc_per_node is not None and p.check(
        cfg.nproc_per_node >= 1, "nproc_per_node", f"must be a positive integer, got {cfg.nproc_per_node}"
    ):
        p.check(
            # a device env (--env_gpu_actions) has no rollout worker: msf sets --num_workers to the device groups
            cfg.num_workers >= cfg.nproc_per_node or cfg.sampler_port != 0 or cfg.env_gpu_actions,
            "num_workers",
            f"must be at least nproc_per_node={cfg.nproc_per_node} (every device group needs a rollout worker), "
            f"got {cfg.num_workers}",
        )
    p.check(0 <= cfg.master_port < 65536, "master_port", f"must be a TCP port in [0, 65535], got {cfg.master_port}")
    p.check(cfg.dist_timeout >= 1, "dist_timeout", f"must be a positive number of seconds, got {cfg.dist_timeout}")
    check_node_flags(cfg, p)


def _check_sampler_nodes(cfg: Config, p: Problems) -> None:
    """``--sampler_port`` and what it needs; ``num_workers`` at least 1, or 0 with sampler nodes to feed the
    learner."""
    least = 0 if cfg.sampler_port else 1
    p.check(
        cfg.num_workers >= least,
        "num_workers",
        f"must be a positive integer, got {cfg.num_workers} (0 only with --sampler_port: sampler nodes then feed "
        "the learner)",
    )
    if not p.check(0 <= cfg.sampler_port < 65536, "sampler_port", f"must be a TCP port, got {cfg.sampler_port}"):
        return
    if cfg.sampler_port:
        for ok, name, why in (
            (cfg.nnodes == 1, "nnodes", "one node (its device groups listen on --sampler_port + local rank)"),
            (cfg.sampler_port + (cfg.nproc_per_node or 1) <= 65536, "nproc_per_node", "a port per device group"),
            (cfg.async_rl, "async_rl", "--async_rl=True (remote trajectories arrive at their own pace)"),
            (not cfg.deterministic, "deterministic", "--deterministic=False (remote timing varies)"),
            (not cfg.serial_mode, "serial_mode", "--serial_mode=False"),
        ):
            p.check(ok, name, f"--sampler_port={cfg.sampler_port}: sampler nodes need {why} in this version")


def _check_sampling(cfg: Config, p: Problems) -> None:
    p.check(
        -20 <= cfg.default_niceness <= 19,
        "default_niceness",
        f"must be in [-20, 19] (Linux niceness), got {cfg.default_niceness}",
    )
    p.check(
        cfg.learner_threads >= 0,
        "learner_threads",
        f"must be 0 (automatic) or a number of threads, got {cfg.learner_threads}",
    )
    # a combination is checked only when its parts are valid on their own: no second line for one mistake
    if cfg.worker_num_splits >= 1 and cfg.num_envs_per_worker >= 1:
        p.check(
            cfg.num_envs_per_worker % cfg.worker_num_splits == 0,
            "worker_num_splits",
            f"must divide num_envs_per_worker={cfg.num_envs_per_worker}, got {cfg.worker_num_splits}",
        )
    groups = cfg.nproc_per_node or 1
    # (num_workers < nproc_per_node is reported on its own: one device group would then have no worker)
    if groups >= 1 and cfg.num_workers >= groups:
        p.check(
            cfg.policy_workers_per_policy <= cfg.num_workers // groups,
            "policy_workers_per_policy",
            f"must be at most the rollout workers of one device group, num_workers // nproc_per_node = "
            f"{cfg.num_workers // groups} (each inference worker serves whole rollout workers), "
            f"got {cfg.policy_workers_per_policy}",
        )
    rollout_ok = p.check(cfg.rollout >= 2, "rollout", f"must be at least 2, got {cfg.rollout}")
    recurrence_ok = p.check(
        cfg.recurrence == -1 or cfg.recurrence >= 1,
        "recurrence",
        f"must be -1 or a positive integer, got {cfg.recurrence}",
    )
    if rollout_ok and recurrence_ok and cfg.recurrence != -1:
        p.check(
            cfg.recurrence <= cfg.rollout,
            "recurrence",
            f"must not be longer than rollout={cfg.rollout}, got {cfg.recurrence}",
        )
        p.check(
            cfg.rollout % cfg.recurrence == 0, "recurrence", f"must divide rollout={cfg.rollout}, got {cfg.recurrence}"
        )


def _check_learning(cfg: Config, p: Problems) -> None:
    if cfg.rollout >= 2:
        p.check(
            cfg.batch_size % cfg.rollout == 0,
            "batch_size",
            f"must be a multiple of rollout={cfg.rollout} (the learner trains on whole trajectories), "
            f"got {cfg.batch_size}",
        )
    if cfg.lr_adaptive_min > 0 and cfg.lr_adaptive_max > 0:
        p.check(
            cfg.lr_adaptive_min <= cfg.lr_adaptive_max,
            "lr_adaptive_min",
            f"must not exceed lr_adaptive_max={cfg.lr_adaptive_max}, got {cfg.lr_adaptive_min}",
        )


def _check_model(cfg: Config, p: Problems) -> None:
    p.check(
        len(cfg.encoder_mlp_layers) >= 1 and all(n >= 1 for n in cfg.encoder_mlp_layers),
        "encoder_mlp_layers",
        f"must be one or more positive layer sizes, got {cfg.encoder_mlp_layers}",
    )
    p.check(
        all(n >= 1 for n in cfg.decoder_mlp_layers),
        "decoder_mlp_layers",
        f"must be positive layer sizes, got {cfg.decoder_mlp_layers}",
    )
    p.check(
        all(n >= 1 for n in cfg.encoder_conv_mlp_layers),
        "encoder_conv_mlp_layers",
        f"must be positive layer sizes, got {cfg.encoder_conv_mlp_layers}",
    )


def _check_policies(cfg: Config, p: Problems) -> None:
    p.check(1 <= cfg.num_policies <= 64, "num_policies", f"must be in [1, 64], got {cfg.num_policies}")
    p.check(not cfg.with_pbt or cfg.num_policies >= 2, "with_pbt", "needs --num_policies of at least 2")
    p.check(
        0.0 < cfg.pbt_replace_fraction <= 0.5,
        "pbt_replace_fraction",
        f"must be in (0, 0.5], got {cfg.pbt_replace_fraction}",
    )
    p.check(
        1.0 <= cfg.pbt_perturb_min <= cfg.pbt_perturb_max,
        "pbt_perturb_min",
        f"must satisfy 1 <= pbt_perturb_min <= pbt_perturb_max, got {cfg.pbt_perturb_min} and {cfg.pbt_perturb_max}",
    )


def _check_persistence(cfg: Config, p: Problems) -> None:
    parts = cfg.experiment.split(os.sep)
    p.check(
        bool(cfg.experiment) and all(part not in ("", ".", "..") for part in parts),
        "experiment",
        f"must be a name, or names joined by '{os.sep}' for nested folders under train_dir as in Sample Factory "
        f"(no empty part, '.', '..' or leading '{os.sep}'), got {cfg.experiment!r}",
    )
    p.check(
        cfg.save_milestones_sec == -1 or cfg.save_milestones_sec >= 1,
        "save_milestones_sec",
        f"must be -1 (no milestones) or a positive number of seconds, got {cfg.save_milestones_sec}",
    )
    if cfg.with_wandb:
        p.check(
            importlib.util.find_spec("wandb") is not None,
            "with_wandb",
            "wandb is not installed: pip install 'multi-sample-factory[wandb]' (or pip install wandb)",
        )
    try:
        _check_writable(cfg.train_dir)
    except ConfigError as e:
        p.add(e)


def _check_writable(train_dir: str) -> None:
    try:
        os.makedirs(train_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=train_dir, prefix=".msf-write-test"):
            pass
    except OSError as e:
        raise ConfigError(f"--train_dir: {train_dir!r} is not a writable folder ({e.strerror or e})") from None


# gymnasium's classic-control ids that EnvPool ports under the same id, with the same spaces and episode limits
# (CartPole-v1 500 steps, Acrobot-v1 500, MountainCar-v0 and Pendulum-v1 200); msf.envs.vector.check_backend
# compares the spaces before any process is spawned. Here (not in msf.envs) because flags are checked here.
ENVPOOL_CLASSIC = (
    "CartPole-v0",
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
)
ENVPOOL_FAMILIES = ("atari_", "mujoco_")
ENVPOOL_SERVES = "atari_* and mujoco_* envs and " + ", ".join(ENVPOOL_CLASSIC)
"""What ``--env_backend=envpool`` serves, in words, for its error messages."""


def envpool_serves(env: str) -> bool:
    """Whether msf's EnvPool backend serves ``env``: an ``atari_*`` or ``mujoco_*`` env or one of
    :data:`ENVPOOL_CLASSIC` (whether EnvPool itself has the task is checked when it is made)."""
    return env.startswith(ENVPOOL_FAMILIES) or env in ENVPOOL_CLASSIC


def resolve_sample_factory_flags(cfg: Config, given: set[str]) -> Config:
    """Sample Factory flags that msf expresses with its own: ``--batched_sampling=True`` is
    ``--env_backend=envpool`` (a split of a worker's envs stepped as one vectorised env), or ``vector`` where that
    is given.

    Raises:
        ConfigError: ``--batched_sampling=True`` with ``--env_backend=gymnasium`` given (or ``False`` with
            ``--env_backend=envpool``), or for an env EnvPool does
            not serve (``atari_*``, ``mujoco_*`` and :data:`ENVPOOL_CLASSIC` are served).
    """
    if not cfg.batched_sampling:
        if "batched_sampling" in given and "env_backend" in given and cfg.env_backend == "envpool":
            raise ConfigError(
                "--batched_sampling: False steps each env by itself, which contradicts --env_backend=envpool (one "
                "EnvPool per split): leave one of them out"
            )
        return cfg
    if "env_backend" in given and cfg.env_backend == "vector":
        return cfg  # one gymnasium VectorEnv per split: batched too
    if not envpool_serves(cfg.env):
        raise ConfigError(
            f"--batched_sampling: msf's batched sampling steps each split as one EnvPool, which serves "
            f"{ENVPOOL_SERVES} only, not {cfg.env!r}: leave it out (each split's envs are then stepped one by one)"
        )
    if "env_backend" in given and cfg.env_backend != "envpool":
        raise ConfigError(
            f"--batched_sampling: True steps each split as one EnvPool (--env_backend=envpool), which contradicts "
            f"--env_backend={cfg.env_backend}: leave one of them out"
        )
    return dataclasses.replace(cfg, env_backend="envpool")


def resolve_deterministic(cfg: Config, given: set[str]) -> Config:
    """``--deterministic=True`` implies ``--async_rl=False`` and ``--learner_threads=1``, unless they are given;
    given, they must fit.

    Args:
        given: the names of the flags given explicitly.

    Raises:
        ConfigError: ``--async_rl=True`` or ``--learner_threads=0`` given with ``--deterministic=True``.
    """
    if not cfg.deterministic:
        return cfg
    p = Problems()
    p.check(
        not ("async_rl" in given and cfg.async_rl),
        "async_rl",
        "True contradicts --deterministic=True: a run is reproducible only when the learner trains on exactly "
        "the trajectories its current weights collected (leave --async_rl out, or set it to False)",
    )
    p.check(
        not ("learner_threads" in given and cfg.learner_threads == 0),
        "learner_threads",
        "0 (set from the measured load during the run) contradicts --deterministic=True: a float sum depends on "
        "the threads it is split over; give a fixed number (the default with --deterministic is 1)",
    )
    p.raise_if_any()
    return dataclasses.replace(
        cfg, async_rl=False, learner_threads=cfg.learner_threads if "learner_threads" in given else 1
    )


def check_sync(cfg: Config, num_agents: int, nproc_per_node: int) -> None:
    """``--async_rl=False`` (synchronous PPO): one policy, and a training iteration (``batch_size x
    num_batches_per_epoch`` samples) that is a whole multiple of one rollout of every env of each device group
    (its rollout workers x ``num_envs_per_worker`` x ``num_agents`` x ``rollout``), so that every env writes the
    same whole number of trajectories per iteration and the iteration holds exactly those (Sample Factory's rule
    for its sync mode). Needs the env's agents and the node's device groups, so it comes after both are known.

    Raises:
        ConfigError: naming ``--async_rl`` and the figures, with a batch size that would do.
    """
    if cfg.async_rl:
        return
    p = Problems()
    p.check(
        cfg.num_policies == 1,
        "async_rl",
        f"False needs --num_policies=1 (each env's agents are drawn among the policies at random, so one policy's "
        f"share of a rollout has no fixed size), got --num_policies={cfg.num_policies}",
    )
    iteration = cfg.batch_size * cfg.num_batches_per_epoch
    for group in range(nproc_per_node):
        workers = cfg.num_workers // nproc_per_node + (1 if group < cfg.num_workers % nproc_per_node else 0)
        rollout = workers * cfg.num_envs_per_worker * num_agents * cfg.rollout
        if iteration % rollout:
            fit = max(1, round(iteration / rollout)) * rollout
            p.check(
                False,
                "async_rl",
                f"False needs a training iteration (--batch_size={cfg.batch_size} x --num_batches_per_epoch="
                f"{cfg.num_batches_per_epoch} = {iteration} samples) that is a whole multiple of one rollout of "
                f"{'the device group' if nproc_per_node == 1 else f'device group {group}'}'s envs ({workers} rollout "
                f"worker(s) x "
                f"{cfg.num_envs_per_worker} envs x {num_agents} agent(s) x --rollout={cfg.rollout} = {rollout} "
                f"samples): for example --batch_size={fit} --num_batches_per_epoch=1, or --async_rl=True",
            )
            break
    p.raise_if_any()
