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

from msf.runtime.signals import StartUp

if TYPE_CHECKING:  # imported in the functions: main() installs its signal handlers first, before any of them
    from msf.cfg.config import Config
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
--logdir TRAIN_DIR, plot it with msf-plot, evaluate it with msf-enjoy. Ctrl-C, SIGTERM, SIGHUP or a SIGINT to
this process (kill -INT) stops cleanly with a final checkpoint; a second Ctrl-C exits at once. SIGUSR1 (kill -USR1,
Slurm's --signal=USR1@60) writes a checkpoint now and training goes on. Exit codes: 0 done
or stopped, 1 failed, 2 invalid flags, 3 untrained (the budget or --train_for_seconds ran out before any batch
filled: no SGD step), 130 interrupted (a second Ctrl-C, or a Ctrl-C, SIGTERM or SIGHUP before training began)."""

UNTRAINED_EXIT = 3  # summary.json's status "untrained": the run ended by itself without one SGD step


def check_model(cfg, spaces):
    """Build the model once here, so that a model that cannot fit the observations fails before spawning;
    return it.

    Raises:
        ConfigError: naming the encoder flag.
    """
    from msf.cfg.validation import ConfigError
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
        hint = ", or a larger --atari_screen_size" if flag != "encoder_custom" and cfg.env.startswith("atari_") else ""
        raise ConfigError(f"--{flag}: {e}{hint}") from None
    if cfg.exploration_loss == "symmetric_kl" and model.mask_slice is not None:
        raise ConfigError(
            f"--exploration_loss=symmetric_kl: {cfg.env} masks actions (an action_mask observation), "
            "and the divergence from the uniform distribution is unbounded for a masked action: use "
            "--exploration_loss=entropy"
        )
    return model


SHM_DIR = "/dev/shm"  # where torch's CPU shared memory (shm_open) lives on Linux


def shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Free bytes on the file system of ``path`` (None: there is none, not Linux). Looked up by name at each
    call: the tests replace it to simulate a small /dev/shm."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shared_memory_bytes(cfg: Config, spaces: EnvSpaces, model) -> tuple[int, int]:
    """What this node's device groups allocate in shared memory, in bytes: (trajectory buffers, published
    weights), each tensor rounded up to whole pages (a tensor is one shared-memory file)."""
    from msf.cfg.config import Derived
    from msf.distributed.topology import RankInfo
    from msf.runner.device_group import rank_config
    from msf.sampling.published_weights import PublishedWeights
    from msf.sampling.trajectory_buffer import TrajectoryBuffer

    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def pages(n: int) -> int:
        return -(-n // page) * page

    buffers = 0
    assert cfg.nproc_per_node is not None, "launch.resolve() sets it"
    for local_rank in range(cfg.nproc_per_node):
        group_cfg = rank_config(cfg, RankInfo(local_rank=local_rank, nproc_per_node=cfg.nproc_per_node))
        layout = TrajectoryBuffer.layout(group_cfg, Derived.of(group_cfg, spaces.num_agents), spaces)
        buffers += sum(pages(TrajectoryBuffer.tensor_bytes(shape, dtype)) for shape, dtype in layout.values())
    weights = sum(pages(n) for n in PublishedWeights.tensor_bytes(model)) * cfg.num_policies * cfg.nproc_per_node
    return buffers, weights


def check_shared_memory(cfg: Config, spaces: EnvSpaces, model) -> None:
    """Refuse a run whose trajectory buffers and published weights do not fit into /dev/shm's free space, before
    anything is allocated: torch's allocation failed seconds into the start-up with a bare "No space left on
    device", and left a shared-memory file of the buffer's size behind in /dev/shm.

    Raises:
        ConfigError: with what is needed, what is free and what to change.
    """
    from msf.cfg.validation import ConfigError

    free = shm_free_bytes()
    if free is None:
        return
    buffers, weights = shared_memory_bytes(cfg, spaces, model)
    if buffers + weights <= free:
        return
    mib = 2**20
    assert cfg.nproc_per_node is not None, "launch.resolve() sets it"
    suggest = -(-(buffers + weights) // (256 * mib)) * 256  # MiB, a multiple of 256
    groups = f"{cfg.nproc_per_node} device groups x " if cfg.nproc_per_node > 1 else ""
    raise ConfigError(
        f"--num_envs_per_worker: not enough shared memory: this run needs {(buffers + weights) / mib:.1f} MiB in "
        f"{SHM_DIR} ({groups}trajectory buffer {buffers / mib:.1f} MiB for {cfg.num_workers} rollout workers x "
        f"{cfg.num_envs_per_worker} envs x --rollout={cfg.rollout}, published weights {weights / mib:.1f} MiB), "
        f"and {free / mib:.1f} MiB is free there: give it more (in Docker: --shm-size={suggest}m), or use fewer "
        "--num_workers or --num_envs_per_worker, or a shorter --rollout"
    )


# Open files a device group's process holds: ~46 of its own (torch, logs, queues) and 5 per worker process it
# starts (the worker's pipe and queue ends, its shared counters, its process sentinel), measured in /proc/PID/fd
# with 1 and 8 rollout workers (2026-12-02); with room for TensorBoard, checkpoints and the rendezvous.
FDS_BASE, FDS_PER_WORKER = 256, 8


def check_file_descriptors(cfg: Config) -> str | None:
    """Make sure a device group's process may open the files its workers need: raise the soft limit of open files
    (``ulimit -n``) up to the hard one when it is short, before anything is spawned (clusters often set a soft
    limit of 1,024, which ~120 workers exceed; it failed after spawning, with "Too many open files").

    Returns:
        A line for the log when the soft limit was raised, else None.

    Raises:
        ConfigError: even the hard limit is too low, naming ``--num_workers``, the figures and ``ulimit -Hn``.
    """
    from msf.cfg.validation import ConfigError

    try:
        import resource
    except ImportError:  # not a Unix
        return None
    groups = cfg.nproc_per_node or 1  # None before resolve(): one
    workers = -(-cfg.num_workers // groups) + cfg.policy_workers_per_policy * cfg.num_policies
    need = FDS_BASE + FDS_PER_WORKER * workers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return None
    if hard != resource.RLIM_INFINITY and need > hard:
        raise ConfigError(
            f"--num_workers: {workers} worker processes per device group need about {need} open files in its "
            f"process, and the limit here is {hard} (ulimit -Hn): use fewer --num_workers (or more "
            "--nproc_per_node), or raise the hard limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard))
    now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return f"raised the limit of open files from {soft} to {now} for {workers} worker processes per device group"


def main(argv: list[str] | None = None, parsed: tuple[Config, set[str]] | None = None) -> int:
    """Parse, validate and resolve (before any process is spawned), train; return the exit code. ``parsed``: a
    config and the names of its flags given explicitly, instead of ``argv`` (:func:`msf.sf2.run_rl`).

    Its first act: a stop signal before training begins ends the run at once (exit 130), even where the shell
    started this process with SIGINT ignored (a background job of a script); once a device group runs, its own
    handler takes over (a clean stop)."""
    start = StartUp(whole_process=argv is None and parsed is None and _is_entry()).install()
    try:
        if parsed is None:
            from msf.cfg.arguments import parse_args

            parsed = parse_args(argv, description=DESCRIPTION)
        code = run(*parsed, start=start)
    except KeyboardInterrupt:
        return start.end_interrupted()
    start.restore()
    return code


def _is_entry() -> bool:
    """True in the process of ``msf-train`` (its console script) or ``python -m msf.train``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "msf-train" or getattr(spec, "name", "") == "msf.train"


def run(cfg: Config, given: set[str], start: StartUp | None = None) -> int:
    """Train with flags already parsed (``given``: the names of those given explicitly), as ``msf-train`` does
    after parsing its command line; return the exit code. ``start``: the start-up, which removes the experiment
    folder made here if a stop signal ends it."""
    from msf.cfg.validation import ConfigError

    start = start or StartUp()
    try:
        cfg, spaces, plan, changes, notes = prepare(cfg, given)
        from msf.runner.experiment import check_checkpoints

        # one process per node prepares the folder (no shared file system is assumed), and only it moves files
        prepares_dir = plan.launcher == "local" or plan.local_rank == 0
        # Read here, before anything is spawned or written: the ranks used to find no readable checkpoint and
        # start from step 0 (exit 0), and whichever rank renamed a broken file first was the only one to log it.
        set_aside = check_checkpoints(cfg, move=prepares_dir)
    except ConfigError as e:
        for line in e.problems:
            print(f"msf-train: error: {line}", file=sys.stderr)
        return 2
    first = plan.node_rank == 0 and not plan.local_rank
    warnings = (notes if first else []) + start_warnings(cfg, plan, changes) + ignored_flag_notes(given, plan)
    for line in warnings:
        print(line, file=sys.stderr)
    from msf.persistence.summaries import LOG_FILE_ONLY, setup_logging
    from msf.runner.experiment import prepare_experiment_dir, wait_for_experiment_dir

    if prepares_dir:
        from msf.runner.experiment import experiment_dir

        new_dir = plan.launcher == "local" and not os.path.exists(experiment_dir(cfg))
        exp_dir = prepare_experiment_dir(cfg)
        if new_dir:  # removed again if a Ctrl-C ends the start-up (msf-train's own launcher only)
            start.made_before_training(exp_dir)
    else:
        exp_dir = wait_for_experiment_dir(cfg)  # the node's local rank 0 prepares it
    setup_logging(exp_dir, rank=plan.rank, to_file=cfg.log_to_file)
    if cfg.use_env_info_cache and prepares_dir:
        from msf.envs.registry import env_info_key, save_env_info

        save_env_info(exp_dir, cfg.env, spaces, env_info_key(cfg))  # the next start reads the spaces from here
    for line in warnings:  # printed above; the log keeps them too
        logging.getLogger("msf").warning("%s", line.removeprefix("msf-train: warning: "), extra=LOG_FILE_ONLY)
    if changes and not first:  # the first rank's warnings above hold them already: one line in its log
        logging.getLogger("msf").warning("resuming with changed flags: %s", "; ".join(changes))
    for note in set_aside if prepares_dir else ():
        logging.getLogger("msf").warning("%s", note)
    failed = _launch(cfg, spaces, plan, exp_dir)
    start.keep()
    return failed if failed is not None else _report(cfg, plan, exp_dir)


def prepare(cfg: Config, given: set[str]) -> tuple[Config, EnvSpaces, NodePlan, list[str], list[str]]:
    """Everything decided before any process is spawned: the env family's defaults, the flags' validation,
    this process's place in the job, the resumed experiment's config, the device and topology, the env's
    spaces and a model built once to check that it fits them.

    Args:
        cfg: the parsed flags. given: the names of the flags given explicitly.

    Returns:
        ``(config, spaces, plan, changes, notes)``: the config to run, the env's spaces, the node plan, the flags
        that differ from a resumed experiment's saved config (``"--name: old -> new"``) and warnings about what a
        default could not do (``--async_rl``).

    Raises:
        ConfigError: every invalid flag (one line each); then, once the flags are valid, the first problem of
            the node layout, the resumed experiment, the device or the env.
    """
    from msf.cfg.validation import ConfigError, resolve_deterministic, resolve_sample_factory_flags, validate
    from msf.distributed.nodes import discover
    from msf.envs.device_env import device_env_entry, device_env_spaces, resolve_device_env
    from msf.envs.families import apply_family_defaults, eval_frameskip
    from msf.envs.registry import check_single_env, env_config_of, env_info_key, env_spaces, load_env_info
    from msf.runner.experiment import resume_config
    from msf.runner.launch import resolve

    cfg = resolve_deterministic(resolve_sample_factory_flags(apply_family_defaults(cfg, given), given), given)
    validate(cfg)
    eval_frameskip(cfg)  # msf-enjoy's --eval_env_frameskip must divide the frameskip trained with
    plan = discover(cfg, given)
    if plan.launcher != "local" and cfg.max_restarts > 0:
        raise ConfigError(
            f"--max_restarts: this process is one rank started by {plan.source}, which restarts "
            "it: use torchrun's --max_restarts (or Slurm's --requeue) instead"
        )
    cfg, changes = resume_config(cfg, given)
    validate(cfg)  # the saved config too: a value edited by hand in it
    cfg = resolve(cfg, given, plan)
    assert cfg.nproc_per_node is not None, "launch.resolve() sets it"
    cfg = resolve_device_env(cfg, given, cfg.nproc_per_node)
    device_env = device_env_entry(cfg.env)  # None: rollout workers step the env on the CPU
    exp = os.path.join(cfg.train_dir, cfg.experiment)
    cached = load_env_info(exp, cfg.env, env_info_key(cfg)) if cfg.use_env_info_cache else None
    spaces = cached or (device_env_spaces(device_env) if device_env else env_spaces(cfg.env, env_config_of(cfg)))
    cfg, notes = _check_sync_or_go_async(cfg, given, spaces.num_agents)
    if cfg.env_backend != "gymnasium":
        from msf.envs.vector import check_backend

        check_backend(cfg, spaces)
    elif device_env is None:
        check_single_env(cfg.env)
    model = check_model(cfg, spaces)
    if device_env is None:  # a device env's buffer is on its device, not in shared memory
        check_shared_memory(cfg, spaces, model)
    _check_sampler_nodes(cfg)
    raised = check_file_descriptors(cfg)
    return cfg, spaces, plan, changes, notes + ([raised] if raised else [])


def _check_sampler_nodes(cfg: Config) -> None:
    """``--sampler_port``: the port can be listened on and ``--sampler_key_file``, if given, holds a key.

    Raises:
        ConfigError: naming the flag and the address or file.
    """
    from msf.cfg.validation import ConfigError
    from msf.sampling.sampler_endpoint import check_sampler_port
    from msf.sampling.wire import read_key

    why = check_sampler_port(cfg)
    if why:
        raise ConfigError(why)
    if cfg.sampler_port and cfg.sampler_key_file:
        try:
            read_key(cfg.sampler_key_file)
        except (OSError, ValueError) as e:
            raise ConfigError(f"--sampler_key_file: {e}") from None


def _check_sync_or_go_async(cfg: Config, given: set[str], num_agents: int) -> tuple[Config, list[str]]:
    """:func:`check_sync`; but where ``--async_rl=False`` is only the env family's default (Sample Factory's Atari
    and MuJoCo launchers set it) and the workers given do not fit its rule, train asynchronously instead, with a
    warning that says why: a default does not refuse a command line.

    Raises:
        ConfigError: the rule fails for an ``--async_rl=False`` that was given, or that ``--deterministic`` set.
    """
    import dataclasses

    from msf.cfg.validation import ConfigError, check_sync
    from msf.envs.families import family_defaults, family_of

    assert cfg.nproc_per_node is not None, "launch.resolve() sets it"
    try:
        check_sync(cfg, num_agents, cfg.nproc_per_node)
        return cfg, []
    except ConfigError as e:
        if "async_rl" in given or cfg.deterministic or family_defaults(cfg.env).get("async_rl") is not False:
            raise
        why = str(e).removeprefix("--async_rl: False needs ").split(": for example")[0]
    return dataclasses.replace(cfg, async_rl=True), [
        f"msf-train: warning: --async_rl: {family_of(cfg.env)}*'s default False (Sample Factory's) needs {why}; "
        "training asynchronously instead (give --async_rl=False with a batch that fits to insist)"
    ]


def start_warnings(cfg: Config, plan: NodePlan, changes: list[str]) -> list[str]:
    """The warnings ``msf-train`` prints once the run is sure to start (after every check of :func:`prepare`): a
    fatal error comes alone, not after a warning about a run that never starts."""
    lines = []
    if changes and plan.node_rank == 0 and not plan.local_rank:
        lines.append(
            f"msf-train: warning: resuming {cfg.experiment!r} with flags that differ from its saved config: "
            + "; ".join(changes)
        )
    # (a device env, --env_gpu_actions, is seeded with a torch generator of its own: msf cannot reset it here)
    if cfg.deterministic and not cfg.env_gpu_actions and plan.node_rank == 0 and not plan.local_rank:
        from msf.envs.registry import env_config_of
        from msf.envs.seeding import reset_ignores_seed

        if reset_ignores_seed(cfg.env, env_config_of(cfg)):
            lines.append(
                f"msf-train: warning: --deterministic: {cfg.env!r} gave two different first observations for two "
                "resets with the same seed: its episodes, and so the run, will not repeat bit for bit (the env "
                "ignores its seed, or draws from a source of its own)"
            )
    if cfg.with_pbt and max(cfg.pbt_start_mutation, cfg.pbt_period_env_steps) > cfg.train_for_env_steps:
        lines.append(
            f"msf-train: warning: --with_pbt: no replacement can happen within --train_for_env_steps="
            f"{cfg.train_for_env_steps} (--pbt_start_mutation={cfg.pbt_start_mutation}, "
            f"--pbt_period_env_steps={cfg.pbt_period_env_steps})"
        )
    return lines


def ignored_flag_notes(given: set[str], plan: NodePlan) -> list[str]:
    """One warning per Sample Factory flag given that has no effect in msf (:data:`msf.cfg.flags.IGNORED`, and
    msf-enjoy's flags), on the node's first process only."""
    from msf.cfg.arguments import EVALUATION_FLAGS
    from msf.cfg.flags import IGNORED

    if plan.node_rank != 0 or plan.local_rank:
        return []
    lines = []
    for name in sorted(given & (set(IGNORED) | set(EVALUATION_FLAGS))):
        why = IGNORED.get(name, "it is msf-enjoy's (evaluation), and this is training")
        lines.append(f"msf-train: warning: --{name} is accepted from Sample Factory and has no effect here: {why}")
    return lines


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
        from msf.persistence.summaries import LOG_FILE_ONLY

        # the whole message (a rank's traceback) to log.txt; the terminal gets its first line, below
        logging.getLogger("msf").error("a device group failed: %s", e, extra=LOG_FILE_ONLY)
        from msf.runner.device_group import failure_line

        last = failure_line(e)
        if not cfg.log_to_file:  # no log.txt to hold the whole message: the terminal gets it
            print(str(e), file=sys.stderr)
        print(
            f"msf-train: a device group failed: {last} "
            f"({'details in ' + os.path.join(exp_dir, 'log.txt') if cfg.log_to_file else 'details above'})",
            file=sys.stderr,
        )
        return 1
    return None


def _report(cfg: Config, plan: NodePlan, exp_dir: str) -> int:
    """Print where the results are and the final figures of ``summary.json``; return the exit code (1 when the
    run failed, :data:`UNTRAINED_EXIT` when it made no SGD step)."""
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
    if summary["status"] == "untrained":
        from msf.persistence.summaries import LOG_FILE_ONLY

        secs = summary["policies"]["0"].get("batch_seconds")
        line = (
            f"untrained: the run ended before any batch filled, no SGD step (--batch_size={cfg.batch_size}"
            f"{'' if secs is None else f': one takes about {secs:.0f} s at the rate sampled'}); a smaller "
            "--batch_size or more envs (--num_workers, --num_envs_per_worker) fill one sooner"
        )
        print(f"msf-train: {line}", file=sys.stderr)
        logging.getLogger("msf").warning("%s", line, extra=LOG_FILE_ONLY)
        return UNTRAINED_EXIT
    return 1 if summary["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
