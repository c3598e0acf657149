"""What a run shows and leaves: the log file, TensorBoard curves, summary.json, the progress line."""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import tempfile
import uuid

from msf import LOG_DATEFMT

log = logging.getLogger("msf")

LOG_FORMAT = "[%(asctime)s][%(processName)s][pid %(process)d] %(levelname)s %(message)s"

# ``log.error(..., extra=LOG_FILE_ONLY)``: the line goes to log.txt, not to stderr (a traceback that the
# terminal gets as one line of its own)
LOG_FILE_ONLY = {"log_file_only": True}


def setup_logging(
    exp_dir: str | None = None, level: int = logging.INFO, rank: int | None = None, to_file: bool = True
) -> None:
    """Log to stderr and, with ``exp_dir`` and ``to_file`` (``--log_to_file``), to ``exp_dir/log.txt`` (appended,
    so resumed runs and several ranks share it); with ``rank``, every line carries it. Lines meant for the file only
    (:data:`LOG_FILE_ONLY`: what the terminal got in a shorter form) never go to stderr."""
    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    handlers[0].addFilter(lambda record: not getattr(record, "log_file_only", False))
    if to_file and exp_dir is not None:
        handlers.append(_LogFile(os.path.join(exp_dir, "log.txt")))
    for h in handlers:
        fmt = LOG_FORMAT if rank is None else LOG_FORMAT.replace("[%(processName)s]", f"[rank {rank}][%(processName)s]")
        h.setFormatter(logging.Formatter(fmt, datefmt=LOG_DATEFMT))
        root.addHandler(h)


class _LogFile(logging.FileHandler):
    """``log.txt``. When a line cannot be written (a full disk), logging's default prints a traceback to stderr for
    that line and each one after; here one line says so, and the file is left alone from then on (the terminal
    still gets every line)."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        e = sys.exc_info()[1]
        if not isinstance(e, OSError):  # a bad log call, not the file: logging's own report
            super().handleError(record)
            return
        self.failed = True
        print(
            f"msf: warning: {self.baseFilename} can no longer be written ({e}); logging to stderr only", file=sys.stderr
        )


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import (no other thread creates files yet)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def file_mode() -> int:
    """The mode ``open()`` gives a new file here: 0o666 less the process's umask (read at import)."""
    return 0o666 & ~_UMASK


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` as indented JSON through a temporary file and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-", suffix=".json")
    try:
        os.fchmod(fd, file_mode())  # mkstemp's 0600 would make config.json readable by its owner only
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):  # a full disk: no half-written temporary file is left behind
            os.unlink(tmp)
        raise


class TensorBoardSummaries:
    """Scalars under ``exp_dir/tensorboard``, x-axis in env frames (or env steps); with ``--with_wandb``
    the same scalars also go to Weights & Biases, against the metric ``global_step``.

    Args:
        exp_dir: the experiment folder. purge_step: drop events at or after this step (on resume),
            so that the curves of a resumed run have no overlap with those of the run that died.
        wandb_cfg: the run's config when ``with_wandb`` is on, else None. flush_secs: seconds at most between
            writes of the event file (``--flush_summaries_interval``).
    """

    def __init__(self, exp_dir: str, purge_step: int | None = None, wandb_cfg=None, flush_secs: int = 30):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(exp_dir, "tensorboard"), purge_step=purge_step, flush_secs=flush_secs)
        self.wandb = _init_wandb(wandb_cfg, exp_dir) if wandb_cfg is not None else None

    def add(self, scalars: dict[str, float | None], step: int) -> None:
        for k, v in scalars.items():
            if v is not None:
                self.writer.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({"global_step": step, **{k: v for k, v in scalars.items() if v is not None}})

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _init_wandb(cfg, exp_dir: str):
    """Start (or, on resume, continue) the experiment's Weights & Biases run. Its id is kept in
    ``exp_dir/wandb_id.txt``, so a resumed experiment appends to the same run. ``WANDB_MODE=offline``
    writes it under ``exp_dir/wandb`` for a later ``wandb sync``."""
    import wandb

    id_path = os.path.join(exp_dir, "wandb_id.txt")
    if os.path.exists(id_path):
        run_id = open(id_path).read().strip()
    else:
        run_id = uuid.uuid4().hex[:12]
        with open(id_path, "w") as f:
            f.write(run_id + "\n")
    run = wandb.init(
        project=cfg.wandb_project,
        entity=cfg.wandb_user,
        group=cfg.wandb_group or cfg.env,
        job_type=cfg.wandb_job_type,
        tags=list(cfg.wandb_tags) or None,
        name=cfg.experiment,
        id=run_id,
        resume="allow",
        dir=exp_dir,
        config=cfg.to_dict(),
    )
    run.define_metric("global_step")
    run.define_metric("*", step_metric="global_step")
    return run


class Progress:
    """A tqdm bar on a terminal (log lines are printed above it, not glued to it). Without a
    terminal it shows nothing: the status line logged every ``experiment_summaries_interval``
    seconds says the same.

    Args:
        total: the step budget (None or huge: no known end). enabled: False disables the bar.
    """

    def __init__(self, total: int | None, enabled: bool, initial: int = 0):
        self.bar = None
        self.redirect = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(
                total=total if total and total < 10**10 else None,
                initial=initial,
                unit="frame",
                unit_scale=True,
                dynamic_ncols=True,
                file=sys.stderr,
            )
            self.n = initial
            self.redirect = logging_redirect_tqdm()
            self.redirect.__enter__()

    def update(self, count: int, fields: dict[str, str]) -> None:
        """Move to ``count`` (env frames) and show ``fields``."""
        if self.bar is not None:
            self.bar.update(count - self.n)
            self.n = count
            self.bar.set_postfix(fields, refresh=False)

    def close(self) -> None:
        if self.bar is not None and self.redirect is not None:  # both set, or neither
            self.bar.close()
            self.redirect.__exit__(None, None, None)
            self.bar = None


class RecentRate:
    """Count per second over about the last ``window`` seconds, for a count that grows in jumps.

    The training loop counts env steps when the learner takes an iteration's trajectories, so the count
    rises in jumps of one iteration, and status lines come right after a jump: the count gained since "now
    minus 10 s" would hold one jump too many. This measures instead from the newest jump that is at least
    ``window`` seconds old, so the span holds whole iterations; after a stall of more than ``window`` seconds
    the rate is 0.

    Args:
        t0: the start (seconds, a monotonic clock). count0: the count at ``t0``. window: seconds.
    """

    def __init__(self, t0: float, count0: int, window: float = 10.0):
        self.window = window
        self.points: collections.deque[tuple[float, int]] = collections.deque([(t0, count0)])

    def _prune(self, now: float) -> None:
        while len(self.points) > 1 and now - self.points[1][0] >= self.window:
            self.points.popleft()

    def note(self, t: float, count: int) -> None:
        """The count changed to ``count`` at time ``t``."""
        if count != self.points[-1][1]:
            self.points.append((t, count))
            self._prune(t)

    def rate(self, now: float, count: int) -> float:
        """Count gained per second from the oldest kept point to ``now`` (0 when no time has passed)."""
        self._prune(now)
        t0, c0 = self.points[0]
        return (count - c0) / (now - t0) if now > t0 else 0.0
