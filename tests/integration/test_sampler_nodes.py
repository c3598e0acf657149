"""Sampler nodes over loopback (issue 37): a learner fed by ``msf-sampler`` processes, the intruders it refuses,
and how both sides end. Each process runs in a session of its own, so that a test can kill it whole."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msf.cfg.presets import SMALL_ENV_FLAGS
from tests.integration.conftest import SLACK_S, msf_env, read_summary
from tests.integration.test_nodes import _listeners, free_port

SMALL = ["--env=CartPole-v1", "--num_envs_per_worker=4", "--batch_size=128", "--encoder_mlp_layers", "32"]
ROLLOUT = 32


def start(module: str, args: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", module, *args]
    if module == "msf.train":
        cmd[3:3] = ["--device=cpu", "--with_progress_bar=False"]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=msf_env(), start_new_session=True
    )


def job(train_dir: Path, exp: str, port: int, extra: list[str]) -> subprocess.Popen:
    return start("msf.train", [f"--experiment={exp}", f"--train_dir={train_dir}", f"--sampler_port={port}", *extra])


def sampler(port: int, *extra: str) -> subprocess.Popen:
    return start("msf.sampler", [f"--connect=127.0.0.1:{port}", "--num_workers=1", "--num_envs_per_worker=4", *extra])


def wait_for_log(log: Path, pattern: str, timeout: float = 90.0) -> re.Match:
    """The first match of ``pattern`` in ``log`` (the job's log.txt), waiting for it to appear."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text()) if log.exists() else None
        if m:
            return m
        time.sleep(0.2)
    raise AssertionError(
        f"{pattern!r} not in {log} within {timeout} s:\n{log.read_text()[-3000:] if log.exists() else ''}"
    )


def communicate(p: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, out, err


def session_pids(sid: int) -> set[int]:
    """The processes of session ``sid`` (a process started with ``start_new_session`` and everything it started)."""
    pids = set()
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[3]) == sid:
                    pids.add(int(d))
        except (OSError, ValueError):
            pass
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def node_sent(err: str) -> int:
    """The trajectories a sampler node says it sent, from its last line."""
    return int(re.search(r"(\d+) trajectories sent", err).group(1))  # type: ignore[union-attr]


def node_sampled(err: str) -> int:
    """The trajectories a sampler node says it took from its workers, from its last line."""
    return int(re.search(r"trajectories sent \(\d+ bytes\) of (\d+) sampled", err).group(1))  # type: ignore[union-attr]


def last_points(exp_dir: Path) -> dict[str, float]:
    """Each TensorBoard scalar's last value in the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_a_learner_fed_only_by_a_sampler_node_reaches_450(train_dir):
    """Issue 37, number 1: CartPole-v1, the learner at --num_workers=0 and one sampler node: mean return >= 450
    within 300k env steps; every env step the learner took came from the node, and the books close."""
    port = free_port()
    # the small-env preset, as local CartPole training runs it, with the node's workers in place of the learner's
    flags = [f for f in SMALL_ENV_FLAGS if not f.startswith("--num_workers")] + ["--num_workers=0"]
    args = ["--env=CartPole-v1", "--seed=0", "--train_for_env_steps=300000", "--stop_at_return_mean=450", *flags]
    args.append("--experiment_summaries_interval=1")  # the target is checked at each summary
    j = job(train_dir, "fed", port, args)
    wait_for_log(train_dir / "fed" / "log.txt", "sampler nodes may join")
    node = sampler(
        port, "--num_workers=2", "--num_envs_per_worker=16", f"--sampler_key_file={train_dir}/fed/sampler.key"
    )
    rj, _, ej = communicate(j, timeout=600)
    rn, _, en = communicate(node, timeout=SLACK_S)
    assert rj == 0 and rn == 0, (ej[-2000:], en[-2000:])
    s = read_summary(train_dir, "fed")
    assert s["episode_return_mean"] >= 450 and s["return_target_reached_at"] == s["env_steps"] <= 300_000, s
    (src,) = s["sampler_nodes"]["sources"].values()
    # the agreement's count of env steps taken is the node's steps taken out of the buffer (kept or dropped)
    assert src["env_steps_kept"] + src["env_steps_dropped"] == s["env_steps"]
    assert src["env_steps_received"] == src["env_steps_kept"] + src["env_steps_dropped"] + src["env_steps_pending"]
    assert s["env_steps_trained"] + s["env_steps_dropped"] + s["env_steps_discarded"] == s["env_steps"]
    # what the node says it sent: what arrived, and at most its last messages in flight when the job ended
    assert src["env_steps_rejected"] == src["env_steps_lost"] == 0
    assert 0 <= node_sent(en) * ROLLOUT - src["env_steps_received"] <= 64 * ROLLOUT
    # the weights, one version of one policy a message, at least 0.1 s apart (WEIGHTS_EVERY_S)
    assert 1 <= src["weights_sent"] <= 1 + s["wall_seconds"] / 0.1, (src, s["wall_seconds"])
    assert src["weights_bytes_sent"] > src["weights_sent"] * 1_000_000  # CartPole's small-env model: 1.07 MB


@pytest.mark.slow  # 15 s on 2 cores; tests/unit/test_wire.py checks the signatures and malformed messages
def test_intruders_are_refused_in_one_line_each_and_the_job_trains_on_then_ctrl_c_ends_its_sampler(train_dir):
    """Issue 37, number 6 and the first half of 5: a sampler without a key file (refused at once), one with another
    key, one with another env, and random
    bytes sent to the port are refused or dropped, one line each, while the learner trains on (with its own worker
    and a good sampler node); the port listens on the rendezvous address only; a Ctrl-C to the job ends the good
    node with exit 0 within 15 s."""
    port = free_port()
    log = train_dir / "e" / "log.txt"
    j = job(train_dir, "e", port, [*SMALL, "--num_workers=1", "--seed=1"])
    wait_for_log(log, "sampler nodes may join")
    assert _listeners(port) == [f"127.0.0.1:{port}"]  # not every interface
    key = f"--sampler_key_file={train_dir}/e/sampler.key"
    good = sampler(port, key)
    no_key = sampler(port)
    wrong_key = train_dir / "wrong.key"
    wrong_key.write_text(os.urandom(32).hex() + "\n")
    keyless = sampler(port, "--connect_timeout=4", f"--sampler_key_file={wrong_key}")
    other_env = sampler(port, key, "--env=Acrobot-v1")
    for data in (os.urandom(2048), b"\xff" + os.urandom(2048)):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(data)
            time.sleep(0.3)
    rn, _, en = communicate(no_key, timeout=60)
    assert rn == 2 and en.strip().splitlines()[-1].startswith("msf-sampler: error: --sampler_key_file: required"), en
    rk, _, ek = communicate(keyless, timeout=60)
    ro, _, eo = communicate(other_env, timeout=60)
    assert rk == 1 and ek.strip().splitlines()[-1] == (
        f"msf-sampler: error: no job answered at 127.0.0.1:{port} within 4 s (--connect_timeout): is msf-train "
        "running there with --sampler_port, and does --sampler_key_file hold its key?"
    ), ek
    assert ro == 2 and eo.strip().splitlines()[-1] == (
        f"msf-sampler: error: the job at 127.0.0.1:{port} refused this sampler: env 'Acrobot-v1', the job trains "
        "'CartPole-v1'"
    ), eo
    # the good node's trajectories are trained on: the status line counts them
    wait_for_log(log, r"sampler nodes 1: [1-9]\d* steps received")
    t0 = time.monotonic()
    os.kill(j.pid, signal.SIGINT)
    rg, _, eg = communicate(good, timeout=60)
    ended_after = time.monotonic() - t0
    rj, _, ej = communicate(j, timeout=60)
    assert rj == 0 and rg == 0, (ej[-2000:], eg[-2000:])
    assert ended_after <= 15, ended_after
    text = log.read_text()
    assert (
        len(re.findall(r"sampler node \S+:\d+-[0-9a-f]{4}: message dropped: the message failed authentication", text))
        == 1
    )
    assert len(re.findall(r"sampler node \S+ refused: env 'Acrobot-v1', the job trains 'CartPole-v1'", text)) == 1
    intruders = re.findall(r"sampler node peer-\w+: message dropped|a connection that is not a ZeroMQ peer", text)
    assert 1 <= len(intruders) <= 2, text  # the random bytes: one line per connection at most
    s = read_summary(train_dir, "e")
    assert s["status"] == "stopped" and s["train_steps"] > 0
    nodes = s["sampler_nodes"]
    assert nodes["joined"] == 1 and len(nodes["refused"]) >= 2
    (src,) = nodes["sources"].values()
    assert src["env_steps_received"] > 0 and src["env_steps_kept"] > 0
    assert src["env_steps_received"] == src["env_steps_kept"] + src["env_steps_dropped"] + src["env_steps_pending"]
    assert 0 <= node_sent(eg) * ROLLOUT - src["env_steps_received"] <= 64 * ROLLOUT


@pytest.mark.slow  # 20 s on 2 cores
def test_a_sampler_node_that_loses_its_job_exits_1_naming_the_address_and_leaves_nothing(train_dir):
    """Issue 37, the second half of number 5: the job SIGKILLed, its sampler node exits non-zero after
    --connect_timeout, naming the address, with no process of its own left and no record in /dev/shm."""
    port = free_port()
    log = train_dir / "k" / "log.txt"
    j = job(train_dir, "k", port, [*SMALL, "--num_workers=0"])
    wait_for_log(log, "sampler nodes may join")
    node = sampler(port, "--connect_timeout=5", f"--sampler_key_file={train_dir}/k/sampler.key")
    wait_for_log(log, r"sampler nodes 1: [1-9]\d* steps received")
    pids = session_pids(node.pid)
    assert len(pids) >= 4, pids  # the node, its fork server, its inference worker and its rollout worker
    os.killpg(j.pid, signal.SIGKILL)
    j.wait()
    t0 = time.monotonic()
    rn, _, en = communicate(node, timeout=5 + SLACK_S)
    assert time.monotonic() - t0 >= 3  # it waited (the job pings every second, so up to a second was heard)
    assert rn == 1
    assert re.fullmatch(
        rf"msf-sampler: error: lost the job at 127.0.0.1:{port}: nothing heard for \d+ s \(--connect_timeout=5\)",
        en.strip().splitlines()[-1],
    ), en[-2000:]
    deadline = time.monotonic() + 10
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]
    assert not [p for p in pids if os.path.exists(f"/dev/shm/msf-semaphores.{p}")]


def shm_leftovers(pids: set[int]) -> list[str]:
    """The /dev/shm files that ``pids`` recorded (msf.runtime.semaphore_records: each process's record and the
    semaphores it lists) and that still exist."""
    left = []
    for pid in pids:
        record = Path(f"/dev/shm/msf-semaphores.{pid}")
        try:
            names = record.read_text().split()[1:]
        except OSError:
            continue
        left += [str(record)] + [
            f"/dev/shm/sem.{n.lstrip('/')}" for n in names if Path(f"/dev/shm/sem.{n.lstrip('/')}").exists()
        ]
    return left


@pytest.mark.slow
def test_a_killed_sampler_node_costs_its_trajectories_in_flight_and_a_late_one_is_trained_on_within_10_s(train_dir):
    """Issue 37, numbers 3 and 4: a learner at --num_workers=0 fed by one sampler node, which is SIGKILLed (its
    whole session: the machine lost): the job counts it as gone, says that it waits, and resumes when a second node
    joins 20 s after the start; that node's first trajectories enter the buffer within 10 s of its join and are
    trained on. The books close per source and in total, from what each node reported it sampled down to what was
    trained, dropped or lost in flight; TensorBoard's last points show them as summary.json does; the run ends done,
    and nothing of the killed node is left in /dev/shm (the second node's start removes what the killed one
    recorded)."""
    port = free_port()
    log = train_dir / "kill" / "log.txt"
    j = job(train_dir, "kill", port, [*SMALL, "--num_workers=0", "--train_for_seconds=50"])
    wait_for_log(log, "sampler nodes may join")
    t0 = time.monotonic()
    key = f"--sampler_key_file={train_dir}/kill/sampler.key"
    a = sampler(port, key)
    wait_for_log(log, r"sampler nodes 1: [1-9]\d* steps received")
    a_pids = session_pids(a.pid)
    assert [p for p in a_pids if Path(f"/dev/shm/msf-semaphores.{p}").exists()]  # it recorded its semaphores
    os.killpg(a.pid, signal.SIGKILL)
    a.wait()
    time.sleep(max(0.0, 20 - (time.monotonic() - t0)))
    b = sampler(port, key)
    rj, _, ej = communicate(j, timeout=120)
    rb, _, eb = communicate(b, timeout=SLACK_S)
    assert rj == 0 and rb == 0, (ej[-2000:], eb[-2000:])
    text = log.read_text()
    gone = text.index("nothing heard for 10 s: counted as gone")
    assert "no sampler node is connected and this learner has no rollout worker: it waits" in text[gone:], text
    s = read_summary(train_dir, "kill")
    assert s["status"] == "done", s
    first, second = sorted(s["sampler_nodes"]["sources"].values(), key=lambda v: v["joined_at_s"])
    assert not first["connected"] and second["connected"]
    assert first["env_steps_kept"] > 0 and second["env_steps_kept"] > 0, s
    # number 4: the late node joined 20 s or more after the endpoint began listening, and fed the buffer within 10 s
    assert second["joined_at_s"] >= 20 - SLACK_S / 10
    assert 0 <= second["first_trajectory_at_s"] - second["joined_at_s"] <= 10, second
    for v in (first, second):
        assert v["env_steps_sampled"] == v["env_steps_sent"] + v["env_steps_lost_in_flight"]
        assert v["env_steps_sent"] == v["env_steps_received"] + v["env_steps_rejected"] + v["env_steps_lost"]
        assert v["env_steps_received"] == v["env_steps_kept"] + v["env_steps_dropped"] + v["env_steps_pending"]
    assert first["env_steps_rejected"] == second["env_steps_rejected"] == 0
    # the killed node cost at most what it had in flight: its window (an iteration: 4 trajectories) and what its
    # workers had finished and it had not sent yet (a split's 2), with room to spare
    assert first["env_steps_sampled"] >= first["env_steps_received"] > 0
    assert first["env_steps_lost"] + first["env_steps_lost_in_flight"] <= 16 * ROLLOUT, first
    # the second node's own count at its end: what it last reported, and at most its window and a split since
    assert 0 <= node_sampled(eb) * ROLLOUT - second["env_steps_sampled"] <= 16 * ROLLOUT, (second, eb[-500:])
    total = s["sampler_nodes"]["total"]
    assert total["env_steps_sampled"] == first["env_steps_sampled"] + second["env_steps_sampled"]
    assert total["env_steps_kept"] + total["env_steps_dropped"] == s["env_steps"]
    # the status line's lost in flight: the gone node's, frozen since it went
    note = re.findall(r"sampler nodes 1: \d+ steps received, \d+ dropped, (\d+) lost in flight", text)
    assert int(note[-1]) == first["env_steps_lost"] + first["env_steps_lost_in_flight"], note
    # TensorBoard: the last points of the gone node are its final books; the connected one's dropped steps were
    # final when the loop ended (its received steps went on until the endpoint closed)
    tb = last_points(train_dir / "kill")
    a_name, b_name = (n for n, v in sorted(s["sampler_nodes"]["sources"].items(), key=lambda i: i[1]["joined_at_s"]))
    assert tb["sampler_nodes/connected"] == s["sampler_nodes"]["connected"] == 1
    for k in ("env_steps_received", "env_steps_dropped", "env_steps_lost_in_flight"):
        assert tb[f"sampler_nodes/{a_name}/{k}"] == first[k], k
    assert tb[f"sampler_nodes/{a_name}/policy_lag_mean"] == pytest.approx(first["policy_lag_mean"], rel=1e-6)
    assert tb[f"sampler_nodes/{b_name}/env_steps_dropped"] == second["env_steps_dropped"]
    assert 0 < tb[f"sampler_nodes/{b_name}/env_steps_received"] <= second["env_steps_received"]
    # every env step counted came from the two nodes, and was trained on, dropped or discarded at the end
    assert s["env_steps"] == sum(v["env_steps_kept"] + v["env_steps_dropped"] for v in (first, second))
    assert s["env_steps_trained"] + s["env_steps_dropped"] + s["env_steps_discarded"] == s["env_steps"]
    assert node_sent(eb) * ROLLOUT - second["env_steps_received"] <= 64 * ROLLOUT
    assert shm_leftovers(a_pids | {j.pid, b.pid}) == []


def _two_free_ports() -> int:
    """A port ``p`` with ``p + 1`` free too (device group R listens on ``--sampler_port + R``)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two adjacent free ports")


def test_two_device_groups_fed_by_two_sampler_nodes_stay_identical_and_balance_their_books(train_dir):
    """Issue 37, number 2: --nproc_per_node=2 --num_workers=0 fed by two sampler nodes, replicas compared every
    iteration (--ddp_check_interval=1: a difference fails the run); every node feeds both groups; each group took
    its local batch (half the job's steps); the observation normaliser counted every sample trained (its moments are
    summed over the replicas); per source and group, received = kept + dropped + pending."""
    import torch

    port = _two_free_ports()
    exp = train_dir / "dp"
    args = [*SMALL, "--nproc_per_node=2", "--num_workers=0", "--seed=2", "--ddp_check_interval=1"]
    j = job(train_dir, "dp", port, [*args, "--normalize_input=True", "--train_for_env_steps=16384"])
    wait_for_log(exp / "log.txt", "sampler nodes may join")
    key = f"--sampler_key_file={exp}/sampler.key"
    nodes = [sampler(port, key), sampler(port, key)]
    rj, _, ej = communicate(j, timeout=300)
    ended = [communicate(n, timeout=SLACK_S) for n in nodes]
    assert rj == 0 and all(r == 0 for r, _, _ in ended), (ej[-3000:], [e[-1500:] for _, _, e in ended])
    s = read_summary(train_dir, "dp")
    assert s["status"] == "done" and s["world_size"] == 2 and s["env_steps"] >= 16384
    groups = [s["sampler_nodes"], json.loads((exp / "sampler_nodes.rank1.json").read_text())]
    assert [g["address"] for g in groups] == [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    taken = []
    for g in groups:
        assert len(g["sources"]) == 2 and g["refused"] == {}  # both nodes joined both groups
        for src in g["sources"].values():
            assert src["env_steps_received"] > 0 and src["env_steps_rejected"] == src["env_steps_lost"] == 0
            assert src["env_steps_received"] == (
                src["env_steps_kept"] + src["env_steps_dropped"] + src["env_steps_pending"]
            )
        taken.append(sum(v["env_steps_kept"] + v["env_steps_dropped"] for v in g["sources"].values()))
    assert taken[0] == taken[1] == s["env_steps"] // 2  # each replica's local batch, every iteration
    # the replicas' weights are equal: group 0 alone sends them, at least the version of the join
    assert all(src["weights_sent"] >= 1 for src in groups[0]["sources"].values()), groups[0]
    assert all(src["weights_sent"] == src["weights_bytes_sent"] == 0 for src in groups[1]["sources"].values())
    # what each node says it sent arrived at one of the groups (but its last messages in flight at the end)
    for (_, _, err), name in zip(
        ended, sorted(groups[0]["sources"], key=lambda n: int(n.rsplit(":", 1)[1].split("-")[0]))
    ):
        received = sum(g["sources"][name]["env_steps_received"] for g in groups)
        assert 0 <= node_sent(err) * ROLLOUT - received <= 64 * ROLLOUT, (name, err[-500:])
    (last,) = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))[-1:]
    count = torch.load(last, weights_only=False)["model"]["obs_normalizer.count"].item()
    assert count == s["env_steps_trained"], (count, s["env_steps_trained"], s["env_steps_dropped"])
