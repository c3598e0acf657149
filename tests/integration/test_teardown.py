"""Whatever way a run ends, nothing it started is left: no process (ViZDoom's engines included), no file in
/dev/shm.

The runs use many Doom envs per rollout worker on this oversubscribed machine, and end while most engines are
still starting: the run's end (a short budget, a SIGTERM, a failing env) comes before the workers are ready.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from .conftest import msf_env, read_summary

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vizdoom") is None, reason="needs the vizdoom extra")

MANY_ENGINES = [
    "--num_workers=4",
    "--num_envs_per_worker=8",
    "--worker_num_splits=2",
    "--batch_size=256",
    "--rollout=32",
    "--encoder_conv_mlp_layers",
    "32",
]


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read()
    except OSError:
        return False


def _processes_with(marker: bytes) -> dict[int, list[str]]:
    """pid -> command line of every live process whose environment holds ``marker`` (everything the run started,
    directly or not, inherits it; zombies have no environment any more)."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and _environ_has(int(d), marker):
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    out[int(d)] = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                pass
    return out


class Watcher:
    """Samples the run's processes every 0.2 s while it runs: their pids and ViZDoom instance ids (the
    engines' ``+viz_instance_id``), which name what they create in /dev/shm."""

    def __init__(self, marker: bytes):
        self.marker, self.pids, self.instance_ids = marker, set(), set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.2):
            for pid, args in _processes_with(self.marker).items():
                self.pids.add(pid)
                if "+viz_instance_id" in args[:-1]:
                    self.instance_ids.add(args[args.index("+viz_instance_id") + 1])

    def engines_running(self) -> int:
        return sum("+viz_instance_id" in args for args in _processes_with(self.marker).values())

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _start(args: list[str], marker: str, cwd, fail: bool) -> subprocess.Popen:
    env = msf_env()
    env["MSF_TEST_RUN_MARKER"] = marker
    env["MSF_TEST_DOOM_SLOW_START_S"] = "1.5"  # workers 1-3: as on a machine busier than this one
    env["MSF_TEST_DOOM_FAIL"] = "1" if fail else "0"
    # output into files, not pipes: processes left behind keep a pipe open, and reading it to its end then hangs
    return subprocess.Popen(
        [sys.executable, "-m", "msf.train", "--device=cpu", "--with_progress_bar=False", *args],
        stdout=open(cwd / "stdout.txt", "w"),
        stderr=open(cwd / "stderr.txt", "w"),
        env=env,
        cwd=cwd,
        start_new_session=True,  # so that a process the run left behind cannot hide in the test's own group
    )


def _clean_up(marker: bytes, watcher: Watcher) -> None:
    """Kill what a failed test left (by pid: only the run's own processes), and remove its engines' files."""
    for pid in _processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.5)
    for f in os.listdir("/dev/shm"):
        if any(f.startswith("ViZDoom") and f.endswith(i) for i in watcher.instance_ids):
            try:
                os.unlink(f"/dev/shm/{f}")
            except OSError:
                pass


def _leftovers(watcher: Watcher, marker: bytes, timeout: float = 10.0) -> tuple[dict, list[str]]:
    """What the run left once it exited: its live processes, and the /dev/shm files of its engines and of
    torch's shared memory in its processes (``torch_<pid>_...``); waiting up to ``timeout`` for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        procs = _processes_with(marker)
        files = [
            f
            for f in os.listdir("/dev/shm")
            if any(f.startswith("ViZDoom") and f.endswith(i) for i in watcher.instance_ids)
            or any(f.startswith(f"torch_{pid}_") for pid in watcher.pids)
        ]
        if (not procs and not files) or time.monotonic() > deadline:
            return procs, files
        time.sleep(0.25)


def _rank1_pid(log: Path) -> int | None:
    m = re.search(r"\[rank 1\]\[[^\]]+\]\[pid (\d+)\]", log.read_text()) if log.exists() else None
    return int(m.group(1)) if m else None


# "killed" (two device groups of 32 engines on 2 cores, a minute): default-suite time; CI's slow suite runs it
@pytest.mark.parametrize("how", ["done", "stopped", "failed", pytest.param("killed", marks=pytest.mark.slow)])
def test_no_process_or_shared_memory_is_left_however_the_run_ends(tmp_path, how):
    """4 rollout workers x 8 Doom engines on 2 cores, the engines of workers 1-3 slower to start (1.5 s more
    each). ``done``: a budget of one iteration, which worker 0 fills while the others are still starting theirs;
    ``stopped``: SIGTERM once the first engine runs; ``failed``: worker 0's second env fails to start;
    ``killed``: two device groups, and rank 1 is SIGKILLed once the first engine runs. Before the fix each left
    engines (orphans that wait for ever) and their /dev/shm files: the workers went on starting their envs after
    the stop, and were killed 5 s into it."""
    marker = f"MSF_TEST_RUN_MARKER={uuid.uuid4().hex}"
    budget = "--train_for_env_steps=1" if how == "done" else "--train_for_env_steps=100000000"
    args = ["--env=msf_test_envs:MsfDoom", "--experiment=tear", f"--train_dir={tmp_path / 'train_dir'}", budget]
    if how == "killed":
        args.append("--nproc_per_node=2")
    p = _start([*args, *MANY_ENGINES], marker.split("=")[1], tmp_path, fail=how == "failed")
    watcher = Watcher(marker.encode())
    try:
        if how in ("stopped", "killed"):
            log = tmp_path / "train_dir" / "tear" / "log.txt"
            deadline = time.monotonic() + 90
            while p.poll() is None and time.monotonic() < deadline:
                if watcher.engines_running() and (how == "stopped" or _rank1_pid(log)):
                    break
                time.sleep(0.1)
            assert p.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
            if how == "stopped":
                p.send_signal(signal.SIGTERM)
            else:
                os.kill(_rank1_pid(log), signal.SIGKILL)
        p.wait(timeout=150)
        err = (tmp_path / "stderr.txt").read_text()
        assert p.returncode == (1 if how in ("failed", "killed") else 0), err[-3000:]
        assert watcher.instance_ids, "no ViZDoom engine was seen: the test did not test anything"
        procs, files = _leftovers(watcher, marker.encode())
        assert procs == {}, f"processes of the run were left behind: {procs}"
        assert files == [], f"files of the run were left in /dev/shm: {files}"
        if how != "killed":  # (rank 0, stopped by the launcher, may write "stopped" or "failed")
            assert read_summary(tmp_path / "train_dir", "tear")["status"] == how
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        watcher.stop()
        _clean_up(marker.encode(), watcher)
