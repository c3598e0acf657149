"""KlAdaptiveLR: lr up when the KL is small, down when large, unchanged in between, kept within bounds."""

import pytest

from msf.learning.lr_schedule import KlAdaptiveLR

from .conftest import make_learner


def _sched(lr=1e-3):
    return KlAdaptiveLR(lr, threshold=0.01, lr_min=1e-5, lr_max=1e-2)


def test_down_when_kl_above_twice_threshold():
    assert _sched().update(0.03) == pytest.approx(1e-3 / 1.5)


def test_up_when_kl_below_half_threshold():
    assert _sched().update(0.001) == pytest.approx(1e-3 * 1.5)


@pytest.mark.parametrize("kl", [0.005, 0.01, 0.02])  # both boundaries included
def test_stay_in_between(kl):
    assert _sched().update(kl) == 1e-3


def test_bounds():
    s = _sched()
    for _ in range(50):
        lr = s.update(0.0)
    assert lr == 1e-2 and s.lr == 1e-2
    for _ in range(50):
        lr = s.update(1.0)
    assert lr == 1e-5
    assert _sched(lr=9e-3).update(0.0) == 1e-2  # a step past the bound stops at it


def test_linear_decay_follows_the_spent_share_of_the_budget():
    from msf.cfg.config import Config

    learner = make_learner(Config(encoder_mlp_layers=[4], lr_schedule="linear_decay", learning_rate=2e-3))
    for fraction, lr in ((0.0, 2e-3), (0.25, 1.5e-3), (1.0, 0.0), (1.2, 0.0)):
        learner.set_progress(fraction)
        assert learner.lr == pytest.approx(lr)
