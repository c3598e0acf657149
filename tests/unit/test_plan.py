"""The wiring plan of a device group (:func:`msf.sampling.plan.plan_workers`): which workers it makes, what each
is given, and which channel joins which, against values worked out by hand. No process is started: the
``multiprocessing`` context is a stand-in that records the pipes it makes."""

from __future__ import annotations

import os
import queue
import threading

from msf.cfg.arguments import parse_args
from msf.distributed.topology import RankInfo
from msf.sampling.plan import DeviceGroup, plan_workers, rank_config

SEED = 11


class _Context:
    """A ``multiprocessing`` context's ``Queue`` and ``Pipe``, in one process; each pipe is a pair of tokens."""

    def __init__(self):
        self.pipes: list[tuple[str, str]] = []

    def Queue(self):
        return queue.Queue()

    def Pipe(self, duplex: bool):
        assert duplex
        n = len(self.pipes)
        self.pipes.append((f"pipe{n}.inference", f"pipe{n}.rollout"))
        return self.pipes[-1]


def _cfg(*extra: str):
    # a node of 2 device groups sharing 5 rollout workers, 2 policies with 2 inference workers each
    flags = ["--env=CartPole-v1", "--num_workers=5", "--nproc_per_node=2", "--num_policies=2"]
    cfg, _ = parse_args([*flags, "--policy_workers_per_policy=2", f"--seed={SEED}", "--device=cpu", *extra])
    return cfg


# the second device group of the second node: global rank 3 of 4, local rank 1 of 2
RANK = RankInfo(rank=3, local_rank=1, nproc_per_node=2, node_rank=1, nnodes=2)


def _plan(cfg, ctx=None, cores=None):
    buffer, weights, spaces, derived = object(), [object(), object()], object(), object()
    group = DeviceGroup(buffer, weights, RANK, "cuda:1", first_worker=7, cores=cores)
    stop = threading.Event()
    return plan_workers(cfg, derived, spaces, group, stop, ctx), group, stop


def test_the_group_gets_its_share_of_the_nodes_workers_and_every_policy_its_inference_workers():
    cfg = _cfg()
    assert [rank_config(cfg, RankInfo(local_rank=i, nproc_per_node=2)).num_workers for i in (0, 1)] == [3, 2]
    plan, group, stop = _plan(cfg)
    assert [s.index for s in plan.rollout] == [0, 1]
    assert list(plan.inference) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # policy-major
    assert [s.policy for s in plan.inference.values()] == [0, 0, 1, 1]
    specs = [*plan.inference.values(), *plan.rollout]
    # every worker binds the group's buffer and stop event; its config is the group's share, seeded for rank 3
    assert all(s.buffer is group.buffer and s.stop_event is stop and s.derived is not None for s in specs)
    assert all(s.cfg.num_workers == 2 and s.cfg.seed == SEED + 3 * 1_000_003 for s in specs)
    assert all(s.first_worker == 7 for s in specs)
    assert all(s.device == "cuda:1" for s in plan.inference.values())
    assert [s.weights for s in plan.inference.values()] == [group.weights[p] for p in (0, 0, 1, 1)]
    assert all(s.device_group == 3 for s in plan.rollout)
    # the loop's ends: one full and one stats queue for all, a free queue per rollout worker
    assert all(s.full_queue is plan.full_queue and s.stats_queue is plan.stats_queue for s in plan.rollout)
    assert [s.free_queue for s in plan.rollout] == plan.free_queues and len(set(map(id, plan.free_queues))) == 2
    # each worker its own counters, in the loop's order
    assert plan.inference_stats == [s.counters for s in plan.inference.values()]
    assert len({id(c) for c in plan.inference_stats + plan.rollout_wait}) == 4 + 2
    assert (
        plan.inference_name(1, 0) == "rank3/inference_worker_p1_0" and plan.rollout_name(1) == "rank3/rollout_worker_1"
    )


def test_in_one_process_there_are_no_pipes_and_no_parent_to_watch():
    plan, _, _ = _plan(_cfg())
    assert all(s.conns == {} and s.parent_pid is None for s in plan.inference.values())
    assert all(list(s.conns) == [] and s.parent_pid is None for s in plan.rollout)
    assert isinstance(plan.full_queue, queue.Queue)


def test_rollout_worker_w_has_a_pipe_to_inference_worker_w_mod_k_of_each_policy():
    ctx = _Context()
    plan, _, _ = _plan(_cfg(), ctx)
    assert len(ctx.pipes) == 2 * 2  # a pipe per (rollout worker, policy)
    for w, spec in enumerate(plan.rollout):
        assert spec.parent_pid == os.getpid()
        for p in (0, 1):
            inference_end, rollout_end = spec.conns[p].replace("rollout", "inference"), spec.conns[p]
            assert (inference_end, rollout_end) in ctx.pipes
            # served by inference worker w % 2 of policy p, on the other end of the same pipe
            assert plan.inference[(p, w % 2)].conns[w] == inference_end
    assert {w for s in plan.inference.values() for w in s.conns} == {0, 1}
    assert all(len(s.conns) == 1 for s in plan.inference.values())  # 2 rollout workers over k = 0, 1


def test_rollout_workers_are_pinned_by_their_index_among_the_nodes_workers():
    # the node's 5 workers: group 0 has 0..2, this group 3 and 4; 5 cores carry one each
    plan, _, _ = _plan(_cfg(), cores=(10, 11, 12, 13, 14))
    assert [s.cores for s in plan.rollout] == [[13], [14]]
    # 5 workers do not spread evenly over 2 cores: none is pinned
    plan, _, _ = _plan(_cfg(), cores=(10, 11))
    assert [s.cores for s in plan.rollout] == [None, None]
    assert [s.cores for s in _plan(_cfg())[0].rollout] == [None, None]


def test_seeds_and_names_of_one_group_and_of_deterministic_runs():
    plan, _, _ = _plan(_cfg("--deterministic=True", "--async_rl=False", "--num_policies=1"))
    assert all(s.cfg.seed == SEED for s in [*plan.inference.values(), *plan.rollout])  # the job-wide index seeds
    assert plan.inference_name(0, 1) == "rank3/inference_worker_1"
    cfg = _cfg("--nproc_per_node=1", "--num_policies=1")
    group = DeviceGroup(object(), [object()])
    alone = plan_workers(cfg, object(), object(), group, threading.Event())
    assert len(alone.rollout) == 5 and alone.rollout[0].cfg.seed == SEED and alone.rollout[4].device_group == 0
    assert alone.rollout_name(4) == "rollout_worker_4" and alone.inference_name(0, 0) == "inference_worker_0"
