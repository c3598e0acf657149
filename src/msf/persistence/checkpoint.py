"""Atomic checkpoints of one policy's training state.

Files are ``checkpoint_p{policy}/checkpoint_{train_step:09d}_{env_steps}.pth``, written to a
temporary file in the same folder and renamed with ``os.replace``, so a crash never
leaves a half-written newest checkpoint. Loading uses ``torch.load(weights_only=True)``:
a checkpoint cannot execute code.
"""

from __future__ import annotations

import glob
import logging
import os
import tempfile

import torch

log = logging.getLogger("msf")


def checkpoint_dir(exp_dir: str, policy: int = 0) -> str:
    return os.path.join(exp_dir, f"checkpoint_p{policy}")


def save_checkpoint(state: dict, exp_dir: str, keep: int, policy: int = 0) -> str:
    """Write ``state`` atomically; delete all but the newest ``keep``; return the path.

    ``state`` must hold ``train_step`` and ``env_steps`` (ints), used in the file name.
    """
    d = checkpoint_dir(exp_dir, policy)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"checkpoint_{state['train_step']:09d}_{state['env_steps']}.pth")
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".pth")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    for old in list_checkpoints(exp_dir, policy)[:-keep]:
        os.unlink(old)
    return path


def list_checkpoints(exp_dir: str, policy: int = 0) -> list[str]:
    """Checkpoint paths, oldest first (by train step, then env steps)."""
    paths = glob.glob(os.path.join(checkpoint_dir(exp_dir, policy), "checkpoint_*.pth"))

    def key(p: str) -> tuple[int, int]:
        parts = os.path.basename(p)[len("checkpoint_"):-len(".pth")].split("_")
        return int(parts[0]), int(parts[1])

    return sorted(paths, key=key)


def load_latest_checkpoint(exp_dir: str, policy: int = 0, map_location: str = "cpu") -> dict | None:
    """The newest readable checkpoint, or None when there is none.

    A corrupt or truncated file is reported in the log and the one before it is tried.
    """
    for path in reversed(list_checkpoints(exp_dir, policy)):
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
            state["path"] = path
            return state
        except Exception as e:  # noqa: BLE001 - any unreadable file: fall back to the previous one
            log.warning("checkpoint %s is unreadable (%s); trying the previous one", path, e)
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
    """

    def __init__(self, exp_dir: str, keep: int):
        import concurrent.futures

        self.exp_dir, self.keep = exp_dir, keep
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending = None

    def submit(self, state: dict) -> None:
        """Write ``snapshot(state)`` (taken now, in the caller's thread) in the background."""
        self.flush()
        self.pending = self.pool.submit(self._write, snapshot(state))

    def _write(self, state: dict) -> None:
        log.info("saved %s", save_checkpoint(state, self.exp_dir, self.keep))

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
