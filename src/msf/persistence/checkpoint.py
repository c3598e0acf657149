"""Atomic checkpoints of one policy's training state.

In ``checkpoint_p{policy}/``:

* ``checkpoint_{train_step:09d}_{env_steps}.pth``: the newest ``--keep_checkpoints``;
* ``best_{train_step:09d}_{env_steps}_{metric}_{value}.pth``: the one with the best
  ``--save_best_metric`` so far (one file, replaced when beaten);
* ``milestones/checkpoint_*.pth``: one every ``--save_milestones_sec``, never deleted.

Every file is written to a temporary file in the same folder, flushed to disk and renamed
with ``os.replace``, so a crash never leaves a half-written newest checkpoint. Loading uses
``torch.load(weights_only=True)``: a checkpoint holding anything but tensors and plain data
(a pickled object could run code) is refused.
"""

from __future__ import annotations

import glob
import logging
import os
import pickle
import shutil
import tempfile

import torch

log = logging.getLogger("msf")


def checkpoint_dir(exp_dir: str, policy: int = 0) -> str:
    return os.path.join(exp_dir, f"checkpoint_p{policy}")


def _atomic_write(path: str, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, rename it to ``path``."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".pth")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(state: dict, exp_dir: str, keep: int, policy: int = 0, milestone: bool = False) -> str:
    """Write ``state`` atomically; delete all but the newest ``keep``; return the path.

    ``state`` must hold ``train_step`` and ``env_steps`` (ints), used in the file name. With
    ``milestone``, a copy also goes to ``milestones/``, where nothing is ever deleted.
    """
    d = checkpoint_dir(exp_dir, policy)
    os.makedirs(d, exist_ok=True)
    name = f"checkpoint_{state['train_step']:09d}_{state['env_steps']}.pth"
    path = os.path.join(d, name)
    _atomic_write(path, lambda f: torch.save(state, f))
    if milestone:
        os.makedirs(os.path.join(d, "milestones"), exist_ok=True)
        with open(path, "rb") as src:
            _atomic_write(os.path.join(d, "milestones", name), lambda f: shutil.copyfileobj(src, f))
    for old in list_checkpoints(exp_dir, policy)[:-keep]:
        os.unlink(old)
    return path


def save_best_checkpoint(state: dict, exp_dir: str, metric: str, value: float, policy: int = 0) -> str:
    """Write ``state`` as the best checkpoint (``value`` of ``metric``), replacing the previous best."""
    d = checkpoint_dir(exp_dir, policy)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"best_{state['train_step']:09d}_{state['env_steps']}_{metric}_{value:.3f}.pth")
    _atomic_write(path, lambda f: torch.save(state, f))
    for old in list_checkpoints(exp_dir, policy, kind="best"):
        if old != path:
            os.unlink(old)
    return path


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
    """Load one checkpoint file safely.

    Raises:
        CheckpointRefused: the file holds a pickled object other than tensors and plain data.
        Exception: any error of a corrupt or truncated file (``RuntimeError``, ``EOFError``, ...).
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointRefused(
            f"{path} holds objects other than tensors and plain data, which could run code "
            f"when loaded; refused ({str(e).splitlines()[0]})"
        ) from None
    state["path"] = path
    return state


class CheckpointRefused(RuntimeError):
    """A checkpoint would need to unpickle arbitrary objects (which can execute code)."""


def load_latest_checkpoint(
    exp_dir: str, policy: int = 0, map_location: str = "cpu", kind: str = "latest"
) -> dict | None:
    """The newest readable checkpoint of ``kind`` (``latest`` or ``best``), or None when there is none.

    A corrupt, truncated or refused file is reported in the log, renamed to ``*.pth.bad`` (kept for
    inspection, out of the rotation, so that the next checkpoints never delete the good one in its
    favour), and the one before it is tried.
    """
    for path in reversed(list_checkpoints(exp_dir, policy, kind)):
        try:
            return load_checkpoint_file(path, map_location)
        except Exception as e:  # noqa: BLE001 - any unreadable file: fall back to the previous one
            log.warning("checkpoint %s is unreadable (%s); trying the previous one", path, e)
            try:
                os.replace(path, path + ".bad")
            except OSError:
                pass  # another rank of this node moved it already, or a read-only folder
    return None


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
            (``checkpoint_p{policy}/``).
    """

    def __init__(self, exp_dir: str, keep: int, metric: str = "reward", policy: int = 0):
        import concurrent.futures

        self.exp_dir, self.keep, self.metric, self.policy = exp_dir, keep, metric, policy
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending = None

    def submit(self, state: dict, milestone: bool = False, best: float | None = None) -> None:
        """Write ``snapshot(state)`` (taken now, in the caller's thread) in the background: a periodic
        checkpoint (``milestone``: also kept in ``milestones/``) or, with ``best``, the best one."""
        self.flush()
        self.pending = self.pool.submit(self._write, snapshot(state), milestone, best)

    def _write(self, state: dict, milestone: bool, best: float | None) -> None:
        if best is not None:
            log.info(
                "saved the best checkpoint so far (%s %.3f): %s",
                self.metric,
                best,
                save_best_checkpoint(state, self.exp_dir, self.metric, best, policy=self.policy),
            )
        else:
            log.info(
                "saved %s%s",
                save_checkpoint(state, self.exp_dir, self.keep, policy=self.policy, milestone=milestone),
                " (and a milestone copy)" if milestone else "",
            )

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
