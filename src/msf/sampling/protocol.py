"""The protocol between the processes of one device group: what each worker is given, and every channel.

A worker process is started with one frozen spec (:class:`RolloutWorkerSpec`, :class:`InferenceWorkerSpec`),
built by keyword in :func:`msf.sampling.plan.plan_workers` and read by name in the worker.
The channels, all of them (``W`` rollout workers, ``P`` policies, ``K = policy_workers_per_policy``;
rollout worker ``w`` is served by inference worker ``w % K`` of each policy; RW: rollout worker, IW:
inference worker, loop: the training loop and its learners, in the main process):

================  ====================  ==========================  ==============================================
channel           writer -> reader      payload                     blocking / timeout
================  ====================  ==========================  ==============================================
request pipe      RW ``w`` -> IW        ``bytes([split])``, sent    write: never blocks (a few bytes in the
(duplex, one per  ``w % K`` of policy   once the split's obs are    pipe's buffer); read: ``wait(conns, 0.5 s)``,
``(w, p)``)       ``p``                 in the buffer               then the stop event and the parent pid; a
                                                                    closed pipe ends the IW with an error

reply (same       IW -> RW ``w``        ``bytes(splits)``: the      read: ``wait(conns, 0.5 s)``, stop checked on
pipe)                                   splits of ``w`` it served,  every timeout; no reply for 120 s:
                                        one message per batch       ``TimeoutError``

``full_queue``    every RW -> loop      :class:`FullTrajectories`   put: unbounded, never blocks; get: with the
                                        (worker, slots)             loop's timeout

``free_queues``   loop -> RW ``w``      :class:`SlotsReturned`      put: never blocks; get: only when out of
``[w]``                                 (slots copied out)          slots, 0.5 s at a time (``queue.Empty``:
                                                                    check stop) for as long as the learner holds
                                                                    every slot: this is the back-pressure

``stats_queue``   every RW -> loop      :class:`EpisodeStats`, at   put: never blocks; get: ``get_nowait`` until
                                        most one per 0.25 s per RW  ``queue.Empty``

``failures``      any child -> loop     ``ComponentFailure``        put and flushed, then the child exits 1
                  (``_child_main`` of   (component, pid,            (:mod:`msf.runtime.spawning`); get:
                  ``spawn``)            traceback)                  ``get_nowait``, 1 s more after a child died

``stop_event``    main -> every child   set once                    polled at least every 0.5 s

parent sentinel   (the OS) -> every     the pipe reads as closed    polled with the stop event
                  child                 when the parent dies        (``spawning.parent_alive``)

published         learner -> IWs of     ``state_dict`` tensors and  neither side waits for the other; a reader
weights           its policy            the policy version          retries a torn copy for at most 10 s, then
(seqlock)                                                           ``TimeoutError``

trajectory        RW and IWs -> IWs     tensors written in place    no lock: ownership travels with the messages
buffer            and the learner       (fields below); only slot   (below)
(shared memory)   (``gather``)          and split indices travel
                                        on pipes and queues

shared counters   each worker its own   :class:`InferenceCounters`  unsynchronised adds by their one writer; the
                  -> loop (summaries)   :class:`RolloutCounters`    reader may see a value a few adds old
                                        (float64)
================  ====================  ==========================  ==============================================

The trajectory buffer's fields by writer: the rollout worker writes ``obs``, ``rewards``, ``dones``,
``time_outs``, ``cursors``, ``slot_policy``, and ``rnn_states`` where a slot starts or an episode ends; an
inference worker writes ``actions``, ``log_probs``, ``values``, ``policy_versions`` at a row's cursor
``(slot, t)`` and ``rnn_states`` at ``(slot, t + 1)``, after reading ``obs``, ``rnn_states``, ``cursors``
and ``slot_policy``. Ownership, which is what makes it safe without locks: a split's rows at their cursors
belong to the inference workers of their policies (each writes only its policy's rows) from the request
byte to the reply byte, and to the rollout worker otherwise; a slot belongs to the learner from its
:class:`FullTrajectories` to its :class:`SlotsReturned`. The pipe and queue operations are system calls
on both sides, which order the shared-memory writes before them ahead of the reads after them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol, TypeVar

import numpy as np

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces
from msf.sampling.messages import EpisodeStats, FullTrajectories, InferenceCounters, RolloutCounters, SlotsReturned
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

T_in = TypeVar("T_in", contravariant=True)
T_out = TypeVar("T_out", covariant=True)


class Outbox(Protocol[T_in]):
    """The writing end of a queue: ``multiprocessing`` queues between processes, ``queue.Queue`` in one."""

    def put(self, obj: T_in, /) -> None: ...


class Inbox(Protocol[T_out]):
    """The reading end of a queue. Raises ``queue.Empty`` when nothing came within ``timeout`` seconds."""

    def get(self, block: bool = True, timeout: float | None = None) -> T_out: ...

    def get_nowait(self) -> T_out: ...


class StopSignal(Protocol):
    """Set by the main process to stop: a ``multiprocessing`` event, or a ``threading.Event`` in one process."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class ComponentFailed(RuntimeError):
    """A component of the sampling reported an exception (the message holds its traceback)."""


class Sampler(Protocol):
    """Where a device group's trajectories come from, as its training loop sees it: the workers in child
    processes (:class:`~msf.sampling.process_sampler.ProcessSampler`) or the same graph in this process
    (:class:`~msf.sampling.serial.SerialSampler`).

    Attributes:
        full_queue, free_queues, stats_queue: the loop's ends of those channels (``free_queues[w]``: rollout
            worker ``w``'s). inference_stats, rollout_wait: the workers' counters (inference workers policy-major).
        receive_timeout_s: how long a pass of the loop may wait for an announcement (0: only :meth:`advance` makes
            them). logs_tracebacks: a failure the run ends with is logged with this process's traceback (the
            workers run here: their failures are its own).
    """

    full_queue: Inbox[FullTrajectories]
    free_queues: Sequence[Outbox[SlotsReturned]]
    stats_queue: Inbox[EpisodeStats]
    inference_stats: Sequence[InferenceCounters]
    rollout_wait: Sequence[RolloutCounters]
    receive_timeout_s: float
    logs_tracebacks: bool

    def advance(self) -> object:
        """At the start of every pass of the loop: sample what is this process's to sample, and check on the
        components that sample elsewhere. What it returns, the loop ignores.

        Raises:
            ComponentFailed, msf.runtime.reaping.ChildDied: a component elsewhere failed (the replicas agree on
                it, then stop); anything else: this process's own failure.
        """

    def stop(self) -> None:
        """Tell every component to stop, and return (they close their envs meanwhile)."""

    def close(self) -> None:
        """Stop and end every component, its envs closed; the first failure is raised after all were tried."""

    def sources(self, taken: Mapping[int, int], dropped: Mapping[int, int], rollout: int) -> dict | None:
        """``summary.json``'s ``sampler_nodes``, from the batcher's trajectories taken and dropped by (virtual)
        worker: None when every trajectory is this group's own."""

    def status_note(self, taken: Mapping[int, int], dropped: Mapping[int, int], rollout: int) -> str:
        """What the status line adds about the sampling elsewhere ("" when there is none)."""


class OwnSamples:
    """The :class:`Sampler` methods of a sampler whose trajectories are all its group's own (no sampler node)."""

    def sources(self, taken: Mapping[int, int], dropped: Mapping[int, int], rollout: int) -> None:
        return None

    def status_note(self, taken: Mapping[int, int], dropped: Mapping[int, int], rollout: int) -> str:
        return ""


class EnvSplit(Protocol):
    """The envs of one split of a rollout worker, stepped together (what :func:`msf.envs.vector.make_split`
    returns): ``n`` rows (``n`` envs times their agents).

    Attributes:
        action_space: the gymnasium action space of one agent (with ``low``/``high`` for a ``Box``: actions
            are clipped to them before stepping).
        autoreset_rows: after :meth:`step`, bool ``[n]``: the rows whose step was no transition but a next-step
            autoreset (see :class:`msf.envs.vector.VectorSplit`): their observation is the next episode's first,
            to be written at their cursor, which does not move; their reward, terminated and truncated are 0.
            None when every row made a transition.
    """

    action_space: Any
    autoreset_rows: np.ndarray | None

    def reset(self) -> Sequence[np.ndarray] | np.ndarray:
        """The first observation of every row (seeded)."""
        ...

    def step(self, actions: np.ndarray) -> tuple[Sequence[np.ndarray] | np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every row with ``actions[i]``: (observations, after an episode end the next episode's first;
        rewards ``[n]`` float32; terminated ``[n]`` bool; truncated ``[n]`` bool)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RolloutWorkerSpec:
    """Everything rollout worker ``index`` is given (pickled once, at spawn).

    Attributes:
        cfg, derived: the device group's configuration (``cfg.seed`` seeds the envs and the policy draws).
        index: the worker's index ``w`` in ``[0, cfg.num_workers)``: it owns slots
            ``[w * slots_per_worker, (w + 1) * slots_per_worker)`` and row ``w`` of ``buffer.cursors``.
        buffer: the device group's trajectory buffer.
        conns: one pipe end per policy ``p``, to the inference worker of ``p`` that serves this worker
            (empty when the worker is driven in one process, without pipes).
        full_queue: where finished trajectories are announced.
        free_queue: where the learner returns this worker's slots.
        stats_queue: where finished episodes are reported.
        stop_event: set to stop.
        parent_pid: the process whose death stops the worker (None: no parent to watch, one process).
        counters: the shared counters of its seconds spent waiting (for actions or a free slot) and of its envs
            made so far (start-up progress).
        cores: CPU cores to pin the process to (None: leave it floating).
        first_worker: the job-wide index of this device group's rollout worker 0 (the sum of the rollout
            workers of the ranks before it): the worker's ``env_config`` has ``worker_index = first_worker +
            index`` and ``env_index = worker_index * num_envs_per_worker + i``, unique over the job.
        device_group: the rank of the worker's device group (``env_config["device_group"]``).
    """

    cfg: Config
    derived: Derived
    index: int
    buffer: TrajectoryBuffer
    conns: Sequence[Connection]
    full_queue: Outbox[FullTrajectories]
    free_queue: Inbox[SlotsReturned]
    stats_queue: Outbox[EpisodeStats]
    stop_event: StopSignal
    parent_pid: int | None
    counters: RolloutCounters
    cores: list[int] | None = None
    first_worker: int = 0
    device_group: int = 0


@dataclass(frozen=True)
class InferenceWorkerSpec:
    """Everything an inference worker is given (pickled once, at spawn).

    Attributes:
        cfg, derived, spaces: the device group's configuration and the env's spaces (for the model).
        buffer: the device group's trajectory buffer.
        policy: the policy it serves: it acts for the rows whose slot is this policy's
            (``buffer.slot_policy``) and leaves the other rows of a split to their policies' workers.
        conns: ``{rollout worker index: pipe end}`` of the rollout workers it serves (empty when driven in
            one process).
        weights: where the learner of ``policy`` publishes its weights.
        device: torch device of the forward pass (``"cpu"``, ``"cuda:0"``).
        stop_event: set to stop.
        parent_pid: the process whose death stops the worker (None: no parent to watch, one process).
        counters: the shared counters it adds its batches, samples and waiting seconds to.
        first_worker: the job-wide index of the device group's rollout worker 0 (with ``--deterministic``, each
            row's action generator is seeded by its job-wide index).
    """

    cfg: Config
    derived: Derived
    spaces: EnvSpaces
    buffer: TrajectoryBuffer
    policy: int
    conns: Mapping[int, Connection]
    weights: PublishedWeights
    device: str
    stop_event: StopSignal
    parent_pid: int | None
    counters: InferenceCounters
    first_worker: int = 0
