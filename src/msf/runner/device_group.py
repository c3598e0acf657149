"""The wiring of one device group: the whole graph on one screen.

::

    rollout worker w --(pipe: split byte)--> inference worker (w % K) --(pipe: split byte)--> rollout worker w
          |  writes obs/rewards/dones                    |  writes actions/log-probs/versions
          v                                              v
                      trajectory buffer (shared memory, one per device group)
          |  FullTrajectories (slot indices) on full_queue
          v
    training loop + learner (this process) --free slots--> free_queues[w] --> rollout worker w
          |  publish weights after each SGD step (seqlock, shared memory) --> inference workers
          +--> checkpoints, TensorBoard, summary.json (rank 0)

Back-pressure: a rollout worker with no free slot waits for the learner to return one.
Stop: the sampler sets its ``stop_event``; every child polls it at least every 0.5 s. The training loop sees only
the :class:`~msf.sampling.protocol.Sampler`: these workers in child processes, or with ``--serial_mode`` in this one;
a device-side env (``--env_gpu_actions``) has neither: :class:`~msf.sampling.device_sampler.DeviceSampler` steps it
here, on the group's device, with the learner's own model, into a buffer on that device.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from typing import Any, Callable

import torch

import msf
from msf.cfg.config import Config, Derived
from msf.distributed.collectives import collectives_of
from msf.distributed.topology import RankInfo
from msf.envs.device_env import device_env_entry
from msf.envs.registry import EnvSpaces, env_info_key
from msf.learning.learner import Learner
from msf.persistence.checkpoint import list_checkpoints
from msf.persistence.sf2_checkpoint import as_msf_checkpoint
from msf.persistence.summaries import LOG_FILE_ONLY, TensorBoardSummaries, setup_logging, write_json_atomic
from msf.persistence.train_state import TrainState
from msf.runner.experiment import experiment_dir
from msf.runner.training_loop import TrainingLoop, check_replicas
from msf.runtime.affinity import learner_threads, set_learner_niceness, usable_cores
from msf.runtime.signals import Signals, exit_on_interrupt
from msf.runtime.spawning import start_fork_server, stop_fork_server, use_quiet_executable
from msf.sampling import wire
from msf.sampling.device_sampler import DeviceSampler
from msf.sampling.plan import DeviceGroup, rank_config
from msf.sampling.process_sampler import ProcessSampler
from msf.sampling.protocol import Sampler
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.remote_sampler import RemoteSampler
from msf.sampling.sampler_endpoint import SamplerEndpoint
from msf.sampling.serial import SerialSampler
from msf.sampling.trajectory_buffer import TrajectoryBuffer

log = logging.getLogger("msf")


class RunFailed(RuntimeError):
    """The run ended with ``status: failed`` (the cause is in the message and in the log)."""


_MSF_CLASS = re.compile(r"^msf(\.\w+)+: ")  # a traceback's last line: "msf.cfg.validation.ConfigError: ..."


def failure_line(e: BaseException) -> str:
    """One line for a failure: the message's first line (who failed), and when that only announces a traceback
    (``rollout_worker_0 (pid 7) failed:``), the traceback's last line, which names the exception (msf's own
    exceptions without their qualified class name: their message says it all, ``--env=X: making the env raised
    NameError: ...``)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {_MSF_CLASS.sub('', lines[-1])}"
    return lines[0]


class _SignalHandler(Signals):
    """First SIGINT/SIGTERM/SIGHUP: stop cleanly (final checkpoint). Second SIGINT: exit at once, unless
    ``launcher_ends_on_second_interrupt`` (a rank that msf's node launcher spawned: the launcher's own second SIGINT
    kills its ranks, :class:`msf.runner.launch._NodeSignals`). A SIGTERM or SIGHUP after the first signal changes
    nothing: it is the launcher passing on the same stop, or torch's death signal (SIGINT, once per thread of each
    rank) of a launcher killed outright. SIGUSR1 (:data:`msf.CHECKPOINT_SIGNAL`): a checkpoint after the current
    iteration, and training goes on.

    Installed just before the workers are spawned, so that no signal can cut a spawn short (a child would find its
    start-up data cut); until then a Ctrl-C ends the start-up (exit 130). A signal that comes before the training
    loop exists is kept for it (:meth:`attach`), and the loop then stops at its first agreement.
    """

    def __init__(self, launcher_ends_on_second_interrupt: bool = False) -> None:
        super().__init__(self._stop, self._checkpoint, None if launcher_ends_on_second_interrupt else self._again)
        self.loop: TrainingLoop | None = None
        # rank 0's: writes summary.json with status "interrupted" (None: nothing to write, or written already)
        self.last_words: Callable[[], None] | None = None
        self.install()

    def _again(self, signum: int) -> None:
        """A second Ctrl-C: rank 0 leaves a summary.json that says so (a small file written atomically: nothing
        that waits on another process), then the process exits at once (:func:`exit_on_interrupt`)."""
        if signum == signal.SIGINT and self.last_words is not None:
            try:
                self.last_words()
            except Exception as e:  # noqa: BLE001 - the exit comes first
                os.write(2, f"msf-train: summary.json could not be written: {e}\n".encode())
        exit_on_interrupt(signum)

    def _checkpoint(self) -> None:
        if self.loop is not None:
            log.warning("received SIGUSR1: writing a checkpoint after the current iteration")
            self.loop.request_checkpoint()

    def attach(self, loop: TrainingLoop) -> None:
        """The training loop exists: a stop asked for before is passed on now."""
        self.loop = loop
        if self.count:
            loop.request_stop("stopped")

    def _stop(self, signum: int) -> None:
        log.warning(
            "received %s: stopping %s%s",
            signal.Signals(signum).name,
            "after the current iteration with a final checkpoint" if self.loop else "before the first training step",
            " (Ctrl-C again to exit at once)" if signum == signal.SIGINT else "",
        )
        if self.loop is not None:
            self.loop.request_stop("stopped")


def run_device_group(
    cfg: Config, spaces: EnvSpaces, rank: RankInfo, heartbeat: Any = None, spawned_by_node_launcher: bool = False
) -> dict | None:
    """Train one policy on this device group until done; rank 0 writes and returns ``summary.json``.

    ``cfg`` is the node's resolved config (see :func:`msf.runner.launch.resolve`); this
    group runs its share of the rollout workers. The process group, if any, is already
    initialised. A failed run is logged with its traceback, its summary's ``status`` is
    ``"failed"``, the last checkpoint is left as it was, and then :class:`RunFailed` is raised on
    every rank (so that every node's launcher sees the failure and may restart). ``heartbeat``: the rank's
    :class:`~msf.distributed.rendezvous.Heartbeat` (several ranks), to which the loop reports its progress.
    ``spawned_by_node_launcher``: this rank's process is a child of msf's node launcher, which acts on a second
    Ctrl-C itself (see :class:`_SignalHandler`).
    """
    use_quiet_executable()  # before any queue: the first one starts multiprocessing's resource tracker
    group_cfg = rank_config(cfg, rank)
    derived = Derived.of(group_cfg, spaces.num_agents)
    exp_dir = experiment_dir(cfg)
    setup_logging(exp_dir, rank=rank.rank if rank.distributed else None, to_file=cfg.log_to_file)
    device = f"cuda:{rank.local_rank}" if cfg.device == "gpu" else "cpu"
    torch.manual_seed(cfg.seed)  # the same on every replica; DDP also broadcasts rank 0's weights
    _set_learner_process(cfg, rank)
    device_env = device_env_entry(cfg.env) is not None  # stepped in this process: no worker, no shared memory
    if not (
        cfg.serial_mode or device_env
    ):  # the workers' fork server imports torch while this process makes the learners
        start_fork_server()  # (after the niceness: the workers inherit the server's, and add their offsets)
    if cfg.deterministic:
        _make_deterministic(cfg, device)
    learners = _make_learners(cfg, group_cfg, derived, spaces, device, rank)
    world = collectives_of()  # every rank: the loop's agreement, the statistics, the checkpoint exchange
    state = _restore(cfg, learners, exp_dir, world)
    if _budget_spent(cfg, state, derived):
        return None  # every rank reads the same checkpoint, so every rank returns here: nothing to agree on
    _log_start(cfg, group_cfg, rank, device, exp_dir, device_env)
    check_replicas(learners, world)
    buffer = TrajectoryBuffer.allocate(group_cfg, derived, spaces, device if device_env else None)
    weights = [PublishedWeights(learner.model) for learner in learners]
    for w, learner in zip(weights, learners):
        w.publish(learner.model, learner.policy_version)
    tb = _summary_writer(cfg, exp_dir, state, derived) if rank.is_main else None
    # From here a signal stops the run cleanly. With several ranks, a rank whose start-up a signal ended (before
    # this line) makes the others fail in _first_worker's collective, before any of them reaches its training loop
    # (where a missing peer would end the run with status "failed").
    signals = _SignalHandler(launcher_ends_on_second_interrupt=spawned_by_node_launcher)
    try:
        group = DeviceGroup(buffer, weights, rank, device, first_worker=_first_worker(cfg, rank, world))
        sampler = _make_sampler(cfg, derived, spaces, group, learners, exp_dir, device_env, world)
        loop = TrainingLoop(
            cfg, derived, learners, buffer, weights, sampler, exp_dir, state, tb, rank, world, heartbeat
        )
    except BaseException:
        signals.restore()
        raise
    signals.attach(loop)
    t0 = time.monotonic()
    summary_path = os.path.join(exp_dir, "summary.json")
    if rank.is_main:
        signals.last_words = lambda: write_json_atomic(
            summary_path, _final_summary(loop, "interrupted", time.monotonic() - t0, exp_dir)
        )
    status, error = _run_loop(loop, sampler, tb)
    summary = None
    _write_books(cfg, rank, exp_dir, loop)
    if rank.is_main:
        summary = _final_summary(loop, status, time.monotonic() - t0, exp_dir)
        summary["error"] = None if error is None else failure_line(error)  # the cause of a failed run, one line
        try:
            write_json_atomic(summary_path, summary)
            signals.last_words = None
        except OSError as e:  # a full disk: the run's own failure (a checkpoint write, say) is what to report
            log.error("summary.json could not be written: %s", e)
            if status != "failed":
                status, error = "failed", e
    # only now: a second Ctrl-C during the teardown above must still exit at once
    signals.restore()
    if error is not None:  # status "failed"
        raise RunFailed(failure_line(error)) from error
    return summary


def _make_sampler(
    cfg: Config,
    derived: Derived,
    spaces: EnvSpaces,
    group: DeviceGroup,
    learners: list[Learner],
    exp_dir: str,
    device_env: bool,
    world: Any,
) -> Sampler:
    """The group's sampler: a device-side env stepped here with the learners' own models (``device_env``); else
    its workers in child processes (or with ``--serial_mode`` in this one); with ``--sampler_port``, and those of
    sampler nodes (:class:`RemoteSampler`, its key in ``--sampler_key_file`` or made in the experiment folder by
    rank 0 before any group reads it: a collective)."""
    if device_env:
        return DeviceSampler(cfg, derived, spaces, group, learners)
    group_cfg = rank_config(cfg, group.rank)
    local: Sampler | None = None
    if group_cfg.num_workers:
        local = (SerialSampler if cfg.serial_mode else ProcessSampler)(cfg, derived, spaces, group)
    if not cfg.sampler_port:
        assert local is not None, "validation: --num_workers=0 needs --sampler_port"
        return local
    key_path = cfg.sampler_key_file or os.path.join(exp_dir, "sampler.key")
    if group.rank.is_main and not os.path.exists(key_path):
        wire.make_key(key_path)
    world.all_gather(torch.zeros(1))  # every group reads the key rank 0 made
    key = wire.read_key(key_path)
    log.info("sampler nodes sign their messages with the key in %s (msf-sampler --sampler_key_file)", key_path)
    shape = wire.shape_hash(env_info_key(cfg), spaces, learners[0].model, cfg)
    try:
        return RemoteSampler(
            local,
            lambda full, stats: SamplerEndpoint(
                group_cfg, derived, spaces, group.buffer, group.weights, key, shape, full, stats,
                group_cfg.num_workers, (group.rank.local_rank, group.rank.nproc_per_node),
            ),
        )  # fmt: skip
    except BaseException:
        if local is not None:
            local.close()
        raise


def _write_books(cfg: Config, rank: RankInfo, exp_dir: str, loop: TrainingLoop) -> None:
    """With ``--sampler_port``, rank R > 0 writes its sampler nodes' books (:meth:`RemoteSampler.sources`) to
    ``sampler_nodes.rankR.json`` (rank 0's are ``summary.json``'s ``sampler_nodes``); a failure is logged."""
    if not cfg.sampler_port or rank.is_main:
        return
    path = os.path.join(exp_dir, f"sampler_nodes.rank{rank.rank}.json")
    try:
        write_json_atomic(path, loop.reporter.sampler_nodes() or {})
    except OSError as e:
        log.error("%s could not be written: %s", path, e)


def _final_summary(loop: TrainingLoop, status: str, wall: float, exp_dir: str) -> dict:
    """``summary.json`` (:func:`msf.runner.reporter.run_summary`) with each policy's health
    (:meth:`~msf.runner.run_health.RunHealth.add_to_summary`) and newest periodic checkpoint (``last_checkpoint``,
    None: none; policy 0's at the top level too)."""
    summary = loop.reporter.summary(status, wall)
    loop.health.add_to_summary(summary, time.monotonic())
    for p, ps in enumerate(summary["policies"].values()):
        ps["last_checkpoint"] = next(map(os.path.abspath, reversed(list_checkpoints(exp_dir, p))), None)
    summary["last_checkpoint"] = summary["policies"]["0"]["last_checkpoint"]
    return summary


def _restore(cfg: Config, learners: list[Learner], exp_dir: str, world: Any) -> TrainState:
    """The run's state from the newest checkpoint of any rank (no shared file system needed: that rank sends it
    to the others), or a fresh one."""
    return TrainState.restore(
        learners,
        exp_dir,
        cfg.restart_behavior == "resume",
        cfg.learning_rate,
        cfg.stats_avg,
        # a Sample Factory 2.1.1 checkpoint is converted first (msf's pass as they are); the policies' models and
        # optimisers are alike, so the first learner's serve as the template of every policy's
        exchange=lambda s: world.newest_state(
            as_msf_checkpoint(s, learners[0].model, learners[0].optimizer, resume=True)
        ),
    )


def _summary_writer(cfg: Config, exp_dir: str, state: TrainState, derived: Derived) -> TensorBoardSummaries:
    """Rank 0's TensorBoard (and W&B) writer, its curves purged past the restored step."""
    return TensorBoardSummaries(
        exp_dir,
        purge_step=state.purge_step(derived.frameskip),
        wandb_cfg=cfg if cfg.with_wandb else None,
        flush_secs=cfg.flush_summaries_interval,
    )


def _make_deterministic(cfg: Config, device: str) -> None:
    """``--deterministic``: deterministic torch kernels (and cuDNN's), and one log line on what the run can
    vouch for."""
    torch.use_deterministic_algorithms(True)
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what cuBLAS needs to be deterministic
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    log.info(
        "--deterministic: synchronous PPO, envs seeded by --seed=%d and their job-wide index, an action generator "
        "per env, one split per inference batch, batches in env order, %d learner thread(s), deterministic torch "
        "kernels: the same command with --seed=%d on this machine gives the same run, as far as the env is "
        "deterministic itself",
        cfg.seed,
        torch.get_num_threads(),
        cfg.seed,
    )


def _budget_spent(cfg: Config, state: TrainState, derived: Derived) -> bool:
    """A resumed run whose checkpoint already holds the whole ``--train_for_env_steps`` budget (logged)."""
    if state.resumed_env_steps is None or state.env_steps * derived.frameskip < cfg.train_for_env_steps:
        return False
    log.info(
        "the budget (--train_for_env_steps=%d) is already spent: nothing to do; the results of the "
        "finished run are kept",
        cfg.train_for_env_steps,
    )
    return True


def _log_start(cfg: Config, group_cfg: Config, rank: RankInfo, device: str, exp_dir: str, device_env: bool) -> None:
    n, workers = cfg.num_envs_per_worker, group_cfg.num_workers
    log.info(
        "msf %s | %s | rank %d/%d | device %s | %s | %s",
        msf.__version__,
        cfg.env,
        rank.rank,
        rank.world_size,
        device,
        f"{n} device-side envs, stepped in this process"
        if device_env
        else f"{workers} rollout worker(s) x {n} envs, {cfg.policy_workers_per_policy} inference worker(s)",
        exp_dir,
    )


def _set_learner_process(cfg: Config, rank: RankInfo) -> None:
    """This process's niceness and torch threads (before the workers are spawned: they inherit the niceness
    and add their offsets)."""
    if cfg.default_niceness != 0:
        why = set_learner_niceness(cfg.default_niceness)
        if why:
            log.warning(why)
    if hasattr(os, "getpriority"):
        log.info("learner runs at niceness %d", os.getpriority(os.PRIO_PROCESS, 0))
    torch.set_num_threads(
        learner_threads(
            cfg.learner_threads,
            cfg.num_workers,
            cfg.policy_workers_per_policy * cfg.num_policies * rank.nproc_per_node,
            rank.nproc_per_node,
            len(usable_cores()),
            synchronous=not cfg.async_rl,
        )
    )
    if cfg.learner_threads != 0:
        how = ""
    elif cfg.async_rl:
        how = ": chosen again from the measured load after 30 s"
    else:
        how = " with --async_rl=False: this replica's share of the cores, as the workers wait while it trains"
    log.info("learner: %d torch thread(s) (--learner_threads=%d%s)", torch.get_num_threads(), cfg.learner_threads, how)


def _make_learners(
    cfg: Config, group_cfg: Config, derived: Derived, spaces: EnvSpaces, device: str, rank: RankInfo
) -> list[Learner]:
    """One learner per policy, each on its own process group over all ranks (one policy: the default group),
    created in the same order on every rank, where its DDP and its learner collectives run."""
    P = cfg.num_policies
    groups = (
        [torch.distributed.new_group(list(range(rank.world_size))) for _ in range(P)]
        if rank.distributed and P > 1
        else [None] * P
    )
    learners = []
    assert cfg.seed is not None, "launch.resolve() sets it"
    for p in range(P):
        torch.manual_seed(cfg.seed + p)  # policies start apart; a policy's replicas start equal (and DDP broadcasts)
        learners.append(Learner(group_cfg, derived, spaces, device, collectives=collectives_of(groups[p])))
    return learners


def _first_worker(cfg: Config, rank: RankInfo, world: Any) -> int:
    """Collective: the job-wide index of this group's rollout worker 0 (each node may run its own --num_workers)."""
    mine = torch.tensor([rank_config(cfg, rank).num_workers], dtype=torch.int64)
    return sum(world.all_gather(mine).flatten().tolist()[: rank.rank])


def _save_after_a_workers_failure(loop: TrainingLoop) -> None:
    """A worker failed (an env's exception, a crash): the learners' state is whole (the failure came through an
    agreement, before that pass trained), so rank 0 writes it as the last checkpoint, and a rerun resumes from
    there instead of from the last periodic checkpoint, up to ``--save_every_sec`` earlier. Not after a failure
    of the learner itself, whose state may be half-updated. A failure to write is logged; the run's own error
    stands."""
    if not loop.learners_intact or loop.iteration == 0:
        return
    try:
        loop.checkpoints.save(wait=True)
        if loop.rank.is_main:
            log.warning("the learners' state at env step %d is saved: a rerun resumes from it", loop.state.env_steps)
    except Exception as e:  # noqa: BLE001
        log.error("writing the checkpoint after the failure failed: %s", e)


def _run_loop(loop: TrainingLoop, sampler: Sampler, tb: TensorBoardSummaries | None) -> tuple[str, Exception | None]:
    """Run the loop, save the final checkpoints, then close the sampler whatever happened.

    Returns:
        the status ("done", "untrained": done before any batch filled, "stopped" or "failed") and, when
        failed, the error.
    """
    error: Exception | None = None
    try:
        status = loop.run()
        sampler.stop()  # the workers close their envs while the final checkpoint is written
        if not loop.untrained():  # a run without an SGD step leaves the checkpoints as they were
            loop.checkpoints.save(wait=True)
    except Exception as e:  # noqa: BLE001 - any failure ends the run with status "failed"
        # one line on the terminal; the whole report (a worker's traceback, or this process's) in log.txt
        log.error("run failed: %s", failure_line(e))
        log.error("run failed: %s", e, exc_info=sampler.logs_tracebacks, extra=LOG_FILE_ONLY)
        status, error = "failed", e
        _save_after_a_workers_failure(loop)
    finally:
        try:
            loop.checkpoints.close()  # a periodic checkpoint still being written completes: nothing is lost
        except Exception as e:  # noqa: BLE001
            log.error("writing a checkpoint failed: %s", e)
            status, error = "failed", error or e
        try:
            sampler.close()
        except Exception as e:  # noqa: BLE001 - the run's own status stands; the envs were all tried
            log.warning("closing the environments failed: %s", e)
        stop_fork_server()  # nothing of the run outlives msf-train's exit
        if tb is not None:
            tb.close()
    if status == "done" and loop.untrained():
        status = "untrained"  # the budget or the time ran out before any batch filled
    return status, error
