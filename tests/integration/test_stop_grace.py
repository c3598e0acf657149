"""A stop waits for slow envs no longer than its grace (``msf.runtime.reaping.STOP_GRACE_S``): once the final
checkpoint is written, or there is nothing to save, the workers still constructing or closing their envs are killed,
and one log line names each of them with its envs. Nothing is left behind: no process, no named semaphore.

The envs take 120 s to construct or to close; 16 per worker, so that the budget the stop gave before (10 s + 3 s per
env, 58 s) and the grace (plus what a loaded machine adds, ``SLACK_S``) cannot be mistaken for each other.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from msf.runtime.reaping import STOP_GRACE_S

from .conftest import (
    SLACK_S,
    kill_session,
    live_processes_of_session,
    msf_command,
    msf_env,
    read_summary,
    semaphores_of_session,
    session_of,
)

SLOW_S = "120"  # an env's constructor or close: longer than any bound below
WORKERS = ["--num_workers=2", "--num_envs_per_worker=16", "--encoder_mlp_layers", "16"]


def _start(args: list[str], slow: str, out: Path) -> subprocess.Popen:
    """``python -m msf.train ARGS`` in a session of its own (everything it starts is in it), its output in files
    under ``out`` (a process left behind would hold a pipe open); ``slow``: the test env's variable to set."""
    env = msf_env()
    env[slow] = SLOW_S
    return subprocess.Popen(
        msf_command(args),
        stdout=open(out / "stdout.txt", "w"),
        stderr=open(out / "stderr.txt", "w"),
        env=env,
        start_new_session=True,
    )


def _wait_for(what: Callable[[], bool], p: subprocess.Popen, timeout: float, err: Path) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert p.poll() is None, f"the run ended early ({p.returncode}):\n{err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, err.read_text()[-3000:]
        time.sleep(0.1)


def _session(sid: int) -> tuple[set[int], set[str]]:
    """The pids of session ``sid`` now and the named semaphores they have mapped."""
    pids = {int(e) for e in os.listdir("/proc") if e.isdigit() and session_of(int(e)) == sid}
    return pids, semaphores_of_session(sid)


def _ended(err: str) -> dict[str, tuple[int, int, str]]:
    """The rollout workers that the stop's log line says it killed: process name -> (first env, last env, env
    name)."""
    (line,) = [ln for ln in err.splitlines() if "did not stop within" in ln]
    found = re.findall(r"((?:rank\d+/)?rollout_worker_\d+) \(pid \d+; envs (\d+)-(\d+) of ([^)]+)\)", line)
    return {name: (int(a), int(b), env) for name, a, b, env in found}


def _assert_nothing_left(sid: int, pids: set[int], semaphores: set[str]) -> None:
    deadline = time.monotonic() + 10
    while live_processes_of_session(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_processes_of_session(sid) == [], "processes of the run were left behind"
    assert len(semaphores) >= 10  # the sampler's queues and events, at least: the check below checks something
    assert [f for f in semaphores if os.path.exists(f)] == []
    shm = os.listdir("/dev/shm")
    assert [f for f in shm if any(f == f"msf-semaphores.{pid}" or f.startswith(f"torch_{pid}_") for pid in pids)] == []


@pytest.mark.skipif(not os.path.isdir("/proc") or not os.path.isdir("/dev/shm"), reason="Linux's /proc, /dev/shm")
def test_a_stop_while_the_envs_are_constructed_ends_the_workers_within_the_grace(train_dir, tmp_path):
    """SIGTERM while both rollout workers are in their first env's constructor (120 s): the run ends ``stopped``
    with nothing trained or saved, STOP_GRACE_S later, killing both workers and naming them with their envs.
    Before, the stop waited 58 s for the constructors."""
    exp = train_dir / "slowstart"
    args = ["--env=msf_test_envs:MsfDeclaredSlowStartCartPole-v0", "--experiment=slowstart"]
    p = _start(
        [*args, f"--train_dir={train_dir}", "--train_for_env_steps=100000", *WORKERS], "MSF_TEST_SLOW_START_S", tmp_path
    )
    err = tmp_path / "stderr.txt"
    try:
        # each worker logs its niceness just before it makes its envs
        _wait_for(
            lambda: all(f"rollout worker {w} runs at niceness" in err.read_text() for w in (0, 1)), p, 60 + SLACK_S, err
        )
        time.sleep(1.0)
        pids, semaphores = _session(p.pid)
        p.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        p.wait(timeout=STOP_GRACE_S + SLACK_S + 60)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait(30)
    assert p.returncode == 0, err.read_text()[-3000:]
    assert elapsed < STOP_GRACE_S + SLACK_S, elapsed
    s = read_summary(train_dir, "slowstart")
    assert (s["status"], s["env_steps"], s["last_checkpoint"]) == ("stopped", 0, None), s
    assert list(exp.glob("checkpoint_p0/*.pth")) == []
    env = "msf_test_envs:MsfDeclaredSlowStartCartPole-v0"
    assert _ended(err.read_text()) == {"rollout_worker_0": (0, 15, env), "rollout_worker_1": (16, 31, env)}
    _assert_nothing_left(p.pid, pids, semaphores)


@pytest.mark.skipif(not os.path.isdir("/proc") or not os.path.isdir("/dev/shm"), reason="Linux's /proc, /dev/shm")
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_envs_that_do_not_close_are_ended_within_the_grace_after_the_final_checkpoint(train_dir, tmp_path, nproc):
    """A budget of one iteration; then every env's close takes 120 s. The run ends ``done`` with its final
    checkpoint, STOP_GRACE_S after it, killing the workers and naming each with its envs (by their job-wide
    indices); with two device groups each rank names its own. Before, each rank waited 58 s for the envs."""
    exp = train_dir / "slowclose"
    args = ["--env=msf_test_envs:MsfSlowCloseCartPole-v0", "--experiment=slowclose", f"--nproc_per_node={nproc}"]
    p = _start(
        [*args, f"--train_dir={train_dir}", "--train_for_env_steps=1", *WORKERS], "MSF_TEST_SLOW_CLOSE_S", tmp_path
    )
    err = tmp_path / "stderr.txt"
    try:
        _wait_for(lambda: bool(list(exp.glob("checkpoint_p0/checkpoint_*.pth"))), p, 90 + SLACK_S, err)
        t0 = time.monotonic()
        pids, semaphores = _session(p.pid)
        p.wait(timeout=STOP_GRACE_S + SLACK_S + 60)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait(30)
    assert p.returncode == 0, err.read_text()[-3000:]
    assert elapsed < STOP_GRACE_S + SLACK_S, elapsed
    s = read_summary(train_dir, "slowclose")
    assert (s["status"], s["world_size"]) == ("done", nproc), s
    (checkpoint,) = exp.glob("checkpoint_p0/checkpoint_*.pth")
    assert s["last_checkpoint"] == str(checkpoint) and s["env_steps"] > 0, s
    env = "msf_test_envs:MsfSlowCloseCartPole-v0"
    workers = (
        ["rollout_worker_0", "rollout_worker_1"] if nproc == 1 else ["rank0/rollout_worker_0", "rank1/rollout_worker_0"]
    )
    ended = {}
    for line in err.read_text().splitlines():  # one line per device group
        if "did not stop within" in line:
            ended.update(_ended(line))
    assert ended == {workers[0]: (0, 15, env), workers[1]: (16, 31, env)}, err.read_text()[-3000:]
    _assert_nothing_left(p.pid, pids, semaphores)
