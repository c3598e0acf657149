"""Helpers for tests that run ``msf-train`` as a user would: a subprocess with a hard timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from msf.cfg.arguments import parse_args
from msf.cfg.presets import SMALL_ENV_FLAGS

# samples of one training iteration of the small-env settings: a run stops less than this past its budget
_SMALL_CFG = parse_args(["--env=CartPole-v1", *SMALL_ENV_FLAGS])[0]
SMALL_ITERATION = _SMALL_CFG.batch_size * _SMALL_CFG.num_batches_per_epoch
SMALL_SGD_STEPS = _SMALL_CFG.num_epochs * _SMALL_CFG.num_batches_per_epoch  # SGD steps of one iteration

HELPERS = str(Path(__file__).resolve().parents[1] / "helpers")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)  # the test envs, for the tests that make one in this process


# What a loaded machine may add to a bound on wall time: the start-up (imports, spawning the workers) and the
# teardown of a run. CI's 2 cores run a test's ranks, workers and engines at once: start-up alone was seen
# to take up to ~10 s there. A bound is "what the code promises + SLACK_S".
SLACK_S = 30.0


def msf_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = HELPERS + os.pathsep + env.get("PYTHONPATH", "")
    return env


def msf_command(args: list[str]) -> list[str]:
    """``python -m msf.train --device=cpu --with_progress_bar=False ARGS`` with this interpreter."""
    return [sys.executable, "-m", "msf.train", "--device=cpu", "--with_progress_bar=False", *args]


def run_msf(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m msf.train ARGS``; a hang fails the test after ``timeout`` seconds."""
    env = kw.pop("env", None) or msf_env()
    return subprocess.run(
        msf_command(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


def run_msf_together(arg_lists: list[list[str]], timeout: float) -> list[subprocess.CompletedProcess]:
    """Run several ``python -m msf.train ARGS`` at once, for runs whose results do not depend on the machine's
    load (``--deterministic=True``): they share the cores, and one's start-up overlaps another's training.
    Returns each run's completed process (text stdout and stderr), in the order given. A run still going after
    ``timeout`` seconds (from the start of all) fails the test: every run is killed and
    ``subprocess.TimeoutExpired`` is raised."""
    import tempfile
    import time

    procs, outs = [], []
    try:
        for args in arg_lists:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            outs.append((out, err))
            procs.append(subprocess.Popen(msf_command(args), stdout=out, stderr=err, text=True, env=msf_env()))
        deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        done = []
        for p, (out, err) in zip(procs, outs):
            out.seek(0), err.seek(0)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read()))
        return done
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for out, err in outs:
            out.close(), err.close()


def popen_msf(args: list[str], **kw) -> subprocess.Popen:
    # status lines every second: wait_until_training sees the first one soon
    return subprocess.Popen(
        msf_command(["--experiment_summaries_interval=1", *args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=msf_env(),
        **kw,
    )


def start_in_background_shell(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, int]:
    """``python -m msf.train ARGS`` started as a script starts it, ``bash -c 'msf-train ... & wait'``: a
    non-interactive shell starts a background job with SIGINT ignored. Returns the shell (in a session of its
    own; it exits with the job's exit code) and the job's pid, which a script would ``kill -INT``."""
    import shlex

    cmd = shlex.join(msf_command(args))
    sh = subprocess.Popen(
        ["bash", "-c", f"{cmd} & echo $!; wait $!"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or msf_env(),
        start_new_session=True,
    )
    return sh, int(sh.stdout.readline())


def sigint_disposition(pid: int) -> str:
    """How process ``pid`` takes SIGINT, from ``/proc/<pid>/status``: "ignored", "caught" (a handler) or
    "default"."""
    masks = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigIgn", "SigCgt"):
                masks[key] = int(value, 16)
    bit = 1 << (2 - 1)  # SIGINT is signal 2
    return "ignored" if masks["SigIgn"] & bit else "caught" if masks["SigCgt"] & bit else "default"


def read_summary(train_dir: Path, experiment: str) -> dict:
    return json.loads((train_dir / experiment / "summary.json").read_text())


def wait_until_training(exp_dir: Path, timeout: float = 60.0) -> None:
    """Wait until the run's log shows its first status line (training is under way).

    Raises:
        AssertionError: none within ``timeout`` seconds (with the log's end, if there is a log), rather than the
            caller's next step failing on what is not there.
    """
    import time

    log = exp_dir / "log.txt"
    deadline = time.monotonic() + timeout
    while not (log.exists() and "frames" in log.read_text()):
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log.exists() else f"(no {log})"
            raise AssertionError(f"no status line within {timeout:.0f} s:\n{tail}")
        time.sleep(0.5)


def session_of(pid: int) -> int | None:
    """The session id of process ``pid`` (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])  # field 6: the session id
    except (OSError, IndexError, ValueError):
        return None


def live_processes_of_session(sid: int) -> list[int]:
    """The pids of the processes of session ``sid`` that are not zombies (a run started with
    ``start_new_session=True``: every process it starts, directly or not, is in its session)."""
    pids = []
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # the state, then the parent, group, session
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(pid)
    return pids


def semaphores_of_session(sid: int) -> set[str]:
    """The named semaphores (/dev/shm/sem.*) that the processes of session ``sid`` have mapped."""
    files = set()
    for e in os.listdir("/proc"):
        if e.isdigit() and session_of(int(e)) == sid:
            try:
                with open(f"/proc/{e}/maps") as f:
                    files |= {line.split()[-1] for line in f if line.split()[-1].startswith("/dev/shm/sem.")}
            except OSError:
                pass
    return files


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` at once, the workers' own process groups included (as a
    container's or a job's kill does)."""
    import signal

    for e in os.listdir("/proc"):
        if e.isdigit() and session_of(int(e)) == sid:
            try:
                os.kill(int(e), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def train_dir(tmp_path: Path) -> Path:
    return tmp_path / "train_dir"


TRAINED_STEPS = 300_000


@pytest.fixture(scope="session")
def trained_cartpole(tmp_path_factory) -> Path:
    """One CartPole-v1 run of 300k steps with the small-env settings (seed 0), trained once for the
    tests that check it, evaluate it and plot it; best checkpoints kept from the start. Returns the
    experiment folder."""
    train_dir = tmp_path_factory.mktemp("trained") / "train_dir"
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=cartpole_s0",
            f"--train_dir={train_dir}",
            "--seed=0",
            f"--train_for_env_steps={TRAINED_STEPS}",
            "--save_best_after=0",
            "--save_best_every_sec=0",
            "--experiment_summaries_interval=2",
            *SMALL_ENV_FLAGS,
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return train_dir / "cartpole_s0"


def first_step_reaching(exp_dir: Path, threshold: float, tag: str = "episode/return_mean") -> int | None:
    """The first env step of the run's TensorBoard curve ``tag`` at or above ``threshold`` (None: never)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return None
    return next((e.step for e in acc.Scalars(tag) if e.value >= threshold), None)


def write_untrained_checkpoint(cfg, spaces):
    """``cfg.train_dir/cfg.experiment`` with its config.json and one checkpoint of a freshly initialised learner
    (``torch.manual_seed(0)``), written by msf's own functions, for msf-enjoy and msf-export. Returns the model, in
    eval mode."""
    import torch

    from msf.cfg.config import Derived
    from msf.learning.learner import Learner
    from msf.persistence.checkpoint import save_checkpoint, snapshot
    from msf.persistence.train_state import TrainState
    from msf.runner.experiment import prepare_experiment_dir

    torch.manual_seed(0)
    learner = Learner(cfg, Derived.of(cfg), spaces)
    state = TrainState.fresh(1, cfg.stats_avg)
    save_checkpoint(snapshot(state.capture(0, learner, cfg.to_dict(), 1)), prepare_experiment_dir(cfg), keep=2)
    return learner.model.eval()
