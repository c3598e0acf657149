"""The job's books of its sampler nodes (issue 37): what a node reports (``sampled``), what the job makes of it
(``summary.json``'s ``sampler_nodes``, the status line, TensorBoard's points), counted by hand. No sockets."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from msf.runner.sampler_node import NodeSettings, SamplerNode
from msf.sampling.remote_sampler import RemoteSampler, tensorboard_scalars
from msf.sampling.sampler_endpoint import Source, weights_interval

ROLLOUT = 32


def test_a_source_keeps_the_newest_sampled_count_and_the_largest_sent_and_ignores_what_is_not_an_int():
    s = Source(0, "a:1")
    s.note_books({"sent": 5, "sampled": 9})
    s.note_books({"sampled": 7})  # a node of several groups moves its unsent trajectories to another group
    s.note_books({"sent": 3, "sampled": "x"})  # sent counts only grow
    assert (s.sent, s.sampled) == (5, 7)


def test_a_node_counts_its_unsent_trajectories_against_the_group_it_joined_first():
    first, other = SimpleNamespace(sent=10), SimpleNamespace(sent=4)
    node = SamplerNode(first, NodeSettings(1, 4), threading.Event())  # type: ignore[arg-type]
    node.links.append(other)  # type: ignore[arg-type]
    node.unsent = 3  # taken from its workers, not yet sent
    assert node._sampled(first) == 13 and node._sampled(other) == 4  # type: ignore[arg-type]
    # two of the three about to be sent to the other group: the first group's count drops by them
    assert node._sampled(other, 2) == 6 and node._sampled(first) == 13  # type: ignore[arg-type]
    node.unsent = 1  # sent
    other.sent = 6
    assert node._sampled(first) + node._sampled(other) == 10 + 6 + 1  # type: ignore[arg-type]


def _remote(sources: list[Source]) -> RemoteSampler:
    endpoint = SimpleNamespace(
        address="127.0.0.1:29600",
        first_worker=2,
        sources={s.name.encode(): s for s in sources},
        refused={},
        rejected_connections=0,
        connected=lambda: [s for s in sources if not s.left],
    )
    remote = RemoteSampler.__new__(RemoteSampler)  # the books only: no endpoint thread, no workers
    remote.endpoint = endpoint  # type: ignore[assignment]
    return remote


def test_the_books_close_per_source_and_in_total_with_what_a_gone_node_had_in_flight():
    # a: gone; reported 20 sampled, said it sent 17, of which 15 arrived (1 rejected, 14 received) and 1 never did
    a = Source(0, "a:1", sent=17, sampled=20, received=14, taken=12, rejected=1, lag_sum=28.0, left=True)
    # b: connected; everything it sampled arrived
    b = Source(1, "b:2", sent=6, sampled=6, received=6, taken=6, lag_sum=3.0)
    remote = _remote([a, b])
    taken, dropped = {2: 12, 3: 6}, {2: 2, 3: 0}  # by virtual worker: first_worker + source index
    nodes = remote.sources(taken, dropped, ROLLOUT)
    va, vb = nodes["sources"]["a:1"], nodes["sources"]["b:2"]
    assert {k: v // ROLLOUT for k, v in va.items() if k.startswith("env_steps_")} == {
        "env_steps_sampled": 20,
        "env_steps_lost_in_flight": 3,  # 20 - 17
        "env_steps_sent": 17,
        "env_steps_received": 14,
        "env_steps_rejected": 1,
        "env_steps_lost": 2,  # 17 - 14 - 1
        "env_steps_kept": 10,
        "env_steps_dropped": 2,
        "env_steps_pending": 2,
    }
    assert va["policy_lag_mean"] == 2.0 and vb["policy_lag_mean"] == 0.5
    for v in (va, vb):  # sampled = trained + dropped + lost, per source
        assert v["env_steps_sampled"] == sum(
            v[f"env_steps_{k}"] for k in ("kept", "dropped", "pending", "rejected", "lost", "lost_in_flight")
        )
    assert nodes["total"]["env_steps_sampled"] == (20 + 6) * ROLLOUT
    assert nodes["total"]["env_steps_kept"] + nodes["total"]["env_steps_dropped"] == (12 + 6) * ROLLOUT
    assert nodes["connected"] == 1 and nodes["joined"] == 2
    # the status line: steps received by all, dropped (stale and rejected), lost in flight with the nodes gone
    assert remote.status_note(taken, dropped, ROLLOUT) == (
        f" | sampler nodes 1: {20 * ROLLOUT} steps received, {3 * ROLLOUT} dropped, {5 * ROLLOUT} lost in flight"
    )
    assert tensorboard_scalars(nodes) == {
        "sampler_nodes/connected": 1,
        "sampler_nodes/a:1/env_steps_received": 14 * ROLLOUT,
        "sampler_nodes/a:1/env_steps_dropped": 2 * ROLLOUT,
        "sampler_nodes/a:1/env_steps_lost_in_flight": 3 * ROLLOUT,
        "sampler_nodes/a:1/policy_lag_mean": 2.0,
        "sampler_nodes/b:2/env_steps_received": 6 * ROLLOUT,
        "sampler_nodes/b:2/env_steps_dropped": 0,
        "sampler_nodes/b:2/env_steps_lost_in_flight": 0,
        "sampler_nodes/b:2/policy_lag_mean": 0.5,
    }
    assert tensorboard_scalars(None) == {}


def test_a_node_that_reported_less_than_it_sent_is_counted_as_sampled_what_it_sent():
    a = Source(0, "a:1", sent=5, sampled=3, received=5, taken=5)  # an old report (before its newest message)
    v = _remote([a]).sources({2: 5}, {}, ROLLOUT)["sources"]["a:1"]
    assert v["env_steps_sampled"] == v["env_steps_sent"] == 5 * ROLLOUT and v["env_steps_lost_in_flight"] == 0


def test_the_weights_go_to_a_node_as_often_as_its_own_trajectories_or_10_mb_s_would_carry_them():
    """Seconds between two weights messages: weights bytes / max(the node's trajectory bytes/s, 10 MB/s), within
    [0.1, 1]: atari_pong's 7.4 MB model to a 16-core node sending 37 MB/s every 0.2 s; to a 2-core node sending
    2 MB/s every 0.74 s (7.4 MB at 10 MB/s); CartPole's 1.07 MB at 10 MB/s: 0.107 s; tiny models 0.1 s; a 50 MB
    model at most 1 s apart."""
    assert weights_interval(7_400_000, 37e6) == 7_400_000 / 37e6
    assert weights_interval(7_400_000, 2e6) == 7_400_000 / 10e6
    assert weights_interval(1_070_000, 0.6e6) == 1_070_000 / 10e6
    assert weights_interval(20_000, 1e9) == weights_interval(20_000, 0.0) == 0.1
    assert weights_interval(50_000_000, 1e6) == 1.0
