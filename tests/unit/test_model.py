"""The actor-critic: the inference fast path agrees with the distribution path; normaliser caches; separate actor
and critic weights (encoder, recurrent core, decoder each), their gradients and their recurrent state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from msf.cfg.config import Config, Derived, rnn_state_size
from msf.envs.registry import EnvSpaces
from msf.model.actor_critic import ActorCritic

from .conftest import make_learner


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


def _separate_recurrent(rnn_type: str = "gru") -> ActorCritic:
    torch.manual_seed(0)
    cfg = Config(
        encoder_mlp_layers=[8],
        use_rnn=True,
        rnn_type=rnn_type,
        rnn_size=4,
        decoder_mlp_layers=[6],
        actor_critic_share_weights=False,
    )
    return ActorCritic(cfg, EnvSpaces((3,), np.float32, True, 2))


def _actor_and_critic_parameters(model: ActorCritic) -> tuple[dict, dict]:
    critic = ("critic_encoder.", "critic_core.", "critic_decoder.", "value_head.")
    named = dict(model.named_parameters())
    return {n: p for n, p in named.items() if not n.startswith(critic)}, {
        n: p for n, p in named.items() if n.startswith(critic)
    }


def test_separate_recurrent_actor_and_critic_do_not_share_gradients():
    """Over sequences with resets (the learner's pass): the value's gradients reach every critic parameter and no
    actor parameter, the logits' the reverse."""
    model = _separate_recurrent()
    actor, critic = _actor_and_critic_parameters(model)
    assert {n.split(".")[0] for n in actor} == {"actor_encoder", "core", "decoder", "action_head"}
    assert {n.split(".")[0] for n in critic} == {"critic_encoder", "critic_core", "critic_decoder", "value_head"}
    B, R = 3, 4
    obs, h0 = torch.randn(B * R, 3), torch.randn(B, model.rnn_state_size)
    dones = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    for loss_of, reached, untouched in [
        (lambda p, v: v.square().sum(), critic, actor),
        (lambda p, v: p.square().sum(), actor, critic),
    ]:
        model.zero_grad(set_to_none=True)
        loss_of(*model(obs, h0, dones)).backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in reached.values())
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in untouched.values())


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_separate_cores_keep_their_own_halves_of_the_state(rnn_type):
    """The state is the actor's core's, then the critic's: the first half moves only the logits, the second only
    the values, and each new half comes from its own core."""
    model = _separate_recurrent(rnn_type).eval()
    S = model.core_state_size
    assert model.rnn_state_size == 2 * S == 2 * 4 * (2 if rnn_type == "lstm" else 1)
    obs, h = torch.randn(5, 3), torch.randn(5, 2 * S)
    with torch.no_grad():
        params, values, new = model.forward_with_states(obs, h)
        other_actor = torch.cat([torch.randn(5, S), h[:, S:]], 1)
        p_a, v_a, new_a = model.forward_with_states(obs, other_actor)
        other_critic = torch.cat([h[:, :S], torch.randn(5, S)], 1)
        p_c, v_c, new_c = model.forward_with_states(obs, other_critic)
    assert (params - p_a).abs().max() > 1e-3 and torch.equal(values, v_a)
    assert torch.equal(params, p_c) and (values - v_c).abs().max() > 1e-3
    assert torch.equal(new[:, S:], new_a[:, S:]) and not torch.allclose(new[:, :S], new_a[:, :S])
    assert torch.equal(new[:, :S], new_c[:, :S]) and not torch.allclose(new[:, S:], new_c[:, S:])


@pytest.mark.parametrize(
    "rnn_type, layers, share, size",
    # Sample Factory's get_rnn_size: rnn_size x layers, x2 for an LSTM, x2 for separate weights
    [
        ("gru", 1, True, 16),
        ("gru", 1, False, 32),
        ("gru", 2, False, 64),
        ("lstm", 1, True, 32),
        ("lstm", 2, False, 128),
    ],
)
def test_the_state_size_is_sample_factorys_in_the_buffer_and_the_model(rnn_type, layers, share, size):
    cfg = Config(
        encoder_mlp_layers=[8],
        use_rnn=True,
        rnn_type=rnn_type,
        rnn_size=16,
        rnn_num_layers=layers,
        actor_critic_share_weights=share,
    )
    model = ActorCritic(cfg, EnvSpaces((3,), np.float32, True, 2))
    assert rnn_state_size(cfg) == Derived.of(cfg).rnn_state_size == model.rnn_state_size == size
    _, _, new = model.forward_with_states(torch.randn(2, 3))
    assert new.shape == (2, size)
    no_core = Config(use_rnn=False, actor_critic_share_weights=share)
    assert rnn_state_size(no_core) == Derived.of(no_core).rnn_state_size == 0


def test_a_separate_weights_checkpoint_of_one_shared_decoder_loads_into_both():
    """Until 2026-12-01 msf's separate-weights model applied one decoder to the actor's and the critic's features:
    its checkpoint gives the critic's decoder the same weights (the same function), and a resumed learner keeps
    every other parameter's Adam moments in place."""
    cfg = Config(encoder_mlp_layers=[8], decoder_mlp_layers=[6], actor_critic_share_weights=False)
    learner = make_learner(cfg, seed=0)
    old_names = [n for n, _ in learner.model.named_parameters() if not n.startswith("critic_decoder.")]
    old_model = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in learner.model.state_dict().items()}
    old_model = {k: v for k, v in old_model.items() if not k.startswith("critic_decoder.")}
    old_params = [torch.nn.Parameter(old_model[n].clone()) for n in old_names]
    adam = torch.optim.Adam(old_params)
    sum(p.square().sum() for p in old_params).backward()
    adam.step()
    learner.load_state_dict({"model": old_model, "optimizer": adam.state_dict(), "train_step": 3, "lr": 1e-4})
    model = learner.model
    assert torch.equal(model.critic_decoder[0].weight, old_model["decoder.0.weight"])
    assert torch.equal(model.decoder[0].weight, old_model["decoder.0.weight"])
    named = dict(model.named_parameters())
    for i, n in enumerate(old_names):
        assert torch.equal(learner.optimizer.state[named[n]]["exp_avg"], adam.state[old_params[i]]["exp_avg"]), n
    assert not learner.optimizer.state.get(named["critic_decoder.0.weight"])


def _reference_draw(p: np.ndarray, r: float) -> int:
    """The inversion rule row by row in float64: the action ``j`` with ``c[j - 1] < u <= c[j]``, ``u = (1 - r) x
    c[K - 1]``."""
    c = np.cumsum(p)
    return int(np.searchsorted(c, (1.0 - r) * c[-1], side="left"))


def test_sample_categorical_is_the_inversion_rule_and_never_draws_a_masked_action(monkeypatch):
    from msf.model import distributions

    logits = torch.tensor(
        [[-1e9, 0.5, 1.0], [0.0, 0.3, -1e9], [2.0, -1e9, 0.0], [0.0, 0.0, 0.0], [-1e9, 0.0, -1e9], [1.0, 2.0, 3.0]]
    )
    # the uniform's extremes (0 and its largest value, 1 - 2**-24) and values in between
    for r in (0.0, 1.0 - 2.0**-24, 0.25, 0.5, 0.999):
        monkeypatch.setattr(distributions.torch, "rand_like", lambda x, r=r: torch.full_like(x, r))
        actions, log_probs = distributions.sample_categorical(logits)
        p = torch.softmax(logits.double(), -1).numpy()
        want = [_reference_draw(p[i], r) for i in range(len(logits))]
        assert actions.tolist() == want, r
        assert all(p[i, a] > 0 for i, a in enumerate(want))  # masked (-1e9) never, first or last
        torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1).gather(1, actions[:, None])[:, 0])
        assert actions.dtype == torch.int64 and actions.shape == (len(logits),)


def test_sample_categorical_draws_each_action_with_its_probability():
    from msf.model.distributions import sample_categorical

    torch.manual_seed(0)
    n = 200_000
    logits = torch.tensor([0.0, 1.0, -1e9, 2.0, -0.5])
    actions, _ = sample_categorical(logits.repeat(n, 1))
    freq = torch.bincount(actions, minlength=5).double() / n
    p = torch.softmax(logits.double(), -1)
    # 5 standard errors of a frequency of n draws
    assert torch.all((freq - p).abs() <= 5 * torch.sqrt(p * (1 - p) / n) + 1e-12), (freq, p)
