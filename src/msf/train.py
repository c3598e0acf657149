"""``msf-train``: asynchronous PPO (APPO) on one device group.

Usage: ``msf-train --env=CartPole-v1 --experiment=NAME [--train_dir=DIR] [flags]``
(also ``python -m msf.train``). Flags keep Sample Factory 2's names, meanings and defaults.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from msf.cfg.arguments import parse_args
from msf.cfg.config import Config
from msf.cfg.validation import ConfigError, validate

if TYPE_CHECKING:  # imported in the functions: --help and invalid flags answer before torch loads
    from msf.distributed.nodes import NodePlan
    from msf.envs.registry import EnvSpaces

DESCRIPTION = """Asynchronous PPO (APPO): rollout workers step environments, inference workers batch their
observations and run the policy, the learner trains on the trajectories they write into shared memory. Flags
keep Sample Factory 2's names, meanings and defaults. --batch_size is the minibatch of one learner replica:
with --nproc_per_node=N device groups (N learner replicas whose gradients DDP averages) the effective batch is
batch_size x N. Results go to TRAIN_DIR/EXPERIMENT: config.json, checkpoint_p0/, tensorboard/, log.txt and, at
the end, summary.json. An existing experiment resumes from its latest checkpoint with its saved config; flags
given on the command line override it (with a warning), except those that fix the model's shape (env, encoder,
normalisers), which cannot change; --device and --nproc_per_node are taken anew at each launch. Several nodes:
--nnodes/--node_rank/--hosts on every node, or run under torchrun, or srun inside a Slurm allocation
(torch.distributed traffic is unauthenticated: keep it on a trusted network). Watch the run with tensorboard
--logdir TRAIN_DIR, plot it with msf-plot, evaluate it with msf-enjoy. Ctrl-C or SIGTERM stops cleanly with a
final checkpoint; a second Ctrl-C exits at once. Exit codes: 0 done or stopped, 1 failed, 2 invalid flags."""


def check_model(cfg, spaces) -> None:
    """Build the model once here, so that a model that cannot fit the observations fails before spawning.

    Raises:
        ConfigError: naming the encoder flag.
    """
    from msf.model.actor_critic import ActorCritic

    if cfg.exploration_loss == "symmetric_kl" and not (spaces.discrete or spaces.action_nvec is not None):
        raise ConfigError(
            "--exploration_loss=symmetric_kl needs discrete actions (Discrete, MultiDiscrete or a Tuple "
            f"of Discrete); {cfg.env} has continuous actions: use --exploration_loss=entropy"
        )
    try:
        model = ActorCritic(cfg, spaces)
    except ValueError as e:
        flag = (
            "encoder_custom"
            if cfg.encoder_custom
            else "encoder_conv_architecture"
            if len(spaces.obs_shape) == 3
            else "env"
        )
        raise ConfigError(f"--{flag}: {e}") from None
    if cfg.exploration_loss == "symmetric_kl" and model.mask_slice is not None:
        raise ConfigError(
            f"--exploration_loss=symmetric_kl: {cfg.env} masks actions (an action_mask observation), "
            "and the divergence from the uniform distribution is unbounded for a masked action: use "
            "--exploration_loss=entropy"
        )


def main(argv: list[str] | None = None) -> int:
    """Parse, validate and resolve (before any process is spawned), train; return the exit code."""
    import signal

    # a Ctrl-C before training begins ends the run at once (exit 130), even where the shell started
    # this process with SIGINT ignored (a background job of a script)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("msf-train: interrupted before training began: nothing was trained or saved", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    cfg, given = parse_args(argv, description=DESCRIPTION)
    try:
        cfg, spaces, plan, changes = prepare(cfg, given)
    except ConfigError as e:
        for line in e.problems:
            print(f"msf-train: error: {line}", file=sys.stderr)
        return 2
    from msf.persistence.summaries import setup_logging
    from msf.runner.experiment import prepare_experiment_dir, wait_for_experiment_dir

    if plan.launcher == "local" or plan.local_rank == 0:
        exp_dir = prepare_experiment_dir(cfg)  # one process per node: no shared file system is assumed
    else:
        exp_dir = wait_for_experiment_dir(cfg)  # the node's local rank 0 prepares it
    setup_logging(exp_dir, rank=plan.rank)
    if changes:
        logging.getLogger("msf").warning("resuming with changed flags: %s", "; ".join(changes))
    failed = _launch(cfg, spaces, plan, exp_dir)
    return failed if failed is not None else _report(cfg, plan, exp_dir)


def prepare(cfg: Config, given: set[str]) -> tuple[Config, EnvSpaces, NodePlan, list[str]]:
    """Everything decided before any process is spawned: the env family's defaults, the flags' validation,
    this process's place in the job, the resumed experiment's config, the device and topology, the env's
    spaces and a model built once to check that it fits them.

    Args:
        cfg: the parsed flags. given: the names of the flags given explicitly.

    Returns:
        ``(config, spaces, plan, changes)``: the config to run, the env's spaces, the node plan and the flags
        that differ from a resumed experiment's saved config (``"--name: old -> new"``).

    Raises:
        ConfigError: every invalid flag (one line each); then, once the flags are valid, the first problem of
            the node layout, the resumed experiment, the device or the env.
    """
    from msf.distributed.nodes import discover
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.runner.experiment import resume_config
    from msf.runner.launch import resolve

    cfg = apply_family_defaults(cfg, given)
    validate(cfg)
    plan = discover(cfg, given)
    if plan.launcher != "local" and cfg.max_restarts > 0:
        raise ConfigError(
            f"--max_restarts: this process is one rank started by {plan.source}, which restarts "
            "it: use torchrun's --max_restarts (or Slurm's --requeue) instead"
        )
    cfg, changes = resume_config(cfg, given)
    if changes and plan.node_rank == 0 and not plan.local_rank:
        print(
            f"msf-train: warning: resuming {cfg.experiment!r} with flags that differ from its saved config: "
            + "; ".join(changes),
            file=sys.stderr,
        )
    if changes:
        validate(cfg)
    cfg = resolve(cfg, given, plan)
    if cfg.with_pbt and max(cfg.pbt_start_mutation, cfg.pbt_period_env_steps) > cfg.train_for_env_steps:
        print(
            f"msf-train: warning: --with_pbt: no replacement can happen within --train_for_env_steps="
            f"{cfg.train_for_env_steps} (--pbt_start_mutation={cfg.pbt_start_mutation}, "
            f"--pbt_period_env_steps={cfg.pbt_period_env_steps})",
            file=sys.stderr,
        )
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    if cfg.env_backend == "envpool":
        from msf.envs.vector import check_envpool

        check_envpool(cfg, spaces)
    check_model(cfg, spaces)
    return cfg, spaces, plan, changes


def _launch(cfg: Config, spaces: EnvSpaces, plan: NodePlan, exp_dir: str) -> int | None:
    """Train; return the exit code of a failure (2: the nodes' flags do not fit together, 1: a device group
    failed), None when the run ended by itself."""
    from msf.runner.launch import JoinRefused, launch

    try:
        launch(cfg, spaces, plan)
    except JoinRefused as e:
        logging.getLogger("msf").error("%s", e)
        print(f"msf-train: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a rank died: torch.multiprocessing names it
        logging.getLogger("msf").error("a device group failed: %s", e)
        last = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"msf-train: a device group failed: {last} (details in {os.path.join(exp_dir, 'log.txt')})", file=sys.stderr
        )
        return 1
    return None


def _report(cfg: Config, plan: NodePlan, exp_dir: str) -> int:
    """Print where the results are and the final figures of ``summary.json``; return the exit code (1 when the
    run failed)."""
    holds_rank0 = plan.rank == 0 if plan.launcher != "local" else plan.node_rank == 0
    if not holds_rank0:
        print(
            f"Done: rank 0 (node 0{', ' + plan.hosts[0] if plan.hosts else ''}) holds the checkpoints and "
            f"summary.json; this node's log is {os.path.join(os.path.abspath(exp_dir), 'log.txt')}"
        )
        return 0
    summary_path = os.path.join(exp_dir, "summary.json")
    if not os.path.exists(summary_path):
        print(f"Results in {os.path.abspath(exp_dir)} (nothing was trained: see log.txt)")
        return 0
    with open(summary_path) as f:
        summary = json.load(f)
    rm = summary["episode_return_mean"]
    print(f"Results in {os.path.abspath(exp_dir)}")
    print(
        f"status {summary['status']} | env frames {summary['env_frames']} | {summary['fps']:.0f} FPS | "
        f"final episode_return_mean {'n/a' if rm is None else f'{rm:.2f}'} "
        f"(last {cfg.stats_avg} episodes)"
    )
    return 1 if summary["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
