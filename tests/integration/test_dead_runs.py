"""What a run killed with SIGKILL leaves in /dev/shm is removed by the next run."""

from __future__ import annotations

import os
import re
import time

import pytest

from .conftest import (
    kill_session,
    popen_msf,
    read_summary,
    run_msf,
    semaphores_of_session,
    session_of,
    wait_until_training,
)


@pytest.mark.skipif(not os.path.isdir("/proc") or not os.path.isdir("/dev/shm"), reason="Linux's /dev/shm only")
def test_the_semaphores_of_a_killed_run_are_removed_by_the_next_run(train_dir):
    """Every process of a training run is SIGKILLed: its named semaphores (/dev/shm/sem.mp-*) stay, as the
    resource tracker that would unlink them died with it. The next run removes them and says so in one line.
    Before, they stayed until the machine restarted (27 files after five runs)."""
    p = popen_msf(
        ["--env=CartPole-v1", "--experiment=killed", f"--train_dir={train_dir}", "--num_workers=2"],
        start_new_session=True,
    )
    try:
        wait_until_training(train_dir / "killed")
        files = semaphores_of_session(p.pid)
        kill_session(p.pid)
        p.wait(30)
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait(30)
    deadline = time.monotonic() + 10
    while any(session_of(int(e)) == p.pid for e in os.listdir("/proc") if e.isdigit()):
        assert time.monotonic() < deadline, "the killed run's processes are still there"
        time.sleep(0.1)
    left = [f for f in files if os.path.exists(f)]
    assert len(left) >= 10, (files, left)  # the queues and events of the sampler, at least
    r = run_msf(
        ["--env=CartPole-v1", "--experiment=next", f"--train_dir={train_dir}", "--train_for_env_steps=1000"],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(train_dir, "next")["status"] == "done"
    assert [f for f in files if os.path.exists(f)] == []
    assert not os.path.exists(f"/dev/shm/msf-semaphores.{p.pid}")  # its record, with them
    # one line (another dead run of this user may be named too)
    lines = re.findall(r"removed (\d+) semaphores of dead msf runs \(pids ([\d, ]+)\)", r.stdout + r.stderr)
    assert len(lines) == 1 and int(lines[0][0]) >= len(left) and str(p.pid) in lines[0][1].split(", "), lines


@pytest.mark.slow  # 17 s on 2 cores; the default suite keeps the killed run's
@pytest.mark.skipif(not os.path.isdir("/proc") or not os.path.isdir("/dev/shm"), reason="Linux's /dev/shm only")
def test_semaphores_removed_under_a_running_run_make_one_line_at_its_exit(train_dir):
    """The run's semaphore files are removed while it trains (systemd-logind's RemoveIPC, an rm): it trains on and
    ends done, and its exit says so in one line. Before, multiprocessing's clean-up printed a traceback and a
    resource-tracker warning for each of them (36 of each)."""
    p = popen_msf(
        [
            "--env=CartPole-v1",
            "--experiment=removed",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--train_for_seconds=12",
        ],
        start_new_session=True,
    )
    try:
        wait_until_training(train_dir / "removed")
        files = semaphores_of_session(p.pid)
        for f in files:
            os.unlink(f)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait(30)
    assert len(files) >= 10 and p.returncode == 0, err[-3000:]
    assert read_summary(train_dir, "removed")["status"] == "done"
    assert "Traceback" not in out + err and "resource_tracker" not in out + err, err[-3000:]
    lines = [line for line in (out + err).splitlines() if "were removed while it ran" in line]
    assert len(lines) == 1 and "RemoveIPC" in lines[0], lines
