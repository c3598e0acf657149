"""Bad input, a failing environment, and Ctrl-C / SIGTERM: clear errors, no hang, nothing lost."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from .conftest import SLACK_S, popen_msf, read_summary, run_msf, wait_until_training

INT, TERM = signal.SIGINT, signal.SIGTERM
# a small CartPole run: 2 workers of 4 envs, iterations of 256 samples, a small MLP
SMALL_RUN = ["--num_workers=2", "--num_envs_per_worker=4", "--batch_size=256", "--encoder_mlp_layers", "32"]


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--env=NoSuchEnv-v0", "--env: unknown environment 'NoSuchEnv-v0'"),
        ("--batch_size=100", "--batch_size: must be a multiple of rollout=32"),
        ("--num_workers=-1", "--num_workers: must be a positive integer, got -1"),
        ("--recurrence=64", "--recurrence: must not be longer than rollout=32"),
        ("--recurrence=5", "--recurrence: must divide rollout=32"),
        ("--worker_num_splits=3", "--worker_num_splits: must divide num_envs_per_worker=2"),
        ("--lr_schedule=cosine", "argument --lr_schedule: invalid choice: 'cosine'"),
        ("--gamma=1.5", "--gamma: must be in [0, 1], got 1.5"),
        ("--res_w=0", "--res_w: must be a positive integer, got 0"),
        ("--atari_screen_size=0", "--atari_screen_size: must be a positive integer, got 0"),
        ("--num_policies=0", "--num_policies: must be in [1, 64], got 0"),
        ("--with_pbt=True", "--with_pbt: needs --num_policies of at least 2"),
        ("--train_dir=/proc/msf_not_writable", "--train_dir: '/proc/msf_not_writable' is not a writable folder"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, flag, expected):
    args = ["--experiment=bad", "--num_workers=1", f"--train_dir={tmp_path}", flag]
    # later flags win, so the flag under test overrides the defaults given before it
    t0 = time.monotonic()
    r = run_msf(args, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], r.stderr
    assert lines[0].startswith("msf-train: error: ")
    assert not (tmp_path / "bad").exists()  # nothing was started
    assert time.monotonic() - t0 < SLACK_S  # refused before anything is spawned: only the imports take time


def test_default_niceness_sets_the_learner_and_the_workers_follow(train_dir):
    """--default_niceness=4 in a run started at niceness 1: learner 4, inference worker 6, rollout workers 14
    (Sample Factory's offsets), each as the process reads it back from the OS."""
    import os

    if os.getpriority(os.PRIO_PROCESS, 0) > 0:
        pytest.skip("this test process already runs niced")
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=nice",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--default_niceness=4",
            "--train_for_env_steps=3000",
            "--encoder_mlp_layers",
            "32",
        ],
        timeout=90,
        preexec_fn=lambda: os.nice(1),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    log = (train_dir / "nice" / "log.txt").read_text()
    assert "learner runs at niceness 4" in log
    assert "inference worker of policy 0 runs at niceness 6" in r.stderr
    assert all(f"rollout worker {w} runs at niceness 14" in r.stderr for w in range(2)), r.stderr[-3000:]


def test_env_failure_ends_run_and_keeps_checkpoint(train_dir):
    exp = train_dir / "fail"
    t0 = time.monotonic()
    r = run_msf(
        [
            "--env=msf_test_envs:MsfFailingCartPole-v0",
            "--experiment=fail",
            f"--train_dir={train_dir}",
            *SMALL_RUN,
            "--save_every_sec=1",
        ],
        timeout=90,
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    assert elapsed < 4 + SLACK_S  # the env fails after 4 s; start-up and teardown take the rest
    log = (exp / "log.txt").read_text()
    assert "RuntimeError: deliberate failure inside the environment" in log
    assert "rollout_worker_" in log  # the failing component is named
    s = read_summary(train_dir, "fail")
    assert s["status"] == "failed", s
    # one line: the env, its exception and where in its code, the worker and the env index
    assert "MsfFailingCartPole-v0's step raised RuntimeError: deliberate failure inside the environment" in s["error"]
    assert ", on rollout worker " in s["error"] and "\n" not in s["error"], s["error"]
    ckpts = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert ckpts, "the checkpoints written before the failure must survive"
    state = torch.load(ckpts[-1], weights_only=True)
    assert state["env_steps"] > 0


@pytest.mark.parametrize(
    "env, field, value", [("MsfNanCartPole", "observation", "nan"), ("MsfInfRewardCartPole", "reward", "inf")]
)
def test_a_non_finite_observation_or_reward_ends_the_run_in_one_line_naming_the_env(train_dir, env, field, value):
    """Env 5 (of rollout worker 1) returns a NaN observation or an infinite reward at step 5 of its 30th episode:
    the run fails with one line naming the env, the worker, the env index, the episode step and the field (on
    stderr and as summary.json's ``error``), not with torch's sampling error in the inference worker; no
    checkpoint written holds a non-finite value."""
    exp = train_dir / "nonfinite"
    r = run_msf(["--env=msf_test_envs:" + env, "--experiment=nonfinite", f"--train_dir={train_dir}", *SMALL_RUN], 90)
    assert r.returncode == 1, r.stderr[-3000:]
    line = f"msf_test_envs:{env} returned a non-finite {field} ({value}) on rollout worker 1, env 5, at episode step 5"
    s = read_summary(train_dir, "nonfinite")
    assert s["status"] == "failed" and s["error"].startswith("rollout_worker_1 (pid "), s
    assert s["error"].endswith(f" failed: {line}"), s["error"]
    _assert_the_books_close(s, 256, 32)  # also in a failed run
    assert r.stderr.strip().splitlines()[-1].startswith(f"msf-train: a device group failed: {s['error']} (details")
    log = (exp / "log.txt").read_text()
    assert "Traceback" not in log and "probability tensor" not in log, log[-3000:]
    ckpts = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert ckpts  # the learners' state after the failure
    for path in ckpts:
        model = torch.load(path, weights_only=True)["model"]
        assert all(t.isfinite().all() for t in model.values() if t.is_floating_point()), path


@pytest.mark.slow  # 20-25 s each; the default suite keeps test_env_failure_ends_run_and_keeps_checkpoint
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_workers_failure_saves_the_learners_state_and_a_rerun_resumes_from_it(train_dir, nproc):
    """An env that raises ends the run (status ``failed``, exit code 1), but the learners were between two
    iterations, so their state is saved: with no periodic checkpoint (``--save_every_sec=1000``) a failed run kept
    nothing, and its rerun started from step 0. Now the checkpoint holds exactly what the failed run's summary
    counts, and the rerun (failing the same way 4 s into its own training) resumes from it and counts on."""
    args = [
        "--env=msf_test_envs:MsfFailingCartPole-v0",
        "--experiment=failsave",
        f"--train_dir={train_dir}",
        f"--nproc_per_node={nproc}",
        *SMALL_RUN,
        "--save_every_sec=1000",
    ]
    summaries = []
    for _ in range(2):
        r = run_msf(args, timeout=120)
        assert r.returncode == 1, r.stderr[-3000:]
        s = read_summary(train_dir, "failsave")
        assert s["status"] == "failed" and s["train_steps"] > 0, s
        ckpts = sorted((train_dir / "failsave" / "checkpoint_p0").glob("checkpoint_*.pth"))
        state = torch.load(ckpts[-1], weights_only=True)
        assert (state["env_steps"], state["train_step"]) == (s["env_steps"], s["train_steps"])
        summaries.append(s)
    assert len(ckpts) == 2  # one per attempt, no periodic one
    assert summaries[1]["env_steps"] > summaries[0]["env_steps"]  # resumed: counted on from the first attempt's


def test_a_crash_in_native_code_is_named_as_the_cause(train_dir):
    """A rollout worker killed by SIGSEGV reports nothing; its inference worker then fails on the closed
    pipe. The error names the crashed worker and the signal first, and the checkpoints survive."""
    exp = train_dir / "crash"
    r = run_msf(
        [
            "--env=msf_test_envs:MsfCrashingCartPole",
            "--experiment=crash",
            f"--train_dir={train_dir}",
            *SMALL_RUN,
            "--save_every_sec=1",
        ],
        timeout=90,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    log = (exp / "log.txt").read_text()
    assert "rollout_worker_0 (pid " in log and ") was killed by signal SIGSEGV" in log, log[-3000:]
    error = [ln for ln in log.splitlines() if "ERROR run failed:" in ln][0]
    assert "rollout_worker_0" in error and "SIGSEGV" in error  # named first, on the error's own line
    assert read_summary(train_dir, "crash")["status"] == "failed"
    assert sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth")), "the checkpoints must survive"


def test_an_env_maker_that_raises_in_a_worker_is_one_line_on_the_terminal(train_dir):
    """A NameError in the user's maker, first met in a rollout worker (its spaces are declared, so msf-train makes
    no env itself): the terminal gets one line naming the worker, the env and the exception, never the
    traceback, which log.txt keeps."""
    r = run_msf(
        ["--env=msf_test_envs:MsfTypoCartPole", "--experiment=typo", f"--train_dir={train_dir}", *SMALL_RUN],
        timeout=90 + SLACK_S,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = [ln for ln in r.stderr.splitlines() if "ERROR run failed:" in ln]
    assert "rollout_worker_" in line and "--env=msf_test_envs:MsfTypoCartPole: making the env raised NameError: " in (
        line
    ), line
    assert "name 'CartPol' is not defined (msf_test_envs.py:" in line, line
    log = (train_dir / "typo" / "log.txt").read_text()
    assert "Traceback" in log and "in _make_with_a_typo" in log, log[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_cleanly_with_final_checkpoint(train_dir, sig):
    p = popen_msf(
        [
            "--env=CartPole-v1",
            "--experiment=sig",
            f"--train_dir={train_dir}",
            *SMALL_RUN,
            "--save_every_sec=1000",
        ]
    )
    try:
        wait_until_training(train_dir / "sig")
        assert p.poll() is None, "the run ended before the signal"
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    s = read_summary(train_dir, "sig")
    assert s["status"] == "stopped"
    ckpts = sorted((train_dir / "sig" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert len(ckpts) == 1  # save_every_sec=1000: this is the final one
    assert torch.load(ckpts[-1], weights_only=True)["env_steps"] == s["env_steps"]


def _assert_the_books_close(s: dict, samples_per_iteration: int, rollout: int) -> None:
    """Per policy and in total, ``env_steps`` = trained + dropped + discarded, each counted on its own: trained
    from the policy's training iterations (one SGD step each here), dropped from ``dropped_trajectories``."""
    keys = ("env_steps_trained", "env_steps_dropped", "env_steps_discarded")
    for b in s["policies"].values():
        assert b["env_steps"] == sum(b[k] for k in keys) and b["env_steps_discarded"] >= 0, b
        assert b["env_steps_trained"] == b["train_steps"] * samples_per_iteration, b
    assert s["env_steps"] == sum(b["env_steps"] for b in s["policies"].values()) == sum(s[k] for k in keys), s
    assert all(s[k] == sum(b[k] for b in s["policies"].values()) for k in keys), s
    assert s["env_steps_dropped"] == s["dropped_trajectories"] * rollout, s


def test_the_books_close_on_a_stop_and_on_the_resumed_run(train_dir):
    """Frames taken out of the buffers = trained + dropped as too old + discarded at the end, per policy and in
    total, in summary.json: after a Ctrl-C (the batches taken at the stop are discarded), and in the run that
    resumes from its checkpoint and counts on."""
    args = ["--env=CartPole-v1", "--experiment=books", f"--train_dir={train_dir}", *SMALL_RUN, "--num_policies=2"]
    p = popen_msf([*args, "--save_every_sec=1000"])
    try:
        wait_until_training(train_dir / "books")
        p.send_signal(INT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    s = read_summary(train_dir, "books")
    assert (p.returncode, s["status"]) == (0, "stopped"), err[-3000:]
    _assert_the_books_close(s, 256, 32)
    r = run_msf([*args, f"--train_for_env_steps={s['env_steps'] + 4096}"], timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = read_summary(train_dir, "books")
    assert resumed["status"] == "done" and resumed["resumed_from_env_steps"] == s["env_steps"], resumed
    _assert_the_books_close(resumed, 256, 32)
    assert all(resumed["policies"][q]["env_steps"] > s["policies"][q]["env_steps"] for q in ("0", "1"))


def _start_in_own_session(train_dir, name: str, nproc: int):
    """A CartPole run on ``nproc`` device groups in a session (and process group) of its own, with no periodic
    checkpoint (the one found at the end is the final one)."""
    args = ["--env=CartPole-v1", f"--experiment={name}", f"--train_dir={train_dir}", f"--nproc_per_node={nproc}"]
    return popen_msf([*args, "--save_every_sec=1000"], start_new_session=True)


def _assert_stopped_with_a_final_checkpoint(train_dir, name: str, code: int, err: str) -> None:
    s = read_summary(train_dir, name)
    assert (code, s["status"]) == (0, "stopped"), err[-3000:]
    assert len(list((train_dir / name / "checkpoint_p0").glob("checkpoint_*.pth"))) == 1  # the final one


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_fork_server_is_survived_or_named(train_dir, sig):
    """The workers' fork server is in msf-train's process group, so a SIGTERM to the group (Slurm's ``scancel`` of
    a batch script running msf-train) reaches it too. It ended the server, every worker it forked then read as
    "exited with code 255", and the clean stop became a failure (status ``failed``, exit code 1). Now the server
    ignores SIGTERM and the stop is clean; a server killed outright (SIGKILL, the OOM killer) is named as the
    cause instead of the workers' exit code 255."""
    from msf.runtime.reaping import command_line

    p = _start_in_own_session(train_dir, "fs", 1)
    try:
        wait_until_training(train_dir / "fs")
        servers = [c for c in _descendants(p.pid) if any("forkserver import main" in a for a in command_line(c))]
        server = [c for c in servers if _parent_of(c) == p.pid]
        assert len(server) == 1, servers
        os.kill(server[0], sig)
        time.sleep(2.0)  # the run goes on (SIGTERM), or sees its workers' loss (SIGKILL: it polls them every 0.5 s)
        if sig == signal.SIGTERM:
            assert p.poll() is None, "the run ended: " + p.communicate()[1][-3000:]
            os.killpg(p.pid, signal.SIGTERM)  # as scancel does: the whole group
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    if sig == signal.SIGTERM:
        _assert_stopped_with_a_final_checkpoint(train_dir, "fs", p.returncode, err)
    else:
        assert (p.returncode, read_summary(train_dir, "fs")["status"]) == (1, "failed"), err[-3000:]
        error = [ln for ln in err.splitlines() if ln.startswith("msf-train: ")][-1]
        assert f"was lost with the workers' fork server (pid {server[0]}), which died" in error, error
        assert "code 255" not in error, error


# one group's SIGTERM is also test_signal_stops_cleanly_with_final_checkpoint's; the default suite keeps two groups
@pytest.mark.parametrize("nproc", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_a_sigterm_to_every_process_of_the_job_stops_it_cleanly(train_dir, nproc):
    """Slurm's ``scancel`` (its cgroup process tracking) and systemd's control-group kill send SIGTERM to every
    process of the job, not only to a process group: the workers (each leads a group of its own) died of it, and
    the clean stop that the main process was making failed ("inference_worker_0 (pid N) was killed by signal
    SIGTERM", no final checkpoint). The workers now ignore SIGTERM; msf ends them itself."""
    p = _start_in_own_session(train_dir, "all", nproc)
    try:
        wait_until_training(train_dir / "all")
        below = _descendants(p.pid)
        assert len(below) >= 4 * nproc, below  # the ranks, the fork servers and the workers
        # msf-train and its children (the ranks, multiprocessing's helpers) 1 s after the others (the fork servers,
        # the workers): in whatever order the job's manager signals them, none may end the run
        first = [c for c in below if _parent_of(c) != p.pid]
        for group in (first, [c for c in below if c not in first] + [p.pid]):
            for pid in group:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if group is first:
                time.sleep(1.0)
                assert p.poll() is None, "the run ended: " + p.communicate()[1][-3000:]
        out, err = p.communicate(timeout=60 + SLACK_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    _assert_stopped_with_a_final_checkpoint(train_dir, "all", p.returncode, err)


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_sighup_to_the_process_group_stops_cleanly(train_dir, nproc):
    """A closed terminal or a dropped ssh session sends SIGHUP to the foreground process group: it ended the run at
    once (exit code 129, no summary, no final checkpoint) and multiprocessing's resource tracker, killed with it,
    printed a ``KeyError`` traceback per semaphore. It is a stop now, as SIGTERM is."""
    p = _start_in_own_session(train_dir, "hup", nproc)
    try:
        wait_until_training(train_dir / "hup")
        os.killpg(p.pid, signal.SIGHUP)
        out, err = p.communicate(timeout=60 + SLACK_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    _assert_stopped_with_a_final_checkpoint(train_dir, "hup", p.returncode, err)
    assert "Traceback" not in err, err[-3000:]


def test_ranks_whose_launcher_was_killed_outright_stop_with_a_final_checkpoint(train_dir):
    """A node launcher killed outright (``kill -9``, the OOM killer) sends its ranks torch's death signal, SIGINT,
    once per thread of each rank. The ranks took the second for a second Ctrl-C and exited at once: everything since
    the last checkpoint was lost (4 tries of 4 by hand). It is one stop now: each rank ends its iteration, writes
    the final checkpoint and the summary, and nothing of the job is left."""
    p = _start_in_own_session(train_dir, "orphans", 2)
    try:
        wait_until_training(train_dir / "orphans")
        os.kill(p.pid, signal.SIGKILL)
        # the ranks and their workers hold the pipes until they have all ended
        out, err = p.communicate(timeout=60 + SLACK_S)
        left = _live_session_processes(p.pid)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert left == [], left
    s = read_summary(train_dir, "orphans")
    assert s["status"] == "stopped", err[-3000:]
    (final,) = (train_dir / "orphans" / "checkpoint_p0").glob("checkpoint_*.pth")
    assert final.name.endswith(f"_{s['env_steps']}.pth"), (final.name, s["env_steps"])


@pytest.mark.parametrize(
    "nproc, to",
    # the default suite keeps the launcher's forwarding to two groups; a SIGUSR1 to every process runs with -m slow
    [
        pytest.param(1, "every", marks=pytest.mark.slow),
        (2, "launcher"),
        pytest.param(2, "every", marks=pytest.mark.slow),
    ],
)
def test_a_sigusr1_writes_a_checkpoint_and_the_run_goes_on(train_dir, nproc, to):
    """SIGUSR1 is "checkpoint now" (Slurm's ``--signal=USR1@60``, which without ``B:`` reaches every process of the
    job step): it ended every worker and the run at once (its default action), losing everything since the last
    periodic checkpoint. Now msf-train writes a checkpoint after the current iteration and trains on; its children
    ignore the signal; a launcher of several device groups passes it on to its ranks."""
    name = f"usr1_{nproc}_{to}"
    p = _start_in_own_session(train_dir, name, nproc)  # no periodic checkpoint
    ckpts = train_dir / name / "checkpoint_p0"
    try:
        wait_until_training(train_dir / name)
        assert not list(ckpts.glob("checkpoint_*.pth"))
        for pid in (_descendants(p.pid) if to == "every" else []) + [p.pid]:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30 + SLACK_S
        while not list(ckpts.glob("checkpoint_*.pth")) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        time.sleep(2.0)  # and the run goes on
        assert p.poll() is None, "the run ended: " + p.communicate()[1][-3000:]
        written = sorted(ckpts.glob("checkpoint_*.pth"))
        # one request, one checkpoint (the ranks' handlers ran an iteration apart, and each made one); a signal to
        # every process reaches a rank twice (from the job's manager and from the launcher), a moment apart
        assert len(written) == 1 if to == "launcher" or nproc == 1 else 1 <= len(written) <= 2, written
        asked = torch.load(written[0], weights_only=True)["env_steps"]
        assert asked > 0
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=60 + SLACK_S)
        left = _session_processes(p.pid)  # at once: msf-train reaps its fork servers before it exits
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert not [c for c in left if "forkserver" in c], left
    s = read_summary(train_dir, name)
    assert (p.returncode, s["status"]) == (0, "stopped"), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    final = sorted(ckpts.glob("checkpoint_*.pth"))
    assert len(final) == 2  # the newest asked-for one and the final one (--keep_checkpoints=2)
    assert torch.load(final[-1], weights_only=True)["env_steps"] == s["env_steps"] > asked


# What a stop promises: the next agreement (one iteration), the final checkpoint, the workers' exit
STOP_S = 5.0


def test_a_scripts_background_job_starts_with_sigint_ignored():
    """The premise of the next test: what ``bash -c 'job & wait'`` gives its job."""
    import subprocess

    out = subprocess.run(["bash", "-c", "grep SigIgn /proc/self/status & wait"], capture_output=True, text=True)
    assert int(out.stdout.split()[1], 16) & (1 << (signal.SIGINT - 1)), out.stdout


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])  # 10 s; one group in the default suite
def test_sigint_to_the_launcher_of_a_scripts_background_job_stops_cleanly(train_dir, nproc):
    """``kill -INT <pid>`` of msf-train started in the background by a script (SIGINT ignored): with several
    device groups the launcher ignored SIGINT and the job trained on. It is a Ctrl-C now: a clean stop."""
    import os
    import re

    from .conftest import sigint_disposition, start_in_background_shell

    exp = train_dir / f"bg{nproc}"
    sh, pid = start_in_background_shell(
        [
            "--env=CartPole-v1",
            f"--experiment=bg{nproc}",
            f"--train_dir={train_dir}",
            f"--nproc_per_node={nproc}",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--encoder_mlp_layers",
            "32",
            "--save_every_sec=1000",
            "--experiment_summaries_interval=1",
        ]
    )
    try:
        wait_until_training(exp)
        assert sh.poll() is None, "the run ended before the signal"
        # the processes that decide how to stop catch SIGINT, whatever they inherited; their workers ignore it
        deciders = [pid]
        if nproc > 1:
            logged = re.findall(r"\[rank \d\]\[[^\]]+\]\[pid (\d+)\]", (exp / "log.txt").read_text())
            deciders += sorted({int(p) for p in logged} - {pid})  # the ranks' lines (and the launcher's)
            assert len(deciders) == 1 + nproc
        assert [sigint_disposition(p) for p in deciders] == ["caught"] * len(deciders)
        workers = [c for p in deciders for c in _descendants(p) if c not in deciders]
        assert len(workers) >= 3 and {sigint_disposition(c) for c in workers} == {"ignored"}  # (and the tracker)
        os.kill(pid, signal.SIGINT)
        t0 = time.monotonic()
        _, err = sh.communicate(timeout=STOP_S + SLACK_S + 30)
        elapsed = time.monotonic() - t0
    finally:
        if sh.poll() is None:
            os.killpg(sh.pid, signal.SIGKILL)
    assert sh.returncode == 0, err[-3000:]
    assert elapsed < STOP_S + SLACK_S, elapsed
    s = read_summary(train_dir, f"bg{nproc}")
    assert (s["status"], s["world_size"]) == ("stopped", nproc)
    ckpts = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert len(ckpts) == 1  # save_every_sec=1000: the final one
    assert torch.load(ckpts[0], weights_only=True)["env_steps"] == s["env_steps"] > 0


def test_second_ctrl_c_exits_at_once(train_dir):
    """A second Ctrl-C while the clean stop of the first is under way (the workers close envs that take 8 s to
    close) ends the process at once, with 130."""
    p = popen_msf(
        [
            "--env=msf_test_envs:MsfSlowCloseCartPole-v0",
            "--experiment=sig2",
            f"--train_dir={train_dir}",
            "--num_workers=1",
            "--encoder_mlp_layers",
            "32",
        ]
    )
    try:
        wait_until_training(train_dir / "sig2")
        p.send_signal(signal.SIGINT)
        time.sleep(0.2)  # two signals in the same instant are delivered as one
        p.send_signal(signal.SIGINT)
        p.wait(timeout=5)  # the clean stop would take 5 s or more: the stop's grace (the orphaned workers still
        # close them, holding the pipes of stdout and stderr meanwhile: so no communicate() here)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, p.returncode  # os._exit(130), not the clean stop's 0


def test_ctrl_c_during_start_up_exits_130_even_when_started_with_sigint_ignored(train_dir):
    """A script's background job inherits SIGINT ignored; msf-train still honours a Ctrl-C before training."""
    import subprocess
    import sys

    from .conftest import msf_env

    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "msf.train",
            "--device=cpu",
            "--env=CartPole-v1",
            "--experiment=early",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--train_for_env_steps=5000000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=msf_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-2000:]
    assert "interrupted before training began" in err


def test_a_ctrl_c_during_the_start_up_of_an_existing_experiment_keeps_its_folder(train_dir):
    """Only a folder that this msf-train made is removed when a Ctrl-C ends its start-up: an existing experiment's
    stays as it was (its files included), whether the SIGINT ends the start-up (130) or stops it cleanly (0)."""
    import os
    import subprocess

    from .conftest import msf_command, msf_env

    exp = train_dir / "existing"
    exp.mkdir(parents=True)
    (exp / "keep.txt").write_text("a file of the user's")
    p = subprocess.Popen(
        msf_command(["--env=CartPole-v1", "--experiment=existing", f"--train_dir={train_dir}", "--num_workers=2"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=msf_env(),
    )
    try:
        deadline = time.monotonic() + 60 + SLACK_S
        while not (exp / "config.json").exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert (exp / "config.json").exists()  # the folder was prepared for this run: the SIGINT comes after
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60 + SLACK_S)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode in (0, 130), err[-2000:]
    assert (exp / "keep.txt").read_text() == "a file of the user's"
    assert os.path.exists(exp / "config.json")


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read()
    except OSError:
        return False


@pytest.mark.slow  # 23-25 s for each group count on 2 cores
@pytest.mark.parametrize(
    "nproc, tries",
    [
        # from msf's imports (about 0.3 s in) through torch's (to about 3 s on a loaded machine) and beyond; a
        # SIGTERM only from 1 s on (before msf's first line runs, Python's default ends the process by it)
        (
            1,
            [(0.3, "pid", INT), (0.6, "pid", INT), (1.0, "pid", INT), (1.5, "group", INT), (2.0, "pid", INT)]
            + [(2.5, "pid", INT), (3.0, "group", INT), (1.0, "pid", TERM), (2.0, "group", TERM), (3.0, "pid", TERM)],
        ),
        pytest.param(
            2,
            [(0.5, "pid", INT), (2.0, "group", INT), (3.0, "pid", INT), (4.0, "group", INT), (6.0, "pid", INT)]
            + [(1.5, "group", TERM), (4.0, "pid", TERM)],
            id="2-tries1",
        ),
    ],
)
def test_sigint_at_any_moment_of_the_start_up_ends_it_with_130_and_one_line(train_dir, nproc, tries):
    """A SIGINT to msf-train (to its pid, or to its process group as a terminal's Ctrl-C), or a SIGTERM (``kill``,
    ``scancel``), while it starts: exit code 130 and one line, or, once the workers were being started, a clean
    stop before the first training step (exit 0, status stopped). Before, a Ctrl-C during the imports of msf.train
    (0.6-0.8 s in on a loaded machine) escaped as KeyboardInterrupt: a traceback and exit code -2; one during
    torch's import, caught, still ended ``python -m msf.train`` with -2 (CPython's doing: see msf/runtime/signals.py); a
    SIGTERM ended it by the signal (-15) without a word and left the experiment folder. Nothing is left behind: no
    process, and after exit code 130 no experiment folder."""
    import os
    import subprocess
    import sys
    import uuid

    from msf import INTERRUPTED_BEFORE_TRAINING

    from .conftest import msf_env

    marker = f"MSF_TEST_MARKER={uuid.uuid4().hex}"
    env = msf_env()
    env.update([marker.split("=")])
    outcomes = []
    for i, (delay, to, sig) in enumerate(tries):
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "msf.train",
                "--device=cpu",
                "--env=CartPole-v1",
                f"--experiment=early{i}",
                f"--train_dir={train_dir}",
                f"--nproc_per_node={nproc}",
                "--num_workers=2",
                "--with_progress_bar=False",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            time.sleep(delay)
            if to == "group":
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
            _, err = p.communicate(timeout=60 + SLACK_S)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        outcomes.append((delay, to, sig.name, p.returncode))
        assert p.returncode in (0, 130), (delay, to, sig.name, p.returncode, err[-3000:])
        for bad in ("Traceback", "KeyboardInterrupt", "EOFError", "leaked semaphore"):
            assert bad not in err, (delay, to, err[-3000:])
        exp = train_dir / f"early{i}"
        if p.returncode == 130:
            # besides the run's log lines ("[12:00:00][...] ..."), this one line
            assert [ln for ln in err.splitlines() if not ln.startswith("[")] == [INTERRUPTED_BEFORE_TRAINING]
            # nothing saved: the new experiment's folder is gone too (its config.json made a rerun of the same
            # --experiment resume with this attempt's flags)
            assert not exp.exists(), sorted(f.name for f in exp.iterdir())
        else:
            s = read_summary(train_dir, f"early{i}")
            assert s["status"] == "stopped", s
            saved = list(exp.glob("checkpoint_p*/checkpoint_*.pth"))
            # nothing trained, nothing saved; on a fast machine the later tries land after the first training step,
            # and then the clean stop keeps what was trained (a final checkpoint)
            assert bool(saved) == (s["train_steps"] > 0), (s["train_steps"], saved)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        _environ_has(int(d), marker.encode()) for d in os.listdir("/proc") if d.isdigit()
    ):
        time.sleep(0.2)
    left = [int(d) for d in os.listdir("/proc") if d.isdigit() and _environ_has(int(d), marker.encode())]
    assert left == [], f"processes left behind: {left} ({outcomes})"
    assert any(code == 130 for *_, code in outcomes), outcomes  # the tries did land in the start-up
    assert any(code == 130 for _, _, name, code in outcomes if name == "SIGTERM"), outcomes


def test_a_ctrl_c_inside_code_run_by_exec_still_ends_the_start_up_with_130(tmp_path):
    """The SIGINT comes inside code that ``exec`` runs from a string (as in the methods that dataclasses build
    during torch's import); caught by msf-train, it still made ``python -m msf.train`` end by SIGINT: -2."""
    from msf import INTERRUPTED_BEFORE_TRAINING

    r = run_msf(["--env=interrupt_on_import:CartPole-v1", "--experiment=exec", f"--train_dir={tmp_path}"], timeout=60)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines() == [INTERRUPTED_BEFORE_TRAINING]


def test_ctrl_c_to_the_process_group_while_workers_start_is_quiet_and_saves_nothing(train_dir):
    """A terminal's Ctrl-C reaches every process of the group; the workers, still importing, ignore it."""
    import os
    import subprocess
    import sys

    from .conftest import msf_env

    exp = train_dir / "startup"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "msf.train",
            "--device=cpu",
            "--env=CartPole-v1",
            "--experiment=startup",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_policies=2",
            "--with_progress_bar=False",
            "--train_for_env_steps=5000000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=msf_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_workers(p.pid)) < 4:  # 2 inference + 2 rollout workers
            time.sleep(0.02)
        assert not (exp / "log.txt").exists() or "frames" not in (exp / "log.txt").read_text()  # not training yet
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode in (0, 130), err[-2000:]
    # no child raises KeyboardInterrupt. (Known, rarer: a child whose start-up data the exiting main process
    # had not finished writing prints an EOFError; see the session note.)
    assert "KeyboardInterrupt" not in err, err[-3000:]
    assert not list(exp.glob("checkpoint_p*/checkpoint_*.pth"))  # nothing was trained: nothing saved


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children (the resource tracker, the fork server) and theirs (the workers,
    forked by the fork server)."""
    import subprocess

    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    parent = {int(c): int(pp) for c, pp in (line.split() for line in out.splitlines())}
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def _workers(pid: int) -> list[int]:
    """The descendants of ``pid`` other than multiprocessing's resource tracker and fork server (their command
    lines name them; a process forked by the fork server has the server's command line, but not its parent)."""
    from msf.runtime.reaping import command_line

    helpers = {
        c for c in _descendants(pid) if any("resource_tracker" in a or "forkserver" in a for a in command_line(c))
    }
    return [c for c in _descendants(pid) if c not in helpers or _parent_of(c) in helpers]


def _session_processes(sid: int) -> list[str]:
    """The command lines of the processes still in session ``sid`` (a run started with ``start_new_session``)."""
    import subprocess

    out = subprocess.run(["ps", "-e", "-o", "sid=,args="], capture_output=True, text=True).stdout
    return [a for s, _, a in (line.strip().partition(" ") for line in out.splitlines()) if s == str(sid)]


def _live_session_processes(sid: int, grace_s: float = 5.0) -> list[str]:
    """:func:`_session_processes` but for the ``<defunct>`` (ended, not yet reaped by init), asked again every 0.2 s
    while any is left, for up to ``grace_s`` seconds: a process on its way out, its files closed (so the pipes the
    test waited on are), shows as ``[name]`` (no command line) for a moment; CI saw one under load."""
    deadline = time.monotonic() + grace_s
    while True:
        left = [a for a in _session_processes(sid) if "<defunct>" not in a]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
