"""Two learner replicas under DDP (gloo, CPU) against one learner on the concatenated batch.

Invariants 1 and 4 of DESIGN.md: after each SGD step the replicas are bit-identical, and N
replicas with per-replica batch B compute the update of one replica with batch N*B, with
input and return normalisation on, for GAE and V-trace.
"""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from msf.cfg.config import Config, Derived
from msf.distributed.collectives import ProcessGroupCollectives, ReplicaMismatch, learner_state_tensors
from msf.envs.registry import EnvSpaces
from msf.learning.learner import Learner

SPACES = EnvSpaces(obs_shape=(3,), obs_dtype=np.float32, discrete=True, num_actions=2)
T = 4
ITERATIONS = 3


RNN_SIZE = 8


def _cfg(batch_size: int, vtrace: bool, rnn: bool = False) -> Config:
    extra = dict(use_rnn=True, rnn_size=RNN_SIZE, recurrence=T // 2) if rnn else {}
    return Config(
        encoder_mlp_layers=[16, 16],
        batch_size=batch_size,
        rollout=T,
        num_workers=1,
        num_envs_per_worker=2,
        with_vtrace=vtrace,
        num_epochs=2,
        learning_rate=1e-3,
        seed=0,
        **extra,
    )


def _full_batch(iteration: int, B: int, masked: bool = False, rnn: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + iteration)
    dones = (torch.rand(B, T, generator=g) < 0.2).to(torch.uint8)
    extra = {}
    if rnn:
        # the behaviour policy's core states before each step (two sequences of T/2 per trajectory)
        extra["rnn_states"] = torch.randn(B, T + 1, RNN_SIZE, generator=g) * 0.5
    if masked:
        # the two halves hold different numbers of valid samples; in iteration 1 the second half
        # (rank 1's batch) holds none at all
        valids = (torch.rand(B, T, generator=g) < 0.7).to(torch.uint8)
        valids[0] = 0
        if iteration == 1:
            valids[B // 2 :] = 0
        extra["valids"] = valids
    return {
        **extra,
        "obs": torch.randn(B, T + 1, 3, generator=g) * 2.0 + 1.0,
        "actions": torch.randint(0, 2, (B, T), generator=g),
        "log_probs": torch.log(torch.rand(B, T, generator=g) * 0.6 + 0.2),
        "values": torch.randn(B, T, generator=g) * 0.5,
        "rewards": torch.randn(B, T, generator=g),
        "dones": dones,
        "time_outs": dones * (torch.rand(B, T, generator=g) < 0.5).to(torch.uint8),
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
    }


def _train(learner: Learner, B: int, part: slice, masked: bool = False, rnn: bool = False) -> list[float]:
    grad_norms = []
    for it in range(ITERATIONS):
        batch = {k: v[part] for k, v in _full_batch(it, B, masked, rnn).items()}
        grad_norms.append(learner.train(batch)["grad_norm"])
    return grad_norms


def _replica(
    rank: int, world: int, port: int, vtrace: bool, masked: bool, rnn: bool, out: dict, device: str = "cpu"
) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(rank)  # different on purpose: DDP's constructor must broadcast rank 0's weights
        cfg = _cfg(batch_size=2 * T, vtrace=vtrace, rnn=rnn)
        coll = ProcessGroupCollectives()
        learner = Learner(cfg, Derived.of(cfg), SPACES, device, collectives=coll)
        half = Derived.of(cfg).trajectories_per_iteration
        grad_norms = _train(learner, world * half, slice(rank * half, (rank + 1) * half), masked, rnn)
        coll.check_identical(learner_state_tensors(learner.model, learner.optimizer))
        out[rank] = (
            {k: v.cpu().clone() for k, v in learner_state_tensors(learner.model, learner.optimizer).items()},
            grad_norms,
        )
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "vtrace, masked, rnn",
    [
        (False, False, False),
        (False, True, False),
        (True, False, False),
        (True, True, False),
        (False, False, True),
        (True, False, True),
    ],
    ids=["gae", "gae-masked", "vtrace", "vtrace-masked", "gae-gru", "vtrace-gru"],
)
def test_two_replicas_match_one_learner_on_the_whole_batch(vtrace, masked, rnn):
    """Masked: the replicas hold different numbers of valid samples, one of them none in one iteration.
    GRU: the recurrent core re-run over sequences of T/2 steps from the stored states."""
    check_two_replicas_match_one_learner(vtrace, masked, rnn)


def check_two_replicas_match_one_learner(vtrace: bool, masked: bool, rnn: bool, device: str = "cpu") -> None:
    """Two gloo replicas whose learners live on ``device`` against one learner on the CPU (float32)."""
    out = mp.Manager().dict()
    mp.spawn(_replica, args=(2, _free_port(), vtrace, masked, rnn, out, device), nprocs=2, join=True)
    state0, gn0 = out[0]
    state1, gn1 = out[1]
    for k in state0:
        assert torch.equal(state0[k], state1[k]), f"replicas differ in {k}"
    assert gn0 == gn1
    torch.manual_seed(0)
    cfg = _cfg(batch_size=4 * T, vtrace=vtrace, rnn=rnn)
    single = Learner(cfg, Derived.of(cfg), SPACES)
    # the replicas were built with other seeds; rank 0's weights were broadcast: start from them
    init = _cfg(batch_size=2 * T, vtrace=vtrace, rnn=rnn)
    torch.manual_seed(0)
    single.model.load_state_dict(Learner(init, Derived.of(init), SPACES).model.state_dict())
    B = Derived.of(cfg).trajectories_per_iteration
    gn_single = _train(single, B, slice(0, B), masked, rnn)
    for a, b in zip(gn_single, gn0):
        # the averaged gradient, before clipping (across devices the float32 sums round differently)
        assert math.isclose(a, b, rel_tol=1e-5 if device == "cpu" else 1e-4), (gn_single, gn0)
    ref = learner_state_tensors(single.model, single.optimizer)
    assert ref.keys() == state0.keys()
    for k, v in ref.items():
        torch.testing.assert_close(state0[k].double(), v.double(), rtol=1e-4, atol=1e-5, msg=k)
    valid = sum(int(_full_batch(it, B, masked).get("valids", torch.ones(B, T)).sum()) for it in range(ITERATIONS))
    assert state0["model.obs_normalizer.count"].item() == valid  # true count of valid samples, not x world size


def _perturbed_replica(rank: int, world: int, port: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        cfg = _cfg(batch_size=2 * T, vtrace=False)
        coll = ProcessGroupCollectives()
        learner = Learner(cfg, Derived.of(cfg), SPACES, collectives=coll)
        state = learner_state_tensors(learner.model, learner.optimizer)
        coll.check_identical(state)  # identical after construction
        if rank == 1:
            learner.model.obs_normalizer.mean[0] += 1e-12
        try:
            coll.check_identical(learner_state_tensors(learner.model, learner.optimizer))
            out[rank] = "no error"
        except ReplicaMismatch as e:
            out[rank] = str(e)
    finally:
        dist.destroy_process_group()


def test_checksum_catches_a_perturbed_normaliser():
    out = mp.Manager().dict()
    mp.spawn(_perturbed_replica, args=(2, _free_port(), out), nprocs=2, join=True)
    for r in (0, 1):
        assert "'model.obs_normalizer.mean' on rank(s) [1]" in out[r], out[r]
