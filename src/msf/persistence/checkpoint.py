"""Atomic checkpoints of one policy's training state.

In ``checkpoint_p{policy}/``:

* ``checkpoint_{train_step:09d}_{env_steps}.pth``: the newest ``--keep_checkpoints``;
* ``best_{train_step:09d}_{env_steps}_{metric}_{value}.pth``: the one with the best
  ``--save_best_metric`` so far (one file, replaced when beaten);
* ``milestones/checkpoint_*.pth``: one every ``--save_milestones_sec``, never deleted.

Every file is written to a temporary file in the same folder, flushed to disk and renamed
with ``os.replace``, so a crash never leaves a half-written newest checkpoint; a write that fails (a full
disk) removes its temporary file and raises :class:`CheckpointWriteFailed`, which names the file, the free
space and the newest checkpoint kept.

Loading is one path for every command (training's resume, ``msf-enjoy``, ``msf-export``):
:func:`load_latest_checkpoint` reads the folder from the newest file back (``torch.load(weights_only=True)``: a
pickled object could run code), the caller converts a Sample Factory checkpoint
(:func:`msf.persistence.sf2_checkpoint.as_msf_checkpoint`) and loads it with :func:`load_into`. Every refusal
(no file, none readable, a pickled object, non-finite values, a model that does not fit, a Sample Factory one
that cannot be converted) is a :class:`CheckpointError` of one line. Loading never moves a file: only
``msf-train`` sets an unreadable one aside (:func:`set_aside`), before it spawns anything.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import pickle
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import torch

from msf.persistence.summaries import file_mode

log = logging.getLogger("msf")


def checkpoint_dir(exp_dir: str, policy: int = 0) -> str:
    return os.path.join(exp_dir, f"checkpoint_p{policy}")


def _temp_file(path: str) -> tuple[int, str]:
    """A new temporary file beside ``path``: ``(fd, its path)``. (The tests replace it to make writes fail.)"""
    return tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".pth")


def _atomic_write(path: str, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, rename it to ``path``.

    Raises:
        CheckpointWriteFailed: the file could not be written (the temporary file is gone, ``path`` untouched).
    """
    tmp = None
    try:
        fd, tmp = _temp_file(path)
        os.fchmod(fd, file_mode())  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, Exception) and not isinstance(e, CheckpointWriteFailed):
            raise CheckpointWriteFailed(path, e) from e
        raise


def _disk_full(e: BaseException | None) -> bool:
    """Whether a failed write ran out of space. torch.save reports a short write not as ENOSPC but as
    ``[enforce fail at inline_container.cc:...] . unexpected pos N vs M`` (its zip writer's own check on the
    bytes written), so that text counts too."""
    seen = set()
    while e is not None and id(e) not in seen:  # the error and those it was raised from
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "unexpected pos" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


class CheckpointWriteFailed(OSError):
    """A checkpoint could not be written. The message is one line: the file, why (``the disk is full`` when it
    is), the free space on its file system, and the newest checkpoint of its folder, which is kept as it was.

    Attributes:
        path: the file that was being written. cause: the original error. disk_full: whether it ran out of
            space. free_bytes: free space on the file system of ``path`` after the failure (None: unknown).
        kept: the newest checkpoint of the same kind in that folder (None: there is none).
    """

    def __init__(self, path: str, cause: BaseException):
        self.path, self.cause, self.disk_full = path, cause, _disk_full(cause)
        folder = os.path.dirname(path)
        try:
            st = os.statvfs(folder)
            self.free_bytes: int | None = st.f_bavail * st.f_frsize
        except OSError:
            self.free_bytes = None
        prefix = "best_" if os.path.basename(path).startswith("best_") else "checkpoint_"
        others = sorted(
            (p for p in glob.glob(os.path.join(folder, f"{prefix}*.pth")) if p != path), key=os.path.getmtime
        )
        self.kept = others[-1] if others else None
        why = "the disk is full" if self.disk_full else unreadable_reason(cause)
        free = "unknown" if self.free_bytes is None else _mib(self.free_bytes)
        kept = (
            f"the checkpoints already there are kept (newest: {self.kept})"
            if self.kept
            else "there is no earlier checkpoint in that folder"
        )
        super().__init__(
            f"could not write the checkpoint {path}: {why} ({free} free there); no partial file was left, and {kept}"
        )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def save_checkpoint(
    state: dict, exp_dir: str, keep: int, policy: int = 0, milestone: bool = False, spared: frozenset[str] = frozenset()
) -> str:
    """Write ``state`` atomically; delete all but the newest ``keep`` (the files in ``spared``, Sample Factory's, are
    neither counted nor deleted); return the path.

    ``state`` must hold ``train_step`` and ``env_steps`` (ints), used in the file name. With
    ``milestone``, a copy also goes to ``milestones/``, where nothing is ever deleted.
    """
    d = checkpoint_dir(exp_dir, policy)
    os.makedirs(d, exist_ok=True)
    name = f"checkpoint_{state['train_step']:09d}_{state['env_steps']}.pth"
    path = os.path.join(d, name)
    _atomic_write(path, lambda f: torch.save(state, f))
    if milestone and os.path.join(d, "milestones", name) not in spared:
        os.makedirs(os.path.join(d, "milestones"), exist_ok=True)
        with open(path, "rb") as src:
            _atomic_write(os.path.join(d, "milestones", name), lambda f: shutil.copyfileobj(src, f))
    for old in [p for p in list_checkpoints(exp_dir, policy) if p not in spared][:-keep]:
        os.unlink(old)
    return path


def save_best_checkpoint(
    state: dict, exp_dir: str, metric: str, value: float, policy: int = 0, spared: frozenset[str] = frozenset()
) -> str:
    """Write ``state`` as the best checkpoint (``value`` of ``metric``), replacing the previous best (not one in
    ``spared``)."""
    d = checkpoint_dir(exp_dir, policy)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"best_{state['train_step']:09d}_{state['env_steps']}_{metric}_{value:.3f}.pth")
    _atomic_write(path, lambda f: torch.save(state, f))
    for old in list_checkpoints(exp_dir, policy, kind="best"):
        if old != path and old not in spared:
            os.unlink(old)
    return path


def best_on_disk(exp_dir: str, metric: str, policy: int = 0) -> float | None:
    """The value of ``metric`` that policy ``policy``'s best checkpoint file in ``exp_dir`` was written for
    (read from its name, ``best_{train_step}_{env_steps}_{metric}_{value}.pth``, rounded to 3 decimals; the largest
    if there are several), or None when no best file of that metric is there. A rerun in the same folder keeps it
    as the value to beat, so that an earlier attempt's best is never replaced by a worse one."""
    values = []
    for path in list_checkpoints(exp_dir, policy, kind="best"):
        parts = os.path.basename(path)[len("best_") : -len(".pth")].split("_")
        if "_".join(parts[2:-1]) != metric:
            continue
        try:
            values.append(float(parts[-1]))
        except ValueError:
            continue
    return max(values, default=None)


def list_checkpoints(exp_dir: str, policy: int = 0, kind: str = "latest") -> list[str]:
    """Checkpoint paths, oldest first (by train step, then env steps).

    ``kind``: ``latest`` (the periodic ones), ``best`` or ``milestones``.
    """
    d = checkpoint_dir(exp_dir, policy)
    prefix = "best_" if kind == "best" else "checkpoint_"
    folder = os.path.join(d, "milestones") if kind == "milestones" else d
    paths = glob.glob(os.path.join(folder, f"{prefix}*.pth"))

    def key(p: str) -> tuple[int, int]:
        parts = os.path.basename(p)[len(prefix) : -len(".pth")].split("_")
        return int(parts[0]), int(parts[1])

    return sorted(paths, key=key)


def load_checkpoint_file(path: str, map_location: str = "cpu") -> dict:
    """Load one checkpoint file safely; ``path`` is added to the dict.

    Raises:
        CheckpointRefused: the file holds a pickled object other than tensors and plain data.
        CheckpointError: its model holds non-finite values (a run that diverged).
        Exception: any error of a corrupt or truncated file (``RuntimeError``, ``EOFError``, ...).
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's weights-only unpickler raises this both for a pickled object (an "Unsupported global", which
        # could run code) and for bytes that are no pickle at all (a corrupt file): only the first is refused
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if found is None:
            detail = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n|$)", str(e))
            raise pickle.UnpicklingError(
                f"not a checkpoint of tensors and plain data ({detail[1] if detail else 'corrupt'})"
            ) from None
        raise CheckpointRefused(
            f"{path} holds an object ({found[1]}) other than tensors and plain data, which could run code "
            "when loaded; refused"
        ) from None
    model = state.get("model") or {}
    bad = [k for k, t in model.items() if torch.is_tensor(t) and t.is_floating_point() and not t.isfinite().all()]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise CheckpointError(f"{path} holds non-finite values (in {bad[0]}{more})")
    state["path"] = path
    return state


class CheckpointError(RuntimeError):
    """A checkpoint msf cannot use; the message is one line that names the file or folder and why."""


class CheckpointRefused(CheckpointError):
    """A checkpoint would need to unpickle arbitrary objects (which can execute code)."""


class NoReadableCheckpoint(CheckpointError):
    """Checkpoint files exist, and none of them can be read (the message names each, with its reason)."""

    def __init__(self, folder: str, unreadable: list[tuple[str, str]]):
        self.folder, self.unreadable = folder, unreadable
        files = "; ".join(f"{path} ({reason})" for path, reason in unreadable)
        super().__init__(f"no checkpoint in {folder} is readable: {files}")


def unreadable_reason(e: BaseException) -> str:
    """Why a file could not be read or written, in one line: the error's type and the first sentence of its
    message (torch's run on for lines of advice after it), or what an error without a message means (an empty
    file makes torch.load raise a bare ``EOFError``)."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "").split(". ")[0]
    if not first and isinstance(e, EOFError):
        first = "the file is empty or cut short"
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@dataclass
class CheckpointScan:
    """What :func:`scan_checkpoints` found in a checkpoint folder.

    Attributes:
        state: the newest readable checkpoint (None: none is readable, or there is no file).
        unreadable: ``(path, reason)`` of each file newer than ``state`` that could not be read, newest first
            (all the files when ``state`` is None).
    """

    state: dict | None = None
    unreadable: list[tuple[str, str]] = field(default_factory=list)


def scan_checkpoints(exp_dir: str, policy: int = 0, kind: str = "latest", map_location: str = "cpu") -> CheckpointScan:
    """Read the checkpoints of ``kind`` (``latest`` or ``best``) from the newest back, until one loads; moves
    and logs nothing."""
    scan = CheckpointScan()
    for path in reversed(list_checkpoints(exp_dir, policy, kind)):
        try:
            scan.state = load_checkpoint_file(path, map_location)
            return scan
        except Exception as e:  # noqa: BLE001 - any unreadable file: fall back to the previous one
            scan.unreadable.append((path, unreadable_reason(e)))
    return scan


def _log_unreadable(path: str, reason: str, used: str) -> None:
    log.warning("checkpoint %s is unreadable (%s); loaded the previous one, %s", path, reason, used)


def load_latest_checkpoint(
    exp_dir: str,
    policy: int = 0,
    map_location: str = "cpu",
    kind: str = "latest",
    required: bool = False,
    on_unreadable: Callable[[str, str, str], None] = _log_unreadable,
) -> dict | None:
    """The newest readable checkpoint of ``kind`` (``latest`` or ``best``) of policy ``policy``, or None when there
    is no file (``required``: refused).

    A corrupt, truncated, refused or non-finite newer file is passed to ``on_unreadable(path, reason, used)``
    (default: a warning in the log) and the one before it is used; the file stays where it is (``msf-train`` sets
    such files aside before it spawns anything: :func:`msf.runner.experiment.check_checkpoints`).

    Raises:
        NoReadableCheckpoint: there are checkpoint files, and none is readable.
        CheckpointError: ``required`` and there is no checkpoint file of ``kind``.
    """
    scan = scan_checkpoints(exp_dir, policy, kind, map_location)
    if scan.state is None:
        if scan.unreadable:
            raise NoReadableCheckpoint(checkpoint_dir(exp_dir, policy), scan.unreadable)
        if required:
            raise CheckpointError(f"no readable {kind} checkpoint in {checkpoint_dir(exp_dir, policy)}")
        return None
    for path, reason in scan.unreadable:
        on_unreadable(path, reason, scan.state["path"])
    return scan.state


def load_into(state: dict, load: Callable[[dict], object]) -> None:
    """``load(state)`` (a learner's ``load_state_dict``, or a model's on ``state["model"]``), with torch's refusal of
    a checkpoint that does not fit (missing or unexpected tensors, other shapes) as a :class:`CheckpointError`.

    Raises:
        CheckpointError: it does not fit (naming the file and torch's first mismatch).
    """
    try:
        load(state)
    except RuntimeError as e:
        if isinstance(e, CheckpointError):
            raise
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        first = " ".join(lines[:2])  # torch's first line only announces the list of mismatches
        raise CheckpointError(f"the checkpoint {state.get('path')} does not fit the model ({first})") from None


def set_aside(path: str) -> str | None:
    """Rename an unreadable checkpoint to ``*.pth.bad``: kept for inspection, out of the rotation (whose keep-N
    would otherwise delete a good, older file in favour of it). Returns the new path (None: it could not be
    moved, a read-only folder)."""
    try:
        os.replace(path, path + ".bad")
    except OSError:
        return None
    return path + ".bad"


def snapshot(obj):
    """A deep copy of a state (nested dicts and lists) with every tensor cloned to the CPU, so that
    training can go on while the copy is written."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    return obj


class BackgroundCheckpointWriter:
    """Writes checkpoints in one background thread, so that file I/O never holds up the collectives
    the other replicas wait in. At most one write is in flight; a failed write is raised at the next
    :meth:`submit` or at :meth:`flush`.

    Args:
        exp_dir: the experiment folder. keep: how many newest checkpoints to keep.
        metric: the name of the best-checkpoint metric, for the file name. policy: whose checkpoints
            (``checkpoint_p{policy}/``). spared: files of that folder never replaced, counted or deleted (Sample
            Factory's: :func:`msf.persistence.sf2_checkpoint.sf2_files`); a checkpoint of the same name (the same
            train step and env steps: nothing was learnt since) is not written.
    """

    def __init__(
        self, exp_dir: str, keep: int, metric: str = "reward", policy: int = 0, spared: frozenset[str] = frozenset()
    ):
        import concurrent.futures

        self.exp_dir, self.keep, self.metric, self.policy, self.spared = exp_dir, keep, metric, policy, spared
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending: concurrent.futures.Future[None] | None = None

    def submit(self, state: dict, milestone: bool = False, best: float | None = None) -> None:
        """Write ``snapshot(state)`` (taken now, in the caller's thread) in the background: a periodic
        checkpoint (``milestone``: also kept in ``milestones/``) or, with ``best``, the best one."""
        self.flush()
        self.pending = self.pool.submit(self._write, snapshot(state), milestone, best)

    def _write(self, state: dict, milestone: bool, best: float | None) -> None:
        stem = f"{state['train_step']:09d}_{state['env_steps']}"
        name = f"best_{stem}_{self.metric}_{best:.3f}.pth" if best is not None else f"checkpoint_{stem}.pth"
        if (path := os.path.join(checkpoint_dir(self.exp_dir, self.policy), name)) in self.spared:
            log.info("not written: %s is Sample Factory's, of the same step, and stays as it is", path)
        elif best is not None:
            path = save_best_checkpoint(state, self.exp_dir, self.metric, best, self.policy, self.spared)
            log.info("saved the best checkpoint so far (%s %.3f): %s", self.metric, best, path)
        else:
            path = save_checkpoint(state, self.exp_dir, self.keep, self.policy, milestone, self.spared)
            log.info("saved %s%s", path, " (and a milestone copy)" if milestone else "")

    def flush(self) -> None:
        """Wait for the write in flight; raise its error, if any."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.pool.shutdown(wait=True)
