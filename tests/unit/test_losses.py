"""PPO-clip policy loss, clipped value loss and the KL estimator, against hand computations."""

import math

import pytest
import torch

from msf.learning.losses import approx_kl, clipped_value_loss, ppo_policy_loss


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
