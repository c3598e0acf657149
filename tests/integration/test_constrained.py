"""Less room than a run needs: a /dev/shm too small for the trajectory buffer (Docker's 64 MB), a disk that fills up
while a checkpoint is written. One line that says what and where, the right exit code, nothing left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .conftest import SLACK_S, msf_env, read_summary

# msf-train with a small /dev/shm (MSF_TEST_SHM_FREE) or a disk that fills up (MSF_TEST_DISK_FULL_AFTER)
CONSTRAINED_TRAIN = Path(__file__).resolve().parents[1] / "helpers" / "constrained_train.py"


def _run(args: list[str], timeout: float, **limits: int) -> subprocess.CompletedProcess:
    env = msf_env()
    env.update({f"MSF_TEST_{k.upper()}": str(v) for k, v in limits.items()})
    return subprocess.run(
        [sys.executable, str(CONSTRAINED_TRAIN), "--device=cpu", "--with_progress_bar=False", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _shm_files() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("torch_")}


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_dev_shm_too_small_for_the_buffer_is_refused_before_anything_is_allocated(tmp_path):
    """The issue's run: atari_pong, 2 workers x 16 envs, rollout 128 (about 222 MiB), on Docker's 64 MB."""
    pytest.importorskip("ale_py")
    import dataclasses

    from msf.cfg.config import Config
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.train import check_model, shared_memory_bytes

    flags = dict(env="atari_pong", num_workers=2, num_envs_per_worker=16, rollout=128)
    # the run's config: Sample Factory's Atari defaults, asynchronous (2 x 16 envs do not fit their sync rule)
    cfg = dataclasses.replace(apply_family_defaults(Config(**flags, nproc_per_node=1), set(flags)), async_rl=True)
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    buffers, weights = shared_memory_bytes(cfg, spaces, check_model(cfg, spaces))
    assert 220 * 2**20 < buffers < 225 * 2**20  # [4, 84, 84] uint8 x 2 workers x (16 + 16 spare slots) x 129 steps
    before = _shm_files()
    t0 = time.monotonic()
    r = _run(
        [f"--{k}={v}" for k, v in flags.items()] + ["--experiment=pong", f"--train_dir={tmp_path}"],
        timeout=120,
        shm_free=64 * 2**20,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("msf-")]  # (ale-py prints its banner too)
    assert line.startswith("msf-train: error: ")
    assert f"needs {(buffers + weights) / 2**20:.1f} MiB in /dev/shm" in line
    assert f"trajectory buffer {buffers / 2**20:.1f} MiB" in line and "64.0 MiB is free there" in line
    assert "--shm-size=256m" in line and "--num_envs_per_worker" in line and "--rollout" in line
    assert not (tmp_path / "pong").exists()  # nothing written
    assert _shm_files() <= before  # nothing allocated, nothing left behind
    assert time.monotonic() - t0 < SLACK_S  # before anything is spawned


def _can_mount_a_private_tmpfs() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", "/mnt"], timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount_a_private_tmpfs(), reason="no user namespace with a private tmpfs here")
def test_a_real_64_mb_dev_shm_is_refused_and_left_empty(tmp_path):
    """The same on a real 64 MB /dev/shm (a tmpfs in a private mount namespace, as Docker gives): before the
    check, torch's allocation failed with exit 1 and left a 233 MB torch_* file there."""
    pytest.importorskip("ale_py")
    script = (
        "mount -t tmpfs -o size=64m tmpfs /dev/shm && "
        f"{sys.executable} -m msf.train --device=cpu --env=atari_pong --num_workers=2 --num_envs_per_worker=16 "
        f"--rollout=128 --experiment=pong --train_dir={tmp_path}; echo rc=$?; ls -A /dev/shm"
    )
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=msf_env()
    )
    assert r.stdout.split() == ["rc=2"], r.stdout + r.stderr[-3000:]  # exit 2, and nothing in /dev/shm after it
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("msf-")]
    assert "64.0 MiB is free there" in line and "trajectory buffer 222.5 MiB" in line
    assert not (tmp_path / "pong").exists()


def test_a_full_disk_during_a_checkpoint_write_names_the_file_the_free_space_and_what_was_kept(train_dir):
    """Every iteration saves (--save_every_sec=0); the third checkpoint write meets ENOSPC (/dev/full)."""
    exp = train_dir / "full"
    r = _run(
        [
            "--env=CartPole-v1",
            "--experiment=full",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--save_every_sec=0",
            "--keep_checkpoints=5",
            "--train_for_env_steps=20000",
            "--encoder_mlp_layers",
            "16",
        ],
        timeout=120,
        disk_full_after=2,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    folder = exp / "checkpoint_p0"
    written = sorted(folder.glob("checkpoint_*.pth"))
    assert len(written) == 2
    last = r.stderr.strip().splitlines()[-1]
    m = re.fullmatch(
        r"msf-train: a device group failed: could not write the checkpoint (\S+): the disk is full "
        r"\((\d+\.\d) MiB free there\); no partial file was left, and the checkpoints already there are kept "
        r"\(newest: (\S+)\) \(details in \S+log.txt\)",
        last,
    )
    assert m, last
    failed, kept = Path(m[1]), Path(m[3])
    assert failed.parent == folder and not failed.exists() and kept == written[-1]
    assert float(m[2]) > 0  # the real free space (this disk is not full: /dev/full is)
    assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]  # no half-written file
    assert torch.load(kept, weights_only=True)["env_steps"] > 0  # what was kept loads
    assert read_summary(train_dir, "full")["status"] == "failed"
