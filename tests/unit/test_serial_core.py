"""One device group's sampling in one process: a real trajectory buffer, a rollout worker on CartPole-v1 and
an inference worker, stepped in turn by the serial sampler (the production wiring, without pipes); the buffer
is then checked against an independent replay (plain gymnasium envs seeded alike, stepped with the recorded
actions, and the policy's own forward pass)."""

from __future__ import annotations

import queue

import gymnasium as gym
import numpy as np
import pytest
import torch

from msf.cfg.arguments import parse_args
from msf.cfg.config import Derived
from msf.envs.registry import env_spaces
from msf.model.actor_critic import ActorCritic
from msf.sampling.messages import FullTrajectories
from msf.sampling.plan import DeviceGroup
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.serial import SerialSampler
from msf.sampling.trajectory_buffer import TrajectoryBuffer

T, ENVS, SEED = 8, 4, 5


def _announced(sampler: SerialSampler) -> list[FullTrajectories]:
    out = []
    while True:
        try:
            out.append(sampler.full_queue.get_nowait())
        except queue.Empty:
            return out


@pytest.mark.parametrize("use_rnn", [False, True])
def test_serial_sampling_matches_an_independent_replay(use_rnn):
    cfg, _ = parse_args(
        [
            "--env=CartPole-v1",
            "--num_workers=1",
            f"--num_envs_per_worker={ENVS}",
            "--worker_num_splits=2",
            f"--rollout={T}",
            f"--seed={SEED}",
            "--device=cpu",
            f"--use_rnn={use_rnn}",
            "--rnn_size=8",
            "--decorrelate_envs_on_one_worker=False",  # the replay below starts every env at its reset
        ]
    )
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    torch.manual_seed(0)
    models = {3: ActorCritic(cfg, spaces).eval(), 5: ActorCritic(cfg, spaces).eval()}
    weights = PublishedWeights(models[3])
    weights.publish(models[3], 3)
    sampler = SerialSampler(cfg, derived, spaces, DeviceGroup(buffer, [weights]))
    assert sampler.advance()  # the first round starts the workers: every split asks for its first actions
    rounds, switch = 6 * T + 3, 3 * T + 1  # a few trajectories per env; the learner publishes version 5 midway
    chains = [[int(s)] for s in buffer.cursors[0, :, 0]]  # each row's slots, in the order it filled them
    for r in range(rounds):
        if r == switch:
            weights.publish(models[5], 5)
        # one env step of every row: every request served, then every split stepped (none waits for a slot)
        assert sampler.advance() and not sampler.deferred
        for e, s in enumerate(buffer.cursors[0, :, 0].tolist()):
            if s != chains[e][-1]:
                chains[e].append(s)
    assert all(len(c) == rounds // T + 1 for c in chains)
    assert all((buffer.cursors[0, :, 1] == rounds % T).tolist())
    # exactly the slots that filled were announced, each once, in one message per split and boundary
    msgs = _announced(sampler)
    assert all(m.worker == 0 for m in msgs) and len(msgs) == 2 * (rounds // T)
    announced = [s for m in msgs for s in m.slots]
    assert sorted(announced) == sorted(s for c in chains for s in c[:-1])
    episodes = [_replay(buffer, models, chain, e, rounds, switch, use_rnn) for e, chain in enumerate(chains)]
    assert sum(episodes) >= ENVS  # the replay went through episode ends (CartPole, random policy: ~20 steps)


def _replay(buffer, models, chain, e, rounds, switch, use_rnn) -> int:
    """Check row ``e``'s steps in the buffer against a gymnasium CartPole seeded as env ``e`` is (``seed + e``),
    stepped with the recorded actions, and against the acting model's own outputs; return the episodes
    that ended."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=SEED + e)
    h = torch.zeros(1, buffer.rnn_states.shape[-1]) if use_rnn else None
    episodes = 0
    for k in range(rounds):
        slot, t = chain[k // T], k % T
        if t == 0 and k:
            prev = chain[k // T - 1]
            assert torch.equal(buffer.obs[slot, 0], buffer.obs[prev, T])  # the bootstrap row starts the slot
            if use_rnn:
                assert torch.equal(buffer.rnn_states[slot, 0], buffer.rnn_states[prev, T])
        np.testing.assert_array_equal(buffer.obs[slot, t].numpy(), obs)
        version = 5 if k >= switch else 3
        assert int(buffer.policy_versions[slot, t]) == version
        action = int(buffer.actions[slot, t])
        with torch.no_grad():
            x = torch.from_numpy(np.asarray(obs, dtype=np.float32))[None]
            if use_rnn:
                torch.testing.assert_close(buffer.rnn_states[slot, t][None], h)
            params, value, h = models[version].forward_with_states(x, h)
        torch.testing.assert_close(buffer.values[slot, t], value[0])
        torch.testing.assert_close(buffer.log_probs[slot, t], torch.log_softmax(params, -1)[0, action])
        obs, reward, term, trunc, _ = env.step(action)
        assert float(buffer.rewards[slot, t]) == reward
        assert int(buffer.dones[slot, t]) == int(term or trunc)
        assert int(buffer.time_outs[slot, t]) == int(trunc and not term)
        if term or trunc:
            obs, _ = env.reset()
            episodes += 1
            if use_rnn:
                h = torch.zeros_like(h)
        if use_rnn:
            torch.testing.assert_close(buffer.rnn_states[slot, t + 1][None], h)
    np.testing.assert_array_equal(buffer.obs[chain[-1], rounds % T].numpy(), obs)
    return episodes
