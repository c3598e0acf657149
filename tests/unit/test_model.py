"""The actor-critic: the inference fast path agrees with the distribution path; normaliser caches."""

from __future__ import annotations

import numpy as np
import torch

from msf.cfg.config import Config
from msf.envs.registry import EnvSpaces
from msf.model.actor_critic import ActorCritic


def _model(discrete: bool) -> ActorCritic:
    torch.manual_seed(0)
    spaces = EnvSpaces((4,), np.float32, discrete, 3)
    model = ActorCritic(Config(encoder_mlp_layers=[8, 8]), spaces)
    model.obs_normalizer.update(torch.randn(100, 4, dtype=torch.float64) * 3 + 2)
    return model


def test_act_matches_distribution_path():
    for discrete in (True, False):
        model = _model(discrete)
        obs = torch.randn(64, 4)
        actions, log_probs, values, _ = model.act(obs)
        out = model.evaluate(obs)
        assert actions.shape == ((64,) if discrete else (64, 3))
        torch.testing.assert_close(log_probs, model.log_prob(out.dist, actions))
        torch.testing.assert_close(values, out.values)


def test_act_samples_from_the_softmax():
    model = _model(True)
    obs = torch.zeros(1, 4).expand(40000, 4).contiguous()
    actions, _, _, _ = model.act(obs)
    probs = torch.softmax(model.action_head(model.actor_encoder(model.normalize_obs(obs[:1]))), -1)[0]
    freq = torch.bincount(actions, minlength=3).double() / len(actions)
    torch.testing.assert_close(freq, probs.double().detach(), atol=0.01, rtol=0)


def test_float32_normalisation_matches_float64():
    model = _model(True)
    x = torch.randn(50, 4, dtype=torch.float64) * 3 + 2
    torch.testing.assert_close(
        model.obs_normalizer.normalize(x.float()).double(), model.obs_normalizer.normalize(x), atol=1e-5, rtol=0
    )
    # the float32 copies travel with the state_dict (published to inference workers, checkpointed)
    assert {"obs_normalizer.mean_f32", "obs_normalizer.std_f32"} <= model.state_dict().keys()


def test_separate_actor_and_critic():
    torch.manual_seed(0)
    spaces = EnvSpaces((4,), np.float32, True, 3)
    model = ActorCritic(Config(encoder_mlp_layers=[8], actor_critic_share_weights=False), spaces)
    assert model.critic_encoder is not None
    out = model.evaluate(torch.randn(5, 4))
    out.values.sum().backward()
    # the value depends on the critic's encoder only; the policy on the actor's only
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.actor_encoder.parameters())
    assert all(p.grad.abs().sum() > 0 for p in model.critic_encoder.parameters())
    shared = ActorCritic(Config(encoder_mlp_layers=[8]), spaces)
    assert shared.critic_encoder is None
