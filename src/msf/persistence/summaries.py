"""What a run shows and leaves: the log file, TensorBoard curves, summary.json, the progress line."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile

log = logging.getLogger("msf")

LOG_FORMAT = "[%(asctime)s][%(processName)s][pid %(process)d] %(levelname)s %(message)s"


def setup_logging(exp_dir: str | None = None, level: int = logging.INFO, rank: int | None = None) -> None:
    """Log to stderr and, with ``exp_dir``, to ``exp_dir/log.txt`` (appended, so resumed runs and several
    ranks share it); with ``rank``, every line carries it."""
    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if exp_dir is not None:
        handlers.append(logging.FileHandler(os.path.join(exp_dir, "log.txt")))
    for h in handlers:
        fmt = LOG_FORMAT if rank is None else LOG_FORMAT.replace("[%(processName)s]", f"[rank {rank}][%(processName)s]")
        h.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
        root.addHandler(h)


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` as indented JSON through a temporary file and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


class TensorBoardSummaries:
    """Scalars under ``exp_dir/tensorboard``, x-axis in env frames (or env steps).

    Args:
        exp_dir: the experiment folder. purge_step: drop events at or after this step (on resume).
    """

    def __init__(self, exp_dir: str, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(exp_dir, "tensorboard"), purge_step=purge_step)

    def add(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            if v is not None:
                self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


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

            self.bar = tqdm(total=total if total and total < 10**10 else None, initial=initial, unit="frame",
                            unit_scale=True, dynamic_ncols=True, file=sys.stderr)
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
        if self.bar is not None:
            self.bar.close()
            self.redirect.__exit__(None, None, None)
            self.bar = None
