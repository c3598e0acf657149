"""The records of the named semaphores a run made, and the sweep of dead runs' ones (msf.runtime.semaphore_records)."""

from __future__ import annotations

import os

import pytest

from msf.runtime import semaphore_records as sr


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="process start times from /proc")
def test_the_sweep_removes_the_semaphores_of_dead_pids_and_of_reused_ones_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sr, "SHM", str(tmp_path))
    me, mine = os.getpid(), sr.start_time(os.getpid())
    assert mine is not None
    records = {me: [mine, "/mp-live"], me + 10**7: ["123", "/mp-dead"], 1: ["0", "/mp-reused", "/mp-gone"]}
    for pid, lines in records.items():  # 10**7 + pid: no such process; pid 1 did not start at tick 0
        (tmp_path / f"msf-semaphores.{pid}").write_text("".join(f"{line}\n" for line in lines))
    for name in ("live", "dead", "reused"):
        (tmp_path / f"sem.mp-{name}").write_text("")
    with caplog.at_level("INFO", logger="msf"):
        sr.remove_dead_runs_semaphores()
    assert sorted(os.listdir(tmp_path)) == [f"msf-semaphores.{me}", "sem.mp-live"]
    assert [r.getMessage() for r in caplog.records] == [
        f"removed 2 semaphores of dead msf runs (pids 1, {me + 10**7}) from {tmp_path}"
    ]


_SECOND_CTRL_C = """
import multiprocessing, os, signal
from msf.runtime.semaphore_records import record_semaphores
from msf.runtime.signals import exit_on_interrupt
queue = multiprocessing.get_context("spawn").Queue()  # named semaphores, on the resource tracker's list
record_semaphores(queue)
with open(f"/dev/shm/msf-semaphores.{os.getpid()}") as f:
    print(os.getpid(), *f.read().split()[1:], flush=True)
exit_on_interrupt(signal.SIGINT)
"""


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.path.isdir("/proc"), reason="Linux named semaphores")
def test_a_second_ctrl_c_leaves_neither_semaphores_nor_their_record_nor_a_leak_warning():
    """``exit_on_interrupt`` ends the process with ``os._exit``, which skips the clean-up at exit."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _SECOND_CTRL_C], capture_output=True, text=True, env=env, timeout=120)
    pid, *names = done.stdout.split()
    assert done.returncode == 130 and len(names) >= 2, done.stderr
    assert [n for n in names if os.path.exists(f"/dev/shm/sem.{n.lstrip('/')}")] == []
    assert not os.path.exists(f"/dev/shm/msf-semaphores.{pid}")
    assert "leaked" not in done.stderr, done.stderr
