"""msf-train --nproc_per_node=2 on CPU device groups (gloo): learning, agreed stopping, failures, bad input."""

from __future__ import annotations

import signal
import socket
import time

import pytest
import torch

from .conftest import SLACK_S, popen_msf, read_summary, run_msf, wait_until_training


def test_ctrl_c_stops_both_replicas_after_the_same_iteration(train_dir):
    p = popen_msf(
        [
            "--env=CartPole-v1",
            "--experiment=ddpsig",
            f"--train_dir={train_dir}",
            "--nproc_per_node=2",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--encoder_mlp_layers",
            "32",
            "--save_every_sec=1000",
        ],
        start_new_session=True,
    )
    try:
        wait_until_training(train_dir / "ddpsig")
        import os

        os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    s = read_summary(train_dir, "ddpsig")
    assert s["status"] == "stopped"
    ckpts = sorted((train_dir / "ddpsig" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert len(ckpts) == 1 and torch.load(ckpts[0], weights_only=True)["train_step"] == s["train_steps"]


def test_failure_in_one_device_group_ends_the_job(train_dir):
    r = run_msf(
        [
            "--env=msf_test_envs:MsfFailingCartPole-v0",
            "--experiment=ddpfail",
            f"--train_dir={train_dir}",
            "--nproc_per_node=2",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--encoder_mlp_layers",
            "32",
            "--save_every_sec=1",
        ],
        timeout=120,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert read_summary(train_dir, "ddpfail")["status"] == "failed"
    log = (train_dir / "ddpfail" / "log.txt").read_text()
    assert "RuntimeError: deliberate failure inside the environment" in log
    assert list((train_dir / "ddpfail" / "checkpoint_p0").glob("checkpoint_*.pth"))


def test_busy_master_port_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_msf(
            [
                "--experiment=port",
                f"--train_dir={tmp_path}",
                "--nproc_per_node=2",
                "--num_workers=2",
                f"--master_port={port}",
            ],
            timeout=60,
        )
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"msf-train: error: --master_port: port {port} on 127.0.0.1 is not free")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--nproc_per_node=3", "--num_workers=2"], "--num_workers: must be at least nproc_per_node=3"),
        (
            ["--nproc_per_node=2", "--num_workers=2", "--policy_workers_per_policy=2"],
            "--policy_workers_per_policy: must be at most the rollout workers of one device group",
        ),
        (["--nproc_per_node=0"], "--nproc_per_node: must be a positive integer"),
    ],
)
def test_bad_topology_one_line_exit_2(tmp_path, args, expected):
    r = run_msf(["--experiment=bad", f"--train_dir={tmp_path}", *args], timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], r.stderr


def _hard_open_files_limit() -> float:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return float("inf") if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(
    _hard_open_files_limit() > 800_000, reason="this machine lets a process open 100,000 workers' files"
)
def test_more_workers_than_the_open_files_limit_allows_is_refused_before_spawning(tmp_path):
    """It used to spawn workers until "Too many open files" (exit 1); now one line, exit 2, nothing written."""
    r = run_msf(["--experiment=many", f"--train_dir={tmp_path}", "--num_workers=100000"], timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("msf-train: error: --num_workers: 100001 worker processes"), lines
    assert "(ulimit -Hn)" in lines[0] and not (tmp_path / "many").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when no GPU is present")
def test_explicit_gpu_without_cuda_is_refused(tmp_path):
    r = run_msf(["--experiment=gpu", f"--train_dir={tmp_path}", "--device=gpu"], timeout=60)
    assert r.returncode == 2
    assert "--device: gpu was asked for but CUDA is not available" in r.stderr


def _processes_with(marker: str) -> list[int]:
    import os

    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
    return pids


@pytest.mark.slow  # 15-30 s each; the default suite keeps test_failure_in_one_device_group_ends_the_job
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_replica_ends_the_job_and_leaves_nothing_behind(train_dir, killed):
    """Rank 1 or rank 0 (the store's host) is SIGKILLed while training: exit code 1, the lost rank named, nothing
    left behind, and no c10d warnings from the survivor's store client (each came with a C++ stack trace)."""
    import os
    import re
    import uuid

    marker = f"MSF_TEST_MARKER={uuid.uuid4().hex}"
    shm_before = set(os.listdir("/dev/shm"))
    env_key, env_val = marker.split("=")
    os.environ[env_key] = env_val
    try:
        p = popen_msf(
            [
                "--env=CartPole-v1",
                "--experiment=kill",
                f"--train_dir={train_dir}",
                "--nproc_per_node=2",
                "--num_workers=2",
                "--num_envs_per_worker=4",
                "--batch_size=128",
                "--encoder_mlp_layers",
                "32",
                "--save_every_sec=1",
                "--dist_timeout=10",
            ]
        )
    finally:
        os.environ.pop(env_key)
    try:
        wait_until_training(train_dir / "kill")
        time.sleep(1.5)  # a checkpoint exists
        log = (train_dir / "kill" / "log.txt").read_text()
        pid = int(re.search(rf"\[rank {killed}\]\[[^\]]+\]\[pid (\d+)\]", log).group(1))
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=10 + SLACK_S + 10)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    # the survivor gives up after --dist_timeout=10 s at most; its teardown (workers, store) is the rest
    assert elapsed < 10 + SLACK_S
    line = next(ln for ln in err.splitlines() if ln.startswith("msf-train: a device group failed"))
    assert f"rank {killed}" in line and "was lost" in line, line
    assert "[c10d]" not in err and "Exception raised from" not in err, err[-3000:]
    # the killed rank's queues: its workers release them (multiprocessing's resource tracker warned at the end)
    assert "leaked semaphore" not in err, err[-2000:]
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == [], "processes of the job were left behind"
    # (another job running on the machine at the same time would add its own entries: run this test alone)
    deadline = time.monotonic() + 5
    while not set(os.listdir("/dev/shm")) <= shm_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(os.listdir("/dev/shm")) <= shm_before, "shared memory left in /dev/shm"
    ckpts = sorted((train_dir / "kill" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert ckpts and torch.load(ckpts[-1], weights_only=True)["env_steps"] > 0


@pytest.mark.slow  # 14 s on 2 cores
def test_every_env_of_the_job_has_its_own_worker_and_env_index(train_dir, tmp_path):
    """Two device groups, 2 rollout workers x 3 envs each: the 12 envs see worker_index 0..3 and env_index 0..11,
    each pair once, with the device group's rank beside them (both groups gave worker_index 0 and env_index
    0..5 before, so an env that picks its level or seeds itself by them did the same on both)."""
    import json
    import os

    from .conftest import msf_env

    records = tmp_path / "env_configs"
    records.mkdir()
    env = msf_env()
    env["MSF_TEST_RECORD_DIR"] = str(records)
    r = run_msf(
        [
            "--env=msf_test_envs:MsfRecordingCartPole",
            "--experiment=indices",
            f"--train_dir={train_dir}",
            "--nproc_per_node=2",
            "--num_workers=4",
            "--num_envs_per_worker=3",
            "--worker_num_splits=1",
            "--batch_size=96",
            "--encoder_mlp_layers",
            "16",
            # long enough for every worker to make its envs: one group's batch can come from one of its workers,
            # so a run of 2,000 steps could end before a late worker (workers start within milliseconds of each
            # other from the fork server, but a busy machine may hold one back) had made its last env
            "--train_for_env_steps=20000",
        ],
        timeout=180,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seen = [json.loads((records / f).read_text()) for f in os.listdir(records)]
    made = [s for s in seen if "rollout_worker" in s["process"]]  # not the launcher's env, made for its spaces
    pairs = sorted((s["worker_index"], s["env_index"]) for s in made)
    assert pairs == [(e // 3, e) for e in range(12)], pairs
    groups = {s["worker_index"]: (s["device_group"], s["process"].split("/")[0]) for s in made}
    assert groups == {0: (0, "rank0"), 1: (0, "rank0"), 2: (1, "rank1"), 3: (1, "rank1")}, groups


@pytest.mark.slow  # 22 s on 2 cores
def test_a_stalled_rank_is_named_with_what_it_was_doing(train_dir):
    """Rank 1's envs take 0.1 s per step: it needs ~25 s for a batch, rank 0 waits --dist_timeout=10 s for it in
    the agreement and gives up. The error names rank 1 (gloo's own message blamed rank 0, the one waiting:
    "Timed out waiting 10000ms for recv operation to complete"), what it did last and the flag."""
    from .conftest import msf_env

    env = msf_env()
    env.update(MSF_TEST_STALL_RANK="1", MSF_TEST_STALL_S="0.1")
    t0 = time.monotonic()
    r = run_msf(
        [
            "--env=msf_test_envs:MsfStallingCartPole",
            "--experiment=stall",
            f"--train_dir={train_dir}",
            "--nproc_per_node=2",
            "--num_workers=2",
            "--num_envs_per_worker=2",
            "--rollout=8",
            "--batch_size=256",
            "--encoder_mlp_layers",
            "16",
            "--dist_timeout=10",
        ],
        timeout=10 + SLACK_S + 60,
        env=env,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert time.monotonic() - t0 < 10 + SLACK_S + 30
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("msf-train: a device group failed: "), r.stderr[-3000:]
    assert f"rank 1 (node 0, {socket.gethostname()}) did not come to the agreement after iteration 0 within " in line
    assert "--dist_timeout=10 s (rank 0 waited for it)" in line, line
    assert "its last completed iteration is 0" in line and "were still delivering trajectories" in line, line
    assert read_summary(train_dir, "stall")["status"] == "failed"
