"""The experiment folder: ``train_dir/experiment`` and what ``--restart_behavior`` does to it."""

from __future__ import annotations

import os
import shutil
import sys
import time

from msf.cfg.config import Config
from msf.persistence.summaries import write_json_atomic


def experiment_dir(cfg: Config) -> str:
    return os.path.join(cfg.train_dir, cfg.experiment)


def prepare_experiment_dir(cfg: Config) -> str:
    """Create the experiment folder; with ``restart``, move an old one aside to ``NAME_old_<time>``,
    with ``overwrite``, delete it; write ``config.json``. Return the folder."""
    d = experiment_dir(cfg)
    if os.path.isdir(d) and cfg.restart_behavior != "resume":
        if cfg.restart_behavior == "overwrite":
            shutil.rmtree(d)
            print(f"msf-train: --restart_behavior=overwrite: deleted {d}", file=sys.stderr)
        else:
            old = f"{d}_old_{time.strftime('%Y%m%d_%H%M%S')}"
            os.replace(d, old)
            print(f"msf-train: --restart_behavior=restart: moved the old experiment to {old}", file=sys.stderr)
    os.makedirs(d, exist_ok=True)
    write_json_atomic(os.path.join(d, "config.json"), cfg.to_dict())
    return d
