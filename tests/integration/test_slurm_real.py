"""msf under a real Slurm (slurm-wlm's controller and node daemon on this machine, started by
``scripts/slurm_local.sh start``; ``.ci/run`` starts and stops it): ``srun`` with one task per node and with one
task per device group, an ``sbatch`` job run to its end, ``sbatch`` jobs cancelled with ``scancel``, and the
heterogeneous job of docs/slurm.md (learners in one component, sampler nodes in the other) run to its end.

Skipped, with the reason, where Slurm's commands are not on PATH or its controller does not answer.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import SLACK_S, msf_env, read_summary

pytestmark = pytest.mark.slow

SLURM_TOOLS = ("sinfo", "srun", "sbatch", "squeue", "scancel", "scontrol")
UP_STATES = ("idle", "mixed", "allocated", "completing", "planned")  # planned: idle, held by backfill for a job
# A short CartPole run: on a loaded 2-core machine, starting the workers alone has taken a minute.
FLAGS = [
    "--env=CartPole-v1",
    "--device=cpu",
    "--with_progress_bar=False",
    "--num_workers=2",
    "--num_envs_per_worker=4",
    "--batch_size=128",
    "--encoder_mlp_layers",
    "32",
    "--experiment_summaries_interval=1",
]
STEPS = 20_000
RUN_TIMEOUT_S = 300 + SLACK_S  # one short run, start to end, on a busy machine
KILL_WAIT_S = 30  # scripts/slurm_local.sh's KillWait: Slurm's SIGKILL follows its SIGTERM after this long
CHECKPOINT = re.compile(r"checkpoint_(\d+)_(\d+)\.pth")
HETJOB_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "sampler_nodes_hetjob.sh"


def _slurm_missing() -> str | None:
    """Why these tests cannot run here, or ``None``."""
    for tool in SLURM_TOOLS:
        if shutil.which(tool) is None:
            return f"Slurm's {tool} is not on PATH (bash scripts/slurm_local.sh start installs and starts Slurm)"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the Slurm controller did not answer sinfo within 30 s (bash scripts/slurm_local.sh start)"
    if r.returncode != 0:
        err = " ".join(r.stderr.split())[:300]
        return f"the Slurm controller is not answering (sinfo exited {r.returncode}: {err}); start it with " + (
            "bash scripts/slurm_local.sh start"
        )
    states = r.stdout.split()
    if not any(s.startswith(UP_STATES) for s in states):
        return f"no Slurm node is up (sinfo says {states or 'nothing'})"
    return None


@pytest.fixture(scope="module", autouse=True)
def _slurm_up() -> None:
    why = _slurm_missing()
    if why is not None:
        pytest.skip(why)


def _pids_with(marker: bytes) -> list[int]:
    """The live processes whose environment holds ``marker`` (``MSF_TEST_MARKER=<tag>``)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        pids.append(int(d))
            except OSError:
                pass
    return pids


def _wait_for(condition, timeout: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


@dataclass
class Job:
    """One test's Slurm job: a unique job name and environment marker, to find (and clean up) what it ran."""

    name: str
    tag: str

    @property
    def marker(self) -> bytes:
        return f"MSF_TEST_MARKER={self.tag}".encode()

    def env(self) -> dict:
        return {**msf_env(), "MSF_TEST_MARKER": self.tag}

    def leftovers(self, timeout: float) -> list[int]:
        """The job's processes still alive after waiting up to ``timeout`` s for them to end."""
        _wait_for(lambda: not _pids_with(self.marker), timeout)
        return _pids_with(self.marker)


@pytest.fixture
def job():
    tag = uuid.uuid4().hex[:12]
    j = Job(name=f"msf-test-{tag}", tag=tag)
    yield j
    # what a failed test left: its job, then its processes (by pid: only this job's own)
    subprocess.run(["scancel", f"--name={j.name}"], capture_output=True, timeout=30)
    for pid in _pids_with(j.marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _msf(train_dir: Path, experiment: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "msf.train",
        *FLAGS,
        f"--train_dir={train_dir}",
        f"--experiment={experiment}",
        *extra,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _srun(job: Job, layout: list[str], cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["srun", f"--job-name={job.name}", "--label", *layout, *cmd],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=job.env(),
    )


def _sbatch(job: Job, tmp_path: Path, command: str) -> str:
    """Submit ``command`` as ``sbatch --wrap``; returns the job id."""
    r = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--job-name={job.name}",
            f"--output={tmp_path / 'job.out'}",
            f"--chdir={tmp_path}",
            f"--export=ALL,MSF_TEST_MARKER={job.tag}",
            "--wrap",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _in_queue(job_id: str) -> bool:
    """Whether ``squeue`` still lists the job (pending, running or completing)."""
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and r.stdout.strip() != ""


def _job_record(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields of a job (kept MinJobAge = 300 s after it ended; no accounting needed)."""
    r = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)


def _job_output(tmp_path: Path) -> str:
    out = tmp_path / "job.out"
    return out.read_text()[-3000:] if out.exists() else "(no output)"


def _checkpoints(exp_dir: Path) -> list[tuple[int, int]]:
    """(train step, env steps) of each checkpoint in ``checkpoint_p0/``, oldest first."""
    names = os.listdir(exp_dir / "checkpoint_p0") if (exp_dir / "checkpoint_p0").is_dir() else []
    return sorted((int(m[1]), int(m[2])) for n in names if (m := CHECKPOINT.fullmatch(n)))


def _train_steps_logged(exp_dir: Path) -> int:
    """The train step of the run's last status line in ``log.txt`` (0 before the first)."""
    log = exp_dir / "log.txt"
    found = re.findall(r"\| train_step (\d+) \|", log.read_text()) if log.exists() else []
    return int(found[-1]) if found else 0


def test_srun_one_task_per_node_spawns_the_device_groups(job, tmp_path):
    train_dir = tmp_path / "train_dir"
    r = _srun(job, ["-N1", "-n1"], _msf(train_dir, "pernode", "--nproc_per_node=2", f"--train_for_env_steps={STEPS}"))
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "pernode")
    assert s["status"] == "done" and s["env_steps"] >= STEPS
    assert (s["world_size"], s["nnodes"], s["nproc_per_node"], len(s["fps_per_rank"])) == (2, 1, 2, 2)
    assert job.leftovers(timeout=10) == []


def test_srun_one_task_per_device_group(job, tmp_path):
    train_dir = tmp_path / "train_dir"
    cmd = _msf(train_dir, "pergroup", f"--master_port={_free_port()}", f"--train_for_env_steps={STEPS}")
    r = _srun(job, ["-N1", "-n2"], cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "pergroup")
    assert s["status"] == "done" and s["env_steps"] >= STEPS
    # two Slurm tasks, each one rank (the task of rank 0 wrote the summary): not one task that spawned two
    assert (s["world_size"], s["nnodes"], s["nproc_per_node"], len(s["fps_per_rank"])) == (2, 1, 2, 2)
    labels = {line.split(":", 1)[0].strip() for line in (r.stdout + r.stderr).splitlines() if ":" in line}
    assert {"0", "1"} <= labels, r.stderr[-3000:]
    assert job.leftovers(timeout=10) == []


def test_sbatch_job_runs_to_done(job, tmp_path):
    train_dir = tmp_path / "train_dir"
    job_id = _sbatch(job, tmp_path, shlex.join(_msf(train_dir, "batch", f"--train_for_env_steps={STEPS}")))
    assert _wait_for(lambda: not _in_queue(job_id), RUN_TIMEOUT_S, every=2), _job_output(tmp_path)
    record = _job_record(job_id)
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), _job_output(tmp_path)
    s = read_summary(train_dir, "batch")
    assert s["status"] == "done" and s["env_steps"] >= STEPS
    assert (s["world_size"], s["nnodes"]) == (1, 1)
    assert job.leftovers(timeout=10) == []


class _PidWatcher:
    """The job's processes, sampled every 0.2 s while it runs: their torch shared memory in /dev/shm is named
    ``torch_<pid>_...``, so what they left there can be told from what other runs on this machine create."""

    def __init__(self, marker: bytes):
        self.marker, self.pids = marker, set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.2):
            self.pids.update(_pids_with(self.marker))

    def stop(self) -> set[int]:
        self.done.set()
        self.thread.join()
        return self.pids


@pytest.mark.parametrize("wrap", ["plain", "exec"])
def test_scancel_stops_an_sbatch_job_cleanly(job, tmp_path, wrap):
    """``plain``: ``--wrap "msf-train ..."``, the batch shell msf-train's parent (scancel's SIGTERM kills the
    shell, and msf-train finishes on its own, outside Slurm's sight); ``exec``: ``--wrap "exec msf-train ..."``,
    msf-train the batch step itself (its exit code is the job's)."""
    train_dir = tmp_path / "train_dir"
    exp_dir = train_dir / "cancel"
    # no periodic checkpoint: the one found at the end is the final one the stop wrote
    cmd = shlex.join(_msf(train_dir, "cancel", "--train_for_env_steps=100000000", "--save_every_sec=100000"))
    shm_before = set(os.listdir("/dev/shm"))
    watcher = _PidWatcher(job.marker)
    try:
        job_id = _sbatch(job, tmp_path, f"exec {cmd}" if wrap == "exec" else cmd)
        started = _wait_for(lambda: _train_steps_logged(exp_dir) >= 1 or not _in_queue(job_id), RUN_TIMEOUT_S)
        assert started and _in_queue(job_id), _job_output(tmp_path)
        assert _checkpoints(exp_dir) == []

        r = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        # Slurm's SIGKILL follows after KillWait: a clean stop is over before it
        assert _wait_for(lambda: not _in_queue(job_id), KILL_WAIT_S + SLACK_S), _job_output(tmp_path)
        assert job.leftovers(timeout=KILL_WAIT_S + SLACK_S) == [], _job_output(tmp_path)
    finally:
        pids = watcher.stop()

    record = _job_record(job_id)
    assert record["JobState"] == "CANCELLED"
    if wrap == "exec":
        assert record["ExitCode"] == "0:0", _job_output(tmp_path)  # msf-train's own: a clean stop
    s = read_summary(train_dir, "cancel")
    assert s["status"] == "stopped" and s["train_steps"] >= 1, _job_output(tmp_path)
    # the final checkpoint holds the state the summary reports
    assert _checkpoints(exp_dir)[-1:] == [(s["train_steps"], s["env_steps"])]
    left = sorted(
        f for f in set(os.listdir("/dev/shm")) - shm_before if f.startswith(tuple(f"torch_{p}_" for p in pids))
    )
    assert pids and left == [], left


def test_scancel_signal_usr1_writes_a_checkpoint_and_the_job_trains_on(job, tmp_path):
    """``scancel --signal=USR1 --full`` (what ``sbatch --signal=USR1@60`` sends a minute before the time limit, to
    every process of the job): it ended the workers and the run (SIGUSR1's default action). Now it is "checkpoint
    now": a checkpoint appears, the job keeps training, and a later plain ``scancel`` still stops it cleanly."""
    train_dir = tmp_path / "train_dir"
    exp_dir = train_dir / "usr1"
    cmd = shlex.join(_msf(train_dir, "usr1", "--train_for_env_steps=100000000", "--save_every_sec=100000"))
    job_id = _sbatch(job, tmp_path, f"exec {cmd}")
    try:
        started = _wait_for(lambda: _train_steps_logged(exp_dir) >= 1 or not _in_queue(job_id), RUN_TIMEOUT_S)
        assert started and _in_queue(job_id), _job_output(tmp_path)
        assert _checkpoints(exp_dir) == []
        r = subprocess.run(["scancel", "--signal=USR1", "--full", job_id], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert _wait_for(lambda: _checkpoints(exp_dir) != [] or not _in_queue(job_id), 30 + SLACK_S)
        steps_then = _train_steps_logged(exp_dir)
        # and it trains on
        assert _wait_for(lambda: _train_steps_logged(exp_dir) > steps_then or not _in_queue(job_id), 30 + SLACK_S)
        assert _in_queue(job_id), _job_output(tmp_path)
        asked = _checkpoints(exp_dir)
        assert len(asked) >= 1 and asked[0][0] >= 1
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    assert _wait_for(lambda: not _in_queue(job_id), KILL_WAIT_S + SLACK_S), _job_output(tmp_path)
    assert _job_record(job_id)["ExitCode"] == "0:0", _job_output(tmp_path)
    s = read_summary(train_dir, "usr1")
    assert s["status"] == "stopped"
    assert _checkpoints(exp_dir)[-1] == (s["train_steps"], s["env_steps"]) and s["train_steps"] > asked[0][0]
    assert job.leftovers(timeout=KILL_WAIT_S + SLACK_S) == []


def _script_on_this_host(script: str, port: int) -> str:
    """docs/slurm.md's script with what a GPU cluster has and this host has not swapped for CartPole on one core
    per component; every other line stays as the docs show it. Each swap must match exactly once, so an edit of
    the example that this test would no longer follow fails here."""
    learner_flags = [f for f in FLAGS if not f.startswith(("--num_workers=", "--num_envs_per_worker="))]
    swaps = [
        ("--gres=gpu:4 --cpus-per-task=16", "--cpus-per-task=1"),
        ("--nodes=4 --ntasks-per-node=1 --cpus-per-task=64", "--nodes=1 --ntasks-per-node=1 --cpus-per-task=1"),
        ("msf-train --env=atari_pong", "msf-train " + " ".join([*learner_flags, f"--train_for_env_steps={STEPS}"])),
        ("--nproc_per_node=4", "--nproc_per_node=1"),
        ("--num_workers=64 --num_envs_per_worker=8", "--num_workers=1 --num_envs_per_worker=4"),
        ("PORT=29600", f"PORT={port}"),
    ]
    for old, new in swaps:
        assert script.count(old) == 1, f"{HETJOB_SCRIPT} no longer holds {old!r} once"
        script = script.replace(old, new)
    return script


def _shims(bin_dir: Path) -> None:
    """``msf-train``, ``msf-sampler`` and ``python`` on PATH as a user's installation has them: this interpreter
    (whose environment may predate a console script)."""
    bin_dir.mkdir()
    for name, target in [("msf-train", "-m msf.train"), ("msf-sampler", "-m msf.sampler"), ("python", "")]:
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {target} "$@"\n')
        path.chmod(0o755)


def _nodes_up() -> int:
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    return len({line.split()[0] for line in r.stdout.splitlines() if line.split()[-1].startswith(UP_STATES)})


def test_heterogeneous_job_of_learners_and_sampler_nodes_runs_to_done(job, tmp_path):
    """examples/slurm/sampler_nodes_hetjob.sh (docs/slurm.md) submitted as it is, bar the GPU: component 0 runs
    msf-train with no rollout worker of its own, component 1 msf-sampler, which finds the learner's node with
    ``scontrol show hostnames`` and the key the script made in the submit folder. The run reaches its step budget
    on the sampler node's frames alone, and both components end with exit code 0."""
    if _nodes_up() < 2:
        pytest.skip(
            "a heterogeneous job needs two Slurm nodes: Slurm's backfill scheduler never starts two components on one "
            "node (scripts/slurm_local.sh start makes two, both this host)"
        )
    _shims(tmp_path / "bin")
    script = tmp_path / "hetjob.sh"
    script.write_text(_script_on_this_host(HETJOB_SCRIPT.read_text(), _free_port()))
    env = {**job.env(), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={job.name}", f"--output={tmp_path / 'job.out'}", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,  # the submit folder: the script makes the key there
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    assert _wait_for(lambda: not _in_queue(job_id), 2 * RUN_TIMEOUT_S, every=2), _job_output(tmp_path)

    out = _job_output(tmp_path)
    assert "learners exited 0, sampler nodes exited 0" in out, out
    # both components' records (one per component: scontrol lists them all under the first's id)
    rec = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    records = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in rec.stdout.splitlines()]
    assert [(x["HetJobOffset"], x["JobState"], x["ExitCode"]) for x in records] == [
        ("0", "COMPLETED", "0:0"),
        ("1", "COMPLETED", "0:0"),
    ], out
    assert records[0]["NodeList"] != records[1]["NodeList"]

    key = tmp_path / f"{job.name}.sampler.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(bytes.fromhex(key.read_text().strip())) == 32
    s = read_summary(tmp_path / "train_dir", job.name)
    assert s["status"] == "done" and s["env_steps"] >= STEPS, out
    (node,) = s["sampler_nodes"]["sources"].values()
    # no rollout worker of its own: every step trained on came from the sampler node, and its books balance
    assert (node["env_steps_kept"], node["env_steps_dropped"]) == (s["env_steps_trained"], s["env_steps_dropped"])
    assert s["env_steps_trained"] >= STEPS
    assert node["env_steps_sent"] == node["env_steps_received"] + node["env_steps_rejected"] + node["env_steps_lost"]
    assert node["env_steps_received"] == node["env_steps_kept"] + node["env_steps_dropped"] + node["env_steps_pending"]
    assert node["env_steps_rejected"] == node["env_steps_lost"] == 0
    assert job.leftovers(timeout=10) == []
