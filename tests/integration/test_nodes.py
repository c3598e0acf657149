"""Several nodes on one machine: two ``msf-train`` processes with a host list, torchrun, a faked Slurm
allocation, two network namespaces; a missing node, a killed node, bad input, --max_restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from netns import netns_available, veth_pair  # tests/helpers (on sys.path: conftest)

from .conftest import SMALL_ENV_FLAGS, msf_env, read_summary, run_msf, wait_until_training

HOSTS2 = "--hosts=127.0.0.1,127.0.0.1"
# CartPole over two nodes of one device group each: half the batch per replica, one rollout worker per node
# --stop_at_return_mean is checked at each summary: every second, so that the run stops within ~10k steps of it
TWO_NODE_FLAGS = [f for f in SMALL_ENV_FLAGS if not f.startswith(("--batch_size", "--num_workers"))] + [
    "--batch_size=256",
    "--num_workers=1",
    "--experiment_summaries_interval=1",
]
SMALL = ["--num_workers=1", "--num_envs_per_worker=4", "--batch_size=128", "--encoder_mlp_layers", "32"]
SHORT = ["--env=CartPole-v1", *SMALL]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    args: list[str], env: dict | None = None, prefix: list[str] | None = None, module: str = "msf.train"
) -> subprocess.Popen:
    """One "node": ``python -m msf.train ARGS`` in a session of its own (so it can be killed whole)."""
    e = msf_env()
    e.update(env or {})
    cmd = [*(prefix or []), sys.executable, "-m", module, *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, start_new_session=True
    )


def finish(*procs: subprocess.Popen, timeout: float) -> list[tuple[int, str, str]]:
    out = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return out


def node_args(train_dir: Path, node: int, exp: str, port: int, extra: list[str], hosts: str = HOSTS2) -> list[str]:
    nnodes = len(hosts.split("=", 1)[1].split(","))
    return [
        "--device=cpu",
        "--with_progress_bar=False",
        f"--experiment={exp}",
        f"--train_dir={train_dir / f'node{node}'}",
        f"--nnodes={nnodes}",
        f"--node_rank={node}",
        hosts,
        f"--master_port={port}",
        *extra,
    ]


# --- bad input: before anything is spawned --------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--nnodes=2", "--node_rank=2", HOSTS2], "--node_rank:"),
        (["--nnodes=2", "--hosts=127.0.0.1"], "--hosts:"),
        (["--nnodes=2", "--hosts=127.0.0.1,no-such-host.invalid"], "--hosts: cannot resolve 'no-such-host.invalid'"),
        (["--nnodes=2"], "--hosts: required with --nnodes=2"),
    ],
)
def test_bad_node_flags_one_line_exit_2(tmp_path, args, expected):
    r = run_msf(["--experiment=bad", f"--train_dir={tmp_path}", *args], timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"msf-train: error: {expected}"), r.stderr


@pytest.mark.slow  # default-suite time (30 min on 2 cores); the slow suite runs it
def test_max_restarts_resumes_after_a_failure_and_the_curves_continue(train_dir, tmp_path):
    marker = tmp_path / "failed_once"
    r = run_msf(
        [
            "--env=msf_test_envs:MsfFailOnceCartPole-v0",
            *SMALL,
            "--experiment=rs",
            f"--train_dir={train_dir}",
            "--save_every_sec=1",
            "--max_restarts=1",
            "--train_for_env_steps=60000",
            "--experiment_summaries_interval=1",
        ],
        timeout=180,
        env={**msf_env(), "MSF_TEST_FAIL_ONCE_MARKER": str(marker), "MSF_TEST_FAIL_AFTER_S": "4"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert marker.exists()  # it did fail once
    log = (train_dir / "rs" / "log.txt").read_text()
    assert "deliberate one-time failure" in log
    assert "restarting the device groups from the last checkpoint (restart 1 of --max_restarts=1)" in log
    assert "resumed from" in log
    s = read_summary(train_dir, "rs")
    assert s["status"] == "done" and 60000 <= s["env_steps"] < 60000 + 128
    from msf.plot import read_curves

    steps = read_curves(str(train_dir / "rs"))["perf/fps"].steps
    assert np.all(np.diff(steps) > 0)


def test_without_restarts_a_failure_ends_the_job(train_dir, tmp_path):
    r = run_msf(
        [
            "--env=msf_test_envs:MsfFailOnceCartPole-v0",
            *SMALL,
            "--experiment=nors",
            f"--train_dir={train_dir}",
            "--train_for_env_steps=60000",
        ],
        timeout=120,
        env={**msf_env(), "MSF_TEST_FAIL_ONCE_MARKER": str(tmp_path / "m"), "MSF_TEST_FAIL_AFTER_S": "3"},
    )
    assert r.returncode == 1 and "deliberate one-time failure" in r.stderr


# --- two nodes on one machine (slow) -----------------------------------------------------------------


def _listeners(port: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if line.split()[3].endswith(f":{port}")]


@pytest.mark.slow
def test_two_nodes_with_a_host_list_reach_450_and_the_rendezvous_listens_on_its_address(train_dir):
    port = free_port()
    # --stop_at_return_mean: "reaches 450 within 300k steps" ends where it is shown
    args = ["--env=CartPole-v1", "--seed=0", "--train_for_env_steps=300000", "--stop_at_return_mean=450"]
    args += TWO_NODE_FLAGS
    n0 = start(node_args(train_dir, 0, "hl", port, args))
    n1 = start(node_args(train_dir, 1, "hl", port, args))
    wait_until_training(train_dir / "node0" / "hl")
    listening = _listeners(port)
    (r0, _, e0), (r1, o1, e1) = finish(n0, n1, timeout=300)
    assert r0 == 0 and r1 == 0, (e0[-2000:], e1[-2000:])
    assert listening == ["127.0.0.1:" + str(port)], listening  # not 0.0.0.0 or [::]
    s = read_summary(train_dir / "node0", "hl")
    assert (s["world_size"], s["nnodes"], s["nproc_per_node"]) == (2, 2, 1)
    assert s["episode_return_mean"] >= 450 and s["return_target_reached_at"] == s["env_steps"] <= 300_000, s
    assert not (train_dir / "node1" / "hl" / "summary.json").exists()  # one writer: rank 0
    assert "[rank 1]" in (train_dir / "node1" / "hl" / "log.txt").read_text()
    assert "rank 0 (node 0, 127.0.0.1) holds the checkpoints" in o1


@pytest.mark.slow
def test_two_nodes_with_torchrun_reach_450(train_dir):
    port = free_port()
    procs = []
    for node in range(2):
        args = [
            "--device=cpu",
            "--with_progress_bar=False",
            "--experiment=tr",
            f"--train_dir={train_dir / f'node{node}'}",
            "--env=CartPole-v1",
            "--seed=0",
            "--train_for_env_steps=300000",
            "--stop_at_return_mean=450",
            *TWO_NODE_FLAGS,
        ]
        procs.append(
            start(
                [
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    "--rdzv_backend=c10d",
                    f"--rdzv_endpoint=127.0.0.1:{port}",
                    "--rdzv_id=msftest",
                    "-m",
                    "msf.train",
                    *args,
                ],
                module="torch.distributed.run",
            )
        )
    results = finish(*procs, timeout=360)
    assert all(r == 0 for r, _, _ in results), [e[-2000:] for _, _, e in results]
    summaries = [train_dir / f"node{n}" / "tr" / "summary.json" for n in range(2)]
    (path,) = [p for p in summaries if p.exists()]  # torchrun's rendezvous chose rank 0's node
    s = json.loads(path.read_text())
    assert (s["world_size"], s["nnodes"]) == (2, 2)
    assert s["episode_return_mean"] >= 450 and s["return_target_reached_at"] == s["env_steps"] <= 300_000, s


@pytest.mark.slow
def test_a_node_that_never_arrives_is_named(train_dir):
    port = free_port()
    t0 = time.monotonic()
    ((r0, _, e0),) = finish(start(node_args(train_dir, 0, "miss", port, [*SHORT, "--dist_timeout=8"])), timeout=90)
    assert r0 == 1 and time.monotonic() - t0 < 8 + 30
    expected = f"node 1 (127.0.0.1) did not join the rendezvous at 127.0.0.1:{port} within --dist_timeout=8 s"
    assert expected in e0.strip().splitlines()[-1], e0[-2000:]
    assert "Traceback" not in e0, e0[-2000:]  # the traceback is in the log only
    ((r1, _, e1),) = finish(
        start(node_args(train_dir, 1, "miss", free_port(), [*SHORT, "--dist_timeout=5"])), timeout=90
    )
    assert r1 == 1
    assert "could not reach the rendezvous at 127.0.0.1" in e1.strip().splitlines()[-1], e1[-2000:]


@pytest.mark.slow
def test_mismatched_configs_and_a_rank_claimed_twice_exit_2(train_dir):
    port = free_port()
    n0 = start(node_args(train_dir, 0, "cfg", port, [*SHORT, "--dist_timeout=30"]))
    n1 = start(node_args(train_dir, 1, "cfg", port, [*SHORT, "--dist_timeout=30", "--learning_rate=0.001"]))
    (r0, _, e0), (r1, _, e1) = finish(n0, n1, timeout=90)
    assert (r0, r1) == (2, 2), (e0[-2000:], e1[-2000:])
    for e in (e0, e1):
        assert e.strip().splitlines()[-1].startswith("msf-train: error: --learning_rate: node 1 runs another config")
    port = free_port()
    hosts3 = "--hosts=127.0.0.1,127.0.0.1,127.0.0.1"
    procs = [
        start(node_args(train_dir, n, "dup", port, [*SHORT, "--dist_timeout=30"], hosts=hosts3)) for n in (0, 1, 1)
    ]
    results = finish(*procs, timeout=90)
    assert sorted(r for r, _, _ in results) == [2, 2, 2], [e[-1500:] for _, _, e in results]
    assert any("--node_rank: rank 1 is claimed twice" in e for _, _, e in results)


@pytest.mark.slow
def test_a_killed_node_ends_the_job_and_the_same_command_resumes(train_dir):
    port = free_port()
    # status lines every 2 s: the kill comes ~4 s into training; the first budget is out of reach however fast the
    # machine, and the resumed command (the same but for its budget) trains 20k steps past the checkpoint
    args = [
        *SHORT,
        "--save_every_sec=1",
        "--dist_timeout=20",
        "--experiment_summaries_interval=2",
    ]
    first = [*args, "--train_for_env_steps=100000000"]
    n0 = start(node_args(train_dir, 0, "kill", port, first))
    n1 = start(node_args(train_dir, 1, "kill", port, first))
    wait_until_training(train_dir / "node0" / "kill")
    time.sleep(2.0)  # checkpoints exist
    os.killpg(n1.pid, signal.SIGKILL)
    t0 = time.monotonic()
    ((r0, _, e0),) = finish(n0, timeout=60)
    finish(n1, timeout=10)
    assert r0 != 0 and time.monotonic() - t0 < 20 + 5
    assert "lost rank 1 (127.0.0.1)" in e0, e0[-2000:]
    ckpts = sorted((train_dir / "node0" / "kill" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert ckpts and torch.load(ckpts[-1], weights_only=True)["env_steps"] > 0  # intact
    saved = torch.load(ckpts[-1], weights_only=True)["env_steps"]
    # the same command on both nodes resumes; node 1 has no checkpoint and gets rank 0's
    port2 = free_port()
    again = [*args, f"--train_for_env_steps={saved + 20000}"]
    n0 = start(node_args(train_dir, 0, "kill", port2, again))
    n1 = start(node_args(train_dir, 1, "kill", port2, again))
    (r0, _, e0), (r1, _, e1) = finish(n0, n1, timeout=240)
    assert (r0, r1) == (0, 0), (e0[-2000:], e1[-2000:])
    log1 = (train_dir / "node1" / "kill" / "log.txt").read_text()
    assert f"resumed from rank 0's checkpoint (env steps {saved})" in log1
    s = read_summary(train_dir / "node0", "kill")
    assert s["status"] == "done" and saved + 20000 <= s["env_steps"]


@pytest.mark.slow
def test_slurm_one_task_per_node_with_a_fake_scontrol(train_dir, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {calls}\nprintf "127.0.0.1\\n127.0.0.1\\n"\n')
    (bin_dir / "scontrol").chmod(0o755)
    port = free_port()
    procs = []
    for node in range(2):
        env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NODELIST": "fake[1-2]",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0",
            "SLURM_STEP_ID": "0",
        }
        procs.append(
            start(
                [
                    "--device=cpu",
                    "--with_progress_bar=False",
                    "--experiment=sl",
                    f"--train_dir={train_dir / f'node{node}'}",
                    f"--master_port={port}",
                    *SHORT,
                    "--train_for_env_steps=20000",
                ],
                env=env,
            )
        )
    results = finish(*procs, timeout=180)
    assert all(r == 0 for r, _, _ in results), [e[-2000:] for _, _, e in results]
    assert "show hostnames fake[1-2]" in calls.read_text()
    s = read_summary(train_dir / "node0", "sl")
    assert (s["world_size"], s["nnodes"]) == (2, 2) and s["env_steps"] >= 20000


@pytest.mark.slow
def test_two_nodes_in_two_network_namespaces_over_a_veth_pair(train_dir):
    why = netns_available()
    if why is not None:
        pytest.skip(f"network namespaces are not available here: `ip netns add` failed: {why}")
    with veth_pair("msf", "10.231.7") as pair:
        port = 29517
        procs = []
        for node in range(2):
            args = node_args(
                train_dir,
                node,
                "ns",
                port,
                [*SHORT, "--train_for_env_steps=20000", "--dist_timeout=60"],
                hosts=f"--hosts={pair.addrs[0]},{pair.addrs[1]}",
            )
            procs.append(start(args, env={"GLOO_SOCKET_IFNAME": pair.veth[node]}, prefix=pair.prefix(node)))
        results = finish(*procs, timeout=240)
        assert all(r == 0 for r, _, _ in results), [e[-2000:] for _, _, e in results]
        s = read_summary(train_dir / "node0", "ns")
        assert (s["world_size"], s["nnodes"]) == (2, 2) and s["env_steps"] >= 20000


@pytest.mark.slow
def test_two_nodes_restart_together_after_a_failure(train_dir, tmp_path):
    port = free_port()
    env = {"MSF_TEST_FAIL_ONCE_MARKER": str(tmp_path / "failed_once"), "MSF_TEST_FAIL_AFTER_S": "4"}
    args = [
        "--env=msf_test_envs:MsfFailOnceCartPole-v0",
        *SMALL,
        "--train_for_env_steps=40000",
        "--save_every_sec=1",
        "--max_restarts=1",
        "--dist_timeout=60",
    ]
    n0 = start(node_args(train_dir, 0, "rs2", port, args), env=env)
    n1 = start(node_args(train_dir, 1, "rs2", port, args), env=env)
    (r0, _, e0), (r1, _, e1) = finish(n0, n1, timeout=240)
    assert (r0, r1) == (0, 0), (e0[-2000:], e1[-2000:])
    assert (tmp_path / "failed_once").exists()
    for node in range(2):
        log = (train_dir / f"node{node}" / "rs2" / "log.txt").read_text()
        assert "restart 1 of --max_restarts=1" in log and "resumed from" in log
    s = read_summary(train_dir / "node0", "rs2")
    assert s["status"] == "done" and s["world_size"] == 2 and s["env_steps"] >= 40000


@pytest.mark.slow
def test_two_nodes_with_two_policies_and_pbt(train_dir):
    """Each policy's process group spans both nodes; PBT's decision is made on node 0 and applied on both."""
    port = free_port()
    args = [
        *SHORT,
        "--seed=3",
        "--num_policies=2",
        "--with_pbt=True",
        "--pbt_period_env_steps=10000",
        "--pbt_start_mutation=0",
        "--pbt_replace_reward_gap=0",
        "--ddp_check_interval=1",
        "--learning_rate=1e-3",
        "--train_for_env_steps=30000",
    ]
    n0 = start(node_args(train_dir, 0, "pop", port, args))
    n1 = start(node_args(train_dir, 1, "pop", port, args))
    (r0, _, e0), (r1, _, e1) = finish(n0, n1, timeout=300)
    assert r0 == 0 and r1 == 0, (e0[-2000:], e1[-2000:])
    s = read_summary(train_dir / "node0", "pop")
    assert s["world_size"] == 2 and set(s["policies"]) == {"0", "1"} and s["pbt_replacements"]
    # node 1 applied the same decisions: --ddp_check_interval=1 compares the replicas right after each round
    for rec in s["pbt_replacements"]:
        assert rec["weights_checksum"] == rec["donor_weights_checksum"], rec


@pytest.mark.slow
def test_sigint_to_one_node_launcher_of_a_scripts_background_job_stops_both_nodes_cleanly(train_dir):
    """``kill -INT`` of node 1's launcher, started in the background by a script (SIGINT ignored): the launcher
    ignored SIGINT and the job trained on. Now node 1's rank stops, and with it, at the same agreement, node 0's:
    both exit 0, and rank 0 writes its final checkpoint and status "stopped". (Slow: two nodes, as the other
    several-node tests; one node with two device groups runs the same launcher code in the default suite.)"""
    from .conftest import SLACK_S, sigint_disposition, start_in_background_shell

    port = free_port()
    args = [*SHORT, "--save_every_sec=1000", "--experiment_summaries_interval=1"]
    n0 = start(node_args(train_dir, 0, "bgsig", port, args))
    sh, pid = start_in_background_shell(node_args(train_dir, 1, "bgsig", port, args))
    try:
        wait_until_training(train_dir / "node0" / "bgsig")
        assert n0.poll() is None and sh.poll() is None, "the job ended before the signal"
        assert sigint_disposition(pid) == "caught"
        os.kill(pid, signal.SIGINT)
        t0 = time.monotonic()
        (r0, _, e0), (r1, _, e1) = finish(n0, sh, timeout=5 + SLACK_S + 30)
        elapsed = time.monotonic() - t0
    finally:
        if sh.poll() is None:
            os.killpg(sh.pid, signal.SIGKILL)
    assert (r0, r1) == (0, 0), (e0[-2000:], e1[-2000:])
    assert elapsed < 5 + SLACK_S, elapsed  # the next agreement, rank 0's final checkpoint, the workers' exit
    s = read_summary(train_dir / "node0", "bgsig")
    assert (s["status"], s["world_size"], s["nnodes"]) == ("stopped", 2, 2)
    ckpts = sorted((train_dir / "node0" / "bgsig" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert len(ckpts) == 1 and torch.load(ckpts[0], weights_only=True)["env_steps"] == s["env_steps"] > 0
