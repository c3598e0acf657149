"""The inference worker, in one process: it writes its policy's outputs exactly at the cursors of the
requested splits, and nowhere else."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces
from msf.model.actor_critic import ActorCritic
from msf.sampling.inference_worker import InferenceWorker
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.trajectory_buffer import TrajectoryBuffer

SENTINEL = {"actions": -7, "log_probs": 99.0, "values": 99.0, "policy_versions": -5}
RNN_SENTINEL = 55.0
T = 5


def _rig(num_policies: int, use_rnn: bool, policy: int):
    cfg = Config(
        num_workers=2,
        num_envs_per_worker=4,
        worker_num_splits=2,
        rollout=T,
        batch_size=T * 4,
        num_policies=num_policies,
        encoder_mlp_layers=[8],
        use_rnn=use_rnn,
        rnn_type="gru",
        rnn_size=4,
        rnn_num_layers=1,
    )
    derived = Derived.of(cfg)
    spaces = EnvSpaces((3,), np.float32, True, 4)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    g = torch.Generator().manual_seed(0)
    buffer.obs.copy_(torch.randn(buffer.obs.shape, generator=g))
    for k, v in SENTINEL.items():
        getattr(buffer, k).fill_(v)
    buffer.rnn_states.fill_(RNN_SENTINEL)
    S = buffer.slot_policy.shape[0]
    # every row of both workers at a distinct slot and some step of it
    slots = torch.randperm(S, generator=g)[:8].view(2, 4)
    buffer.cursors[..., 0] = slots
    buffer.cursors[..., 1] = torch.randint(0, T, (2, 4), generator=g)
    buffer.slot_policy.copy_(torch.randint(0, num_policies, (S,), generator=g))
    torch.manual_seed(1)
    model = ActorCritic(cfg, spaces).eval()
    weights = PublishedWeights(model)
    weights.publish(model, 7)
    return buffer, model, InferenceWorker.in_process(cfg, derived, spaces, buffer, weights, policy=policy)


@pytest.mark.parametrize("num_policies, use_rnn, policy", [(1, False, 0), (1, True, 0), (2, True, 1)])
def test_outputs_are_written_at_the_requested_cursors_and_nowhere_else(num_policies, use_rnn, policy):
    buffer, model, worker = _rig(num_policies, use_rnn, policy)
    requests = [(1, 0), (0, 1)]  # worker 1's split 0 (rows 0, 1), worker 0's split 1 (rows 2, 3)
    cur = torch.cat([buffer.cursors[1, 0:2], buffer.cursors[0, 2:4]])
    cur = cur[buffer.slot_policy[cur[:, 0]] == policy]  # the other policy's rows are not this worker's
    assert 0 < len(cur) < (4 if num_policies > 1 else 5)  # with two policies, some rows are the other's
    slots, ts = cur[:, 0], cur[:, 1]
    before = {k: getattr(buffer, k).clone() for k in (*SENTINEL, "rnn_states")}
    torch.manual_seed(123)
    worker.serve(requests)
    torch.manual_seed(123)
    with torch.inference_mode():
        states = before["rnn_states"][slots, ts] if use_rnn else None
        actions, log_probs, values, new_states = model.act(buffer.obs[slots, ts], states)
    assert torch.equal(buffer.actions[slots, ts], actions)
    torch.testing.assert_close(buffer.log_probs[slots, ts], log_probs, rtol=0, atol=0)
    torch.testing.assert_close(buffer.values[slots, ts], values, rtol=0, atol=0)
    assert (buffer.policy_versions[slots, ts] == 7).all()
    written = torch.zeros(buffer.rewards.shape, dtype=torch.bool)
    written[slots, ts] = True
    for k, v in SENTINEL.items():
        assert (getattr(buffer, k)[~written] == v).all(), k
    rnn_written = torch.zeros(buffer.obs.shape[:2], dtype=torch.bool)
    if use_rnn:
        torch.testing.assert_close(buffer.rnn_states[slots, ts + 1], new_states, rtol=0, atol=0)
        rnn_written[slots, ts + 1] = True
    assert (buffer.rnn_states[~rnn_written] == RNN_SENTINEL).all()
    assert worker.stats.batches == 1 and worker.stats.samples == len(cur)


def test_newer_weights_are_loaded_before_a_batch():
    buffer, model, worker = _rig(1, False, 0)
    worker.serve([(0, 0)])
    assert worker.version == 7
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    worker.weights.publish(model, 8)
    worker.serve([(0, 1)])
    cur = buffer.cursors[0, 2:4]
    assert (buffer.policy_versions[cur[:, 0], cur[:, 1]] == 8).all()
    for a, b in zip(worker.model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
