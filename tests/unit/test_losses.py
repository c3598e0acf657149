"""PPO-clip policy loss, clipped value loss and the KL estimator, against hand computations."""

import math

import pytest
import torch

from msf.learning.losses import approx_kl, clipped_value_loss, ppo_policy_loss

from .conftest import make_learner, tiny_config


def test_ppo_policy_loss_by_hand():
    eps = 0.2
    ratios = [1.5, 0.5, 1.1, 1.5]
    adv = [2.0, -1.0, 0.5, -1.0]
    old = [-0.7, -1.2, -2.0, -0.1]
    new = [o + math.log(q) for o, q in zip(old, ratios)]
    terms = [
        1.2 * 2.0,  # ratio 1.5 > 1 + eps, positive advantage: clipped to 1.2
        (1 / 1.2) * -1.0,  # ratio 0.5 < 1 / (1 + eps), negative advantage: clipped to 1/1.2
        math.exp(new[2] - old[2]) * 0.5,  # ratio 1.1 in range: not clipped
        1.5 * -1.0,  # ratio 1.5, negative advantage: the unclipped term is the smaller one
    ]
    loss = ppo_policy_loss(
        torch.tensor(new, dtype=torch.float64),
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        eps,
    )
    assert loss.item() == pytest.approx(-sum(terms) / 4, abs=1e-12)


def test_ppo_clip_range_is_log_symmetric():
    eps, ratio, a = 0.2, 0.82, -1.0
    args = (torch.tensor([math.log(ratio)]), torch.tensor([0.0]), torch.tensor([a]), eps)
    loss = ppo_policy_loss(*args).item()
    ours = -min(ratio * a, (1 / (1 + eps)) * a)  # clip range [1/1.2, 1.2]: 0.82 is clipped up to 0.8333
    linear = -min(ratio * a, max(1 - eps, ratio) * a)  # [0.8, 1.2] would leave 0.82 alone
    assert loss == pytest.approx(ours, abs=1e-6) and loss == pytest.approx(1 / 1.2, abs=1e-6)
    assert abs(loss - linear) > 1e-2


def test_ppo_policy_loss_ratio_one_is_minus_mean_advantage():
    adv = torch.tensor([0.3, -1.2, 2.0, 0.1])
    lp = torch.tensor([-0.5, -1.0, -2.0, -0.1])
    assert ppo_policy_loss(lp, lp.clone(), adv, 0.1).item() == pytest.approx(-adv.mean().item(), abs=1e-7)


def test_clipped_value_loss_by_hand():
    values = torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64)
    old = torch.tensor([0.0, 0.0, 1.5], dtype=torch.float64)
    targets = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    # 0: unclipped (1-2)^2 = 1, clipped (0+0.5-2)^2 = 2.25 -> 2.25 (the clipped term is larger)
    # 1: v == v_old: (0-1)^2 = 1 both ways
    # 2: unclipped (3-0)^2 = 9, clipped (1.5+0.5-0)^2 = 4 -> 9
    loss = clipped_value_loss(values, old, targets, 0.5)
    assert loss.item() == pytest.approx((2.25 + 1.0 + 9.0) / 3, abs=1e-12)


def test_approx_kl_estimates_exact_kl():
    torch.manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.2, 0.3], dtype=torch.float64)
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist()))
    actions = torch.multinomial(p, 200_000, replacement=True)
    est = approx_kl(q.log()[actions], p.log()[actions]).item()
    assert exact > 0.05
    assert est == pytest.approx(exact, abs=5e-3)


def test_approx_kl_zero_for_equal_log_probs():
    lp = torch.tensor([-0.3, -1.7, -2.2])
    assert approx_kl(lp, lp.clone()).item() == 0.0


def test_symmetric_kl_to_uniform_by_hand():
    from torch.distributions import Categorical, kl_divergence

    from msf.learning.losses import symmetric_kl_to_uniform

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.3, 0.3, 0.3], [-20.0, 5.0, 0.0]], dtype=torch.float64)
    u = Categorical(probs=torch.full((3, 3), 1 / 3, dtype=torch.float64))
    p = Categorical(logits=logits)
    ref = 0.5 * (kl_divergence(p, u) + kl_divergence(u, p))
    torch.testing.assert_close(symmetric_kl_to_uniform(logits), ref)
    assert symmetric_kl_to_uniform(logits)[1].item() == pytest.approx(0.0, abs=1e-12)  # uniform: no divergence
    # a nearly impossible action (-20) weighs far more than in the entropy, bounded by log 3
    assert symmetric_kl_to_uniform(logits)[2].item() > 3.0 > math.log(3)
    # MultiDiscrete [3, 2]: the sum of the two independent parts
    two = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    both = symmetric_kl_to_uniform(torch.cat([logits[:1], two], 1), nvec=(3, 2))
    u2, p2 = Categorical(probs=torch.tensor([[0.5, 0.5]], dtype=torch.float64)), Categorical(logits=two)
    torch.testing.assert_close(both, ref[:1] + 0.5 * (kl_divergence(p2, u2) + kl_divergence(u2, p2)))


# --- the fixed KL penalty (--kl_loss_coeff) ---


def test_categorical_kl_is_kl_of_current_to_behaviour():
    from torch.distributions import Categorical, kl_divergence

    from msf.learning.losses import categorical_kl

    g = torch.Generator().manual_seed(0)
    new = torch.randn(6, 4, generator=g, dtype=torch.float64) * 2.0
    old = torch.randn(6, 4, generator=g, dtype=torch.float64) * 2.0
    ref = kl_divergence(Categorical(logits=new), Categorical(logits=old))  # KL(current || behaviour)
    torch.testing.assert_close(categorical_kl(new, old), ref, rtol=1e-12, atol=1e-14)
    # the direction matters: KL(behaviour || current) differs
    assert (
        categorical_kl(new, old) - kl_divergence(Categorical(logits=old), Categorical(logits=new))
    ).abs().max() > 1e-3
    # MultiDiscrete [4, 3]: the sum over the independent parts
    new3, old3 = (
        torch.randn(6, 3, generator=g, dtype=torch.float64),
        torch.randn(6, 3, generator=g, dtype=torch.float64),
    )
    ref3 = ref + kl_divergence(Categorical(logits=new3), Categorical(logits=old3))
    both = categorical_kl(torch.cat([new, new3], 1), torch.cat([old, old3], 1), nvec=(4, 3))
    torch.testing.assert_close(both, ref3, rtol=1e-12, atol=1e-14)
    # a masked action (-1e9 in both) adds nothing and makes no NaN
    masked_new, masked_old = new.clone(), old.clone()
    masked_new[:, 0] = masked_old[:, 0] = -1e9
    ref_m = kl_divergence(Categorical(logits=new[:, 1:]), Categorical(logits=old[:, 1:]))
    torch.testing.assert_close(categorical_kl(masked_new, masked_old), ref_m, rtol=1e-12, atol=1e-14)


def test_gaussian_kl_is_kl_of_current_to_behaviour():
    from torch.distributions import Normal, kl_divergence

    from msf.learning.losses import gaussian_kl

    g = torch.Generator().manual_seed(1)
    mu, mu_old = (torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    ls, ls_old = (0.5 * torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    ref = kl_divergence(Normal(mu, ls.exp()), Normal(mu_old, ls_old.exp())).sum(-1)
    torch.testing.assert_close(gaussian_kl(mu, ls, mu_old, ls_old), ref, rtol=1e-12, atol=1e-14)
    # a state-independent [A] log-std broadcasts
    s, s_old = ls[0], ls_old[0]
    ref_b = kl_divergence(Normal(mu, s.exp().expand_as(mu)), Normal(mu_old, s_old.exp().expand_as(mu))).sum(-1)
    torch.testing.assert_close(gaussian_kl(mu, s, mu_old, s_old), ref_b, rtol=1e-12, atol=1e-14)
    assert gaussian_kl(mu, ls, mu, ls).abs().max().item() == 0.0


def test_fixed_kl_loss_is_coeff_times_the_masked_mean():
    from msf.learning.losses import fixed_kl_loss

    kl = torch.tensor([0.1, 0.4, 7.0, 0.3], dtype=torch.float64)
    valid = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)  # sample 2 masked out
    assert fixed_kl_loss(kl, 0.2, valid / valid.sum()).item() == pytest.approx(0.2 * (0.1 + 0.4 + 0.3) / 3, abs=1e-15)
    assert fixed_kl_loss(kl, 0.2).item() == pytest.approx(0.2 * kl.mean().item(), abs=1e-15)


def _kl_learner(coeff: float, discrete: bool, adaptive: bool = True):
    import numpy as np

    from msf.envs.registry import EnvSpaces

    cfg = tiny_config(encoder_mlp_layers=[8], kl_loss_coeff=coeff, adaptive_stddev=adaptive)
    return make_learner(cfg, EnvSpaces((3,), np.float32, discrete, 3), seed=0)


def _kl_batch(learner, perturb: float):
    """A raw batch whose behaviour parameters are the model's own outputs, moved by ``perturb``, with the last
    trajectory's last two steps masked out."""
    B, T = learner.derived.trajectories_per_iteration, learner.cfg.rollout
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(B, T + 1, 3, generator=g)
    with torch.no_grad():
        params = learner.model(obs[:, :T].reshape(B * T, 3))[0].view(B, T, -1)
    discrete = learner.model.spaces.discrete
    valids = torch.ones(B, T, dtype=torch.uint8)
    valids[-1, -2:] = 0
    batch = {
        "obs": obs,
        "actions": torch.randint(0, 3, (B, T), generator=g) if discrete else torch.randn(B, T, 3, generator=g),
        "log_probs": torch.full((B, T), -1.0),
        "values": torch.zeros(B, T),
        "rewards": torch.randn(B, T, generator=g),
        "dones": torch.zeros(B, T, dtype=torch.uint8),
        "time_outs": torch.zeros(B, T, dtype=torch.uint8),
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
        "valids": valids,
        "action_params": params + perturb * torch.randn(params.shape, generator=g),
    }
    return batch


def _prepared(learner, batch):
    """``batch`` through ``learner``'s preparation (GAE, and its normalisers' update: each learner its own)."""
    return learner._prepare({k: v.clone() for k, v in batch.items()})


def _independent_kl(learner, mb) -> torch.Tensor:
    """Mean over the valid samples of KL(current || behaviour), by torch.distributions in float64."""
    from torch.distributions import Categorical, Normal, kl_divergence

    B, T = mb["rewards"].shape
    new = learner.model(mb["obs"][:, :T].reshape(B * T, 3))[0].double()
    old = mb["action_params"].reshape(B * T, -1).double()
    if learner.model.spaces.discrete:
        kl = kl_divergence(Categorical(logits=new), Categorical(logits=old))
    else:
        (m, ls), (mo, lso) = new.chunk(2, -1), old.chunk(2, -1)
        clamp = (math.log(1e-4), math.log(1e4))  # the policy's standard deviations are clamped to [1e-4, 1e4]
        kl = kl_divergence(Normal(m, ls.clamp(*clamp).exp()), Normal(mo, lso.clamp(*clamp).exp())).sum(-1)
    valid = mb["valids"].reshape(-1).bool()
    return kl[valid].mean()


@pytest.mark.parametrize("discrete, adaptive", [(True, True), (False, True), (False, False)])
def test_learner_kl_loss_matches_torch_distributions_and_is_off_at_zero(discrete, adaptive):
    coeff = 0.3
    on, off = _kl_learner(coeff, discrete, adaptive), _kl_learner(0.0, discrete, adaptive)
    for a, b in zip(on.model.state_dict().values(), off.model.state_dict().values()):
        assert torch.equal(a, b)
    raw = _kl_batch(on, perturb=0.5)
    mb, mb_off = _prepared(on, raw), _prepared(off, raw)

    loss_on, stats_on = on._minibatch_loss(mb)
    loss_on.backward()
    loss_off, stats_off = off._minibatch_loss(mb_off)
    loss_off.backward()
    kl = _independent_kl(off, mb_off)
    assert kl.item() > 1e-2
    # the penalty: coeff x the masked mean KL, in the loss and in the stats; nothing with coeff 0
    assert stats_on["kl_loss"].item() == pytest.approx(coeff * kl.item(), rel=1e-5)
    assert (loss_on - loss_off).item() == pytest.approx(coeff * kl.item(), rel=1e-4)
    assert stats_off["kl_loss"].item() == 0.0
    # gradients: those of coeff 0 plus coeff x grad KL (the float64 torch.distributions KL, backpropagated)
    kl_model = _kl_learner(0.0, discrete, adaptive)
    (coeff * _independent_kl(kl_model, _prepared(kl_model, raw))).backward()
    for p_on, p_off, p_kl in zip(on.model.parameters(), off.model.parameters(), kl_model.model.parameters()):
        expected = p_off.grad + (p_kl.grad if p_kl.grad is not None else 0.0)
        torch.testing.assert_close(p_on.grad, expected, rtol=1e-4, atol=1e-7)
    assert any(p.grad is not None and p.grad.abs().max() > 1e-4 for p in kl_model.model.parameters())


def test_kl_loss_is_zero_with_zero_gradient_when_the_policy_has_not_moved():
    on, off = _kl_learner(0.5, True), _kl_learner(0.0, True)
    raw = _kl_batch(on, perturb=0.0)  # the behaviour parameters are the current ones (before the normaliser update)
    mb = _prepared(on, raw)
    B, T = mb["rewards"].shape
    with torch.no_grad():  # ... and after it
        mb["action_params"] = on.model(mb["obs"][:, :T].reshape(B * T, 3))[0].view(B, T, -1)
    loss_on, stats = on._minibatch_loss(mb)
    loss_on.backward()
    loss_off, _ = off._minibatch_loss(_prepared(off, raw))
    loss_off.backward()
    assert abs(stats["kl_loss"].item()) < 1e-7
    for a, b in zip(on.model.parameters(), off.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("discrete", [True, False])
def test_inference_worker_records_the_behaviour_distribution_only_with_the_kl_loss(discrete):

    import numpy as np

    from msf.cfg.config import Config, Derived
    from msf.envs.registry import EnvSpaces
    from msf.model.actor_critic import ActorCritic
    from msf.sampling.inference_worker import InferenceWorker
    from msf.sampling.published_weights import PublishedWeights
    from msf.sampling.trajectory_buffer import TrajectoryBuffer

    spaces = EnvSpaces((3,), np.float32, discrete, 2)
    for coeff in (0.0, 0.1):
        cfg = Config(
            num_workers=1, num_envs_per_worker=4, rollout=5, batch_size=20, encoder_mlp_layers=[8], kl_loss_coeff=coeff
        )
        derived = Derived.of(cfg)
        buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
        P = buffer.action_params.shape[-1]
        if coeff == 0.0:
            assert P == 0 and "action_params" not in buffer.gather(torch.tensor([0]))
            continue
        assert P == (2 if discrete else 4)  # logits, or means then log standard deviations
        buffer.obs.copy_(torch.randn(buffer.obs.shape, generator=torch.Generator().manual_seed(0)))
        buffer.cursors[0, :, 0] = torch.tensor([0, 1, 2, 3])
        buffer.cursors[0, :, 1] = torch.tensor([0, 4, 2, 1])
        torch.manual_seed(1)
        model = ActorCritic(cfg, spaces).eval()
        weights = PublishedWeights(model)
        weights.publish(model, 3)
        worker = InferenceWorker.in_process(cfg, derived, spaces, buffer, weights)
        worker.serve([(0, 0), (0, 1)])  # both splits: the 4 envs
        slots, ts = buffer.cursors[0, :, 0], buffer.cursors[0, :, 1]
        with torch.no_grad():
            expected = model(buffer.obs[slots, ts])[0]
        torch.testing.assert_close(buffer.action_params[slots, ts], expected, rtol=0, atol=0)
        written = torch.zeros(buffer.rewards.shape, dtype=torch.bool)
        written[slots, ts] = True
        assert (buffer.action_params[~written] == 0).all()
        assert buffer.gather(slots)["action_params"].shape == (4, 5, P)
