"""Ending children with everything they started: process groups, the stop budget, the engines' files."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from msf.envs.families import remove_engine_files
from msf.runtime.reaping import group_members, stop_children
from msf.runtime.spawning import CTX, spawn

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")

# an "engine": ignores SIGTERM and waits for ever, as an orphaned ViZDoom engine does
ENGINE = ["sh", "-c", "trap '' TERM; exec sleep 1000"]


def _start_engine_and_hang(report) -> None:
    engine = subprocess.Popen(ENGINE)
    report.send(engine.pid)
    time.sleep(1000)  # never looks at the stop event: a worker stuck in an env's start


def _start_engine_and_die(report) -> None:
    engine = subprocess.Popen(ENGINE)
    report.send(engine.pid)
    os._exit(0)  # its engine is orphaned


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_that_does_not_stop_is_killed_with_what_it_started_and_so_is_a_dead_childs_orphan():
    failures = CTX.Queue()
    (r1, w1), (r2, w2) = CTX.Pipe(duplex=False), CTX.Pipe(duplex=False)
    hung = spawn(_start_engine_and_hang, "hung", failures, w1)
    dead = spawn(_start_engine_and_die, "dead", failures, w2)
    assert r1.poll(60) and r2.poll(60)
    engines = [r1.recv(), r2.recv()]
    dead.join(30)
    assert all(_alive(e) for e in engines)
    assert {e.pid for e in group_members({hung.pid, dead.pid})} >= set(engines)  # each in its worker's group
    t0 = time.monotonic()
    killed = stop_children([hung, dead], timeout_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 10
    assert not hung.is_alive() and hung.exitcode == -9
    deadline = time.monotonic() + 5
    while any(_alive(e) for e in engines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(e) for e in engines)
    assert sorted(killed) == sorted(engines) and all(args == ["sleep", "1000"] for args in killed.values())


def test_the_files_of_killed_vizdoom_engines_are_removed_and_no_others(tmp_path):
    for name in ("ViZDoomSMabc123", "ViZDoomMQCtrabc123", "ViZDoomMQDoomabc123", "ViZDoomSMother1", "torch_1_2"):
        (tmp_path / name).write_bytes(b"")
    engine = ["/x/vizdoom", "-iwad", "freedoom2.wad", "+viz_instance_id", "abc123", "+viz_async", "0"]
    removed = remove_engine_files([engine, ["sleep", "1000"]], shm_dir=str(tmp_path))
    assert sorted(removed) == ["ViZDoomMQCtrabc123", "ViZDoomMQDoomabc123", "ViZDoomSMabc123"]
    assert sorted(os.listdir(tmp_path)) == ["ViZDoomSMother1", "torch_1_2"]


# a process that returned more slots to a worker than the worker read (a worker reads its free queue only when out of
# slots: a batch of many trajectories returns many) must still exit once the sampler is closed
_FLOODED_EXIT = """
import sys
from msf.cfg.arguments import parse_args
from msf.cfg.config import Derived
from msf.envs.registry import env_spaces
from msf.model.actor_critic import ActorCritic
from msf.sampling.messages import SlotsReturned
from msf.sampling.plan import DeviceGroup
from msf.sampling.process_sampler import ProcessSampler
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=1", "--num_envs_per_worker=2", "--device=cpu"])
derived, spaces = Derived.of(cfg), env_spaces(cfg.env)
weights = PublishedWeights(ActorCritic(cfg, spaces))
sampler = ProcessSampler(cfg, derived, spaces, DeviceGroup(TrajectoryBuffer.allocate(cfg, derived, spaces), [weights]))
for _ in range(20000):  # far more than a pipe holds: its feeder thread blocks on the full pipe
    sampler.free_queues[0].put(SlotsReturned(list(range(16))))
sampler.close()
print("closed", flush=True)
"""


def test_a_process_whose_returned_slots_were_never_read_exits_after_closing_its_sampler():
    """The slots returned to a worker that never read them (its pipe full, the queue's feeder thread blocked) do not
    keep the training process alive at its exit: ``ProcessSampler.close`` lets them go."""
    r = subprocess.run([sys.executable, "-c", _FLOODED_EXIT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "closed", r.stderr[-2000:]
