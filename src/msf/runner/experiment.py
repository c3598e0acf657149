"""The experiment folder: ``train_dir/experiment``, what ``--restart_behavior`` does to it, and the
config a resumed experiment runs with."""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time

from msf.cfg.arguments import EVALUATION_FLAGS
from msf.cfg.config import LAUNCH_FLAGS, Config, fixed_for, merge_env_args
from msf.cfg.validation import ConfigError
from msf.persistence.checkpoint import NoReadableCheckpoint, load_latest_checkpoint, set_aside
from msf.persistence.sf2_checkpoint import (
    MSF_CONFIG,
    Sf2Refused,
    as_msf_checkpoint,
    config_file,
    config_file_to_write,
    is_sf2_checkpoint,
    is_sf2_folder,
    msf_config_dict,
)
from msf.persistence.summaries import write_json_atomic


def experiment_dir(cfg: Config) -> str:
    return os.path.join(cfg.train_dir, cfg.experiment)


def prepare_experiment_dir(cfg: Config) -> str:
    """Create the experiment folder; with ``restart``, move an old one aside to ``NAME_old_<time>``,
    with ``overwrite``, delete it; write ``config.json`` (``msf_config.json`` beside a Sample Factory one, which
    stays as it is). Return the folder."""
    d = experiment_dir(cfg)
    if os.path.isdir(d) and cfg.restart_behavior != "resume":
        if cfg.restart_behavior == "overwrite":
            shutil.rmtree(d)
            print(f"msf-train: --restart_behavior=overwrite: deleted {d}", file=sys.stderr)
        else:
            t = time.strftime("%Y%m%d_%H%M%S")
            old, n = f"{d}_old_{t}", 1
            while os.path.exists(old):  # a restart within the same second: _2, _3, ...
                n += 1
                old = f"{d}_old_{t}_{n}"
            os.replace(d, old)
            print(f"msf-train: --restart_behavior=restart: moved the old experiment to {old}", file=sys.stderr)
    os.makedirs(d, exist_ok=True)
    write_json_atomic(config_file_to_write(d), cfg.to_dict())
    return d


def wait_for_experiment_dir(cfg: Config, recent_s: float = 10.0) -> str:
    """For the other ranks of a node whose local rank 0 prepares the folder (one process per rank, as
    under torchrun): wait until it has written ``config.json`` anew, at most ``--dist_timeout`` seconds.

    Raises:
        RuntimeError: it did not appear in time.
    """
    d = experiment_dir(cfg)
    paths = [os.path.join(d, "config.json"), os.path.join(d, MSF_CONFIG)]  # the second in a Sample Factory folder
    start = time.time()
    while time.time() - start < cfg.dist_timeout:
        if any(os.path.exists(p) and os.path.getmtime(p) >= start - recent_s for p in paths):
            return d
        time.sleep(0.1)
    raise RuntimeError(
        f"the experiment folder {d} was not prepared by this node's local rank 0 within "
        f"--dist_timeout={cfg.dist_timeout} s"
    )


def resume_config(cfg: Config, given: set[str]) -> tuple[Config, list[str]]:
    """The config a resumed experiment runs with: its saved ``config.json``, with the flags given on
    this command line (``given``) on top, and the launch flags (:data:`msf.cfg.config.LAUNCH_FLAGS`) from
    this command line. Without ``--restart_behavior=resume`` or without a saved config, ``cfg`` as it is.

    Returns:
        ``(config, changes)``: ``changes`` lists each given flag whose value differs from the saved one,
        as ``"--name: old -> new"``.

    Raises:
        ConfigError: a flag of :data:`msf.cfg.config.FIXED_FLAGS` differs from the saved experiment's; the saved
            config is missing beside checkpoints, or unreadable, or is a Sample Factory one that msf cannot map.
    """
    path = config_file(experiment_dir(cfg))  # a Sample Factory folder: its config.json converted, or msf's own
    if cfg.restart_behavior != "resume" or not os.path.exists(path):
        if cfg.restart_behavior == "resume" and glob.glob(os.path.join(experiment_dir(cfg), "checkpoint_p*", "*.pth")):
            raise ConfigError(
                f"--experiment: {path} is missing, and the checkpoints in {experiment_dir(cfg)} need the flags it held "
                "to load; put it back, or use --restart_behavior=restart to start anew"
            )
        return cfg, []
    try:
        with open(path) as f:
            saved = Config.from_dict(msf_config_dict(json.load(f), path, Config, EVALUATION_FLAGS)).to_dict()
    except Sf2Refused as e:
        raise ConfigError(str(e)) from None
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(
            f"--experiment: the saved config {path} is unreadable ({e}); use --restart_behavior=restart to start anew"
        ) from None
    current = cfg.to_dict()
    saved["env_args"], changes = merge_env_args(saved.get("env_args") or {}, current["env_args"], given)
    for name in sorted(given - LAUNCH_FLAGS):
        if name not in saved:  # env_args:NAME (merged above)
            continue
        if saved[name] == current[name]:
            continue
        if fixed_for(name, str(saved["env"])):
            raise ConfigError(
                f"--{name}: cannot change for the existing experiment {cfg.experiment!r} "
                f"(it has {saved[name]!r}, given {current[name]!r}); use --restart_behavior=restart "
                "to start it anew, or another --experiment"
            )
        changes.append(f"--{name}: {saved[name]!r} -> {current[name]!r}")
        saved[name] = current[name]
    for name in LAUNCH_FLAGS:
        saved[name] = current[name]
    return Config(**saved), changes


def check_checkpoints(cfg: Config, move: bool) -> list[str]:
    """Before anything is spawned or written: can a resumed experiment load its checkpoints? Read on this node's
    disk, policy by policy, from the newest back (a policy without any file starts afresh, or gets its state
    from another node's rank).

    Args:
        move: set each unreadable file newer than a readable one aside (:func:`msf.persistence.checkpoint.set_aside`),
            so that the ranks load the readable one and the resumed run's keep-N rotation cannot delete it in
            favour of the broken file. Only one process per node moves files (the one that prepares the
            experiment folder); the others only read.

    Returns:
        one line per unreadable file, with its reason and what became of it (empty: nothing to report).

    Raises:
        ConfigError: a policy has checkpoint files and none is readable: resuming would silently start from
            scratch. Nothing is moved then; ``--restart_behavior=restart`` starts anew. Or a Sample Factory
            checkpoint to resume from cannot be converted (:mod:`msf.persistence.sf2_checkpoint`).
    """
    if cfg.restart_behavior != "resume":
        return []
    exp_dir = experiment_dir(cfg)
    newer: list[tuple[str, str, str]] = []  # (unreadable file, reason, the file used instead)
    states, unreadable = [], []
    for p in range(cfg.num_policies):
        try:
            states.append(load_latest_checkpoint(exp_dir, p, on_unreadable=lambda *bad: newer.append(bad)))
        except NoReadableCheckpoint as e:
            unreadable += e.unreadable
    _check_sf2_checkpoints(cfg, states)
    if unreadable:
        files = "; ".join(f"{path} ({reason})" for path, reason in unreadable)
        raise ConfigError(
            f"--restart_behavior=resume: no checkpoint of {cfg.experiment!r} is readable, so it cannot resume: "
            f"{files}. Nothing was changed; --restart_behavior=restart starts it anew (the old folder is moved "
            "aside)"
        )
    move = move and not is_sf2_folder(exp_dir)  # a file there may be Sample Factory's: none is renamed
    notes = []
    for path, reason, used in newer:
        moved = set_aside(path) if move else None
        aside = f"set aside as {os.path.basename(moved)}; " if moved else ""
        notes.append(f"checkpoint {path} is unreadable ({reason}); {aside}resuming from {used}")
    return notes


def _check_sf2_checkpoints(cfg: Config, states: list[dict | None]) -> None:
    """Convert each Sample Factory checkpoint among the newest ``states`` once, for a model of ``cfg`` (nothing is
    kept), so that one msf cannot use is refused before anything is spawned or written.

    Raises:
        ConfigError: it cannot be converted (the line names what could not be mapped).
    """
    found = [s for s in states if s is not None and is_sf2_checkpoint(s)]
    if not found:
        return
    from msf.envs.registry import env_config_of, env_spaces
    from msf.model.actor_critic import ActorCritic

    model = ActorCritic(cfg, env_spaces(cfg.env, env_config_of(cfg)))
    try:
        for state in found:
            as_msf_checkpoint(state, model, resume=True, announce=False)
    except Sf2Refused as e:
        raise ConfigError(str(e)) from None
