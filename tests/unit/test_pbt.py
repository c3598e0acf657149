"""PBT's decision (msf.learning.pbt) against hand-worked cases."""

import numpy as np
import pytest

from msf.learning.pbt import PBT_HYPERPARAMETERS, pbt_decision, perturb

H = {"learning_rate": 1e-3, "exploration_loss_coeff": 0.01, "value_loss_coeff": 0.5, "ppo_clip_ratio": 0.1}


def _decide(objectives, gap=0.1, gap_abs=1e-6, rate=0.0, fraction=0.3, seed=0):
    hyper = [{k: v * (i + 1) for k, v in H.items()} for i in range(len(objectives))]
    return pbt_decision(objectives, hyper, np.random.default_rng(seed), fraction, gap, gap_abs, rate, 1.1, 1.5), hyper


def test_the_worst_take_the_best_weights_and_hyperparameters():
    # P=4, fraction 0.3: ceil(1.2) = 2 worst (policies 1 and 3) and 2 best (0 and 2) policies
    out, hyper = _decide([5.0, -1.0, 9.0, 0.0])
    assert [r.recipient for r in out] == [1, 3]
    assert all(r.donor in (0, 2) for r in out)
    for r in out:  # mutation rate 0: the donor's hyperparameters unchanged
        assert r.hyperparameters == pytest.approx(hyper[r.donor])


def test_the_reward_gap_protects_close_policies():
    # 10.5 vs 10: a gap of 0.5 < 0.1 x |10| = 1: kept; with gap 0.01 (0.1 needed): replaced
    assert _decide([10.0, 10.5])[0] == []
    out = _decide([10.0, 10.5], gap=0.01)[0]
    assert [(r.recipient, r.donor) for r in out] == [(0, 1)]
    # the absolute gap counts when the objective is near 0
    assert _decide([0.0, 0.5], gap=0.1, gap_abs=1.0)[0] == []


def test_unmeasured_policies_are_left_alone():
    assert _decide([None, 3.0])[0] == []
    out = _decide([None, 3.0, 1.0, 8.0], fraction=0.5)[0]
    assert [(r.recipient, r.donor) for r in out] == [(2, 3)]  # 3 measured: 1 worst, 1 best


def test_perturb_multiplies_or_divides_within_the_factor_range_and_clips():
    rng = np.random.default_rng(0)
    seen_up = seen_down = False
    for _ in range(200):
        out = perturb(H, rng, 1.0, 1.1, 1.5)
        for k, v in out.items():
            f = v / H[k]
            assert 1.1 - 1e-9 <= f <= 1.5 + 1e-9 or 1 / 1.5 - 1e-9 <= f <= 1 / 1.1 + 1e-9, (k, f)
            seen_up |= f > 1
            seen_down |= f < 1
    assert seen_up and seen_down
    assert perturb(H, rng, 0.0, 1.1, 1.5) == pytest.approx(H)
    big = perturb({**H, "ppo_clip_ratio": 0.99}, np.random.default_rng(3), 1.0, 2.0, 2.0)
    assert big["ppo_clip_ratio"] <= PBT_HYPERPARAMETERS["ppo_clip_ratio"][1]
