"""PBT's decision (msf.learning.pbt) against hand-worked cases."""

import numpy as np
import pytest
import torch

from msf.learning.pbt import PBT_HYPERPARAMETERS, pbt_decision, perturb

from .conftest import make_learner, tiny_config

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


# --- --pbt_optimize_gamma ---


def test_pbt_hyperparameters_hold_gamma_only_with_the_flag():
    from msf.learning.pbt import GAMMA_RANGE, pbt_hyperparameters

    assert "gamma" not in pbt_hyperparameters(False) and pbt_hyperparameters(False) == PBT_HYPERPARAMETERS
    assert pbt_hyperparameters(True) == {**PBT_HYPERPARAMETERS, "gamma": (0.9, 0.9999)} and GAMMA_RANGE == (0.9, 0.9999)
    assert list(pbt_hyperparameters(True))[-1] == "gamma"  # last: the other keys' random draws are unchanged


def test_gamma_is_perturbed_through_one_minus_gamma_and_kept_in_bounds():
    rng = np.random.default_rng(0)
    up = down = 0
    for _ in range(400):
        # --pbt_perturb_min/max (here 2.0) do not apply to gamma: Sample Factory's factor in [1.01, 1.2]
        out = perturb({**H, "gamma": 0.99}, rng, 1.0, 2.0, 2.0)
        f = (1.0 - out["gamma"]) / (1.0 - 0.99)  # the factor on 1 - gamma (on the effective horizon's inverse)
        assert 1.01 - 1e-9 <= f <= 1.2 + 1e-9 or 1 / 1.2 - 1e-9 <= f <= 1 / 1.01 + 1e-9, f
        up += f < 1  # 1 - gamma smaller: gamma larger
        down += f > 1
        for k in H:  # the others by the factor of 2 they were given
            assert out[k] / H[k] == pytest.approx(2.0) or out[k] / H[k] == pytest.approx(0.5)
    assert up > 150 and down > 150
    # a random walk of many rounds stays in [0.9, 0.9999], and reaches both ends
    lo_seen = hi_seen = False
    for start in (0.9, 0.9999):
        g = start
        for _ in range(2000):
            g = perturb({"gamma": g}, rng, 1.0, 1.1, 1.5)["gamma"]
            assert 0.9 <= g <= 0.9999
            lo_seen |= g == 0.9
            hi_seen |= g == 0.9999
    assert lo_seen and hi_seen
    assert perturb({**H, "gamma": 0.97}, rng, 0.0, 1.1, 1.5)["gamma"] == 0.97  # rate 0: unchanged


def _pbt_rig(optimize_gamma: bool):
    from msf.distributed.collectives import Collectives
    from msf.persistence.train_state import TrainState
    from msf.runner.pbt_round import PbtRounds
    from msf.sampling.published_weights import PublishedWeights

    cfg = tiny_config(
        encoder_mlp_layers=[8],
        num_policies=2,
        with_pbt=True,
        pbt_optimize_gamma=optimize_gamma,
        pbt_mutation_rate=1.0,
        pbt_start_mutation=0,
        gamma=0.99,
        seed=3,
    )
    torch.manual_seed(0)
    learners = [make_learner(cfg) for _ in range(2)]
    weights = [PublishedWeights(lr.model) for lr in learners]
    rounds = PbtRounds(cfg, TrainState.fresh(2, 10), learners, weights, Collectives(), True, 0)
    return cfg, learners, rounds


def _replace_worst(rounds, learners):
    """One PBT decision (policy 0 worse than policy 1 by far) applied as ``PbtRounds.run`` applies it."""
    objectives = [0.0, 100.0]
    names = list(learners[0].hyperparameters())
    table = rounds._decide(objectives, names)
    assert int(table[0, 0]) == 1 and int(table[1, 0]) == -1  # policy 0 takes policy 1's weights
    rounds._replace(0, 1, dict(zip(names, table[0, 1:].tolist())), objectives, 0)
    return names


def _advantages(learner, seed=0):
    B, T = learner.derived.trajectories_per_iteration, learner.cfg.rollout
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(B, T + 1, 3, generator=g),
        "actions": torch.randint(0, 2, (B, T), generator=g),
        "log_probs": torch.full((B, T), -0.7),
        "values": torch.randn(B, T, generator=g),
        "rewards": torch.randn(B, T, generator=g),
        "dones": torch.zeros(B, T, dtype=torch.uint8),
        "time_outs": torch.zeros(B, T, dtype=torch.uint8),
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
    }
    return learner._prepare(batch)["advantages"]


def test_with_the_flag_pbt_changes_gamma_and_the_learner_discounts_with_it():
    import dataclasses

    cfg, learners, rounds = _pbt_rig(True)
    names = _replace_worst(rounds, learners)
    assert names[-1] == "gamma"
    new_gamma = learners[0].cfg.gamma
    assert new_gamma != 0.99 and 0.9 <= new_gamma <= 0.9999
    f = (1 - new_gamma) / 0.01
    assert 1.01 - 1e-9 <= f <= 1.2 + 1e-9 or 1 / 1.2 - 1e-9 <= f <= 1 / 1.01 + 1e-9
    assert learners[1].cfg.gamma == 0.99 == cfg.gamma  # the donor and the run's config keep theirs
    assert rounds.state.pbt_replacements[-1]["hyperparameters"]["gamma"] == new_gamma
    # the recipient's advantages are those of a learner built with that gamma, not the run's
    twin_cfg = dataclasses.replace(cfg, **learners[0].hyperparameters())
    twin = make_learner(twin_cfg)
    twin.model.load_state_dict(learners[0].model.state_dict())
    other = make_learner(cfg)
    other.model.load_state_dict(learners[0].model.state_dict())
    adv, adv_twin, adv_run = _advantages(learners[0]), _advantages(twin), _advantages(other)
    assert torch.equal(adv, adv_twin)
    assert (adv - adv_run).abs().max() > 1e-4
    # a checkpoint keeps the policy's gamma; a resume without the flag discounts with the run's
    state = learners[0].state_dict()
    assert state["hyperparameters"]["gamma"] == new_gamma
    resumed = make_learner(cfg)
    resumed.load_state_dict(state)
    assert resumed.cfg.gamma == new_gamma
    no_flag = dataclasses.replace(cfg, pbt_optimize_gamma=False)
    resumed = make_learner(no_flag)
    resumed.load_state_dict(state)
    assert resumed.cfg.gamma == 0.99 and resumed.cfg.learning_rate == state["hyperparameters"]["learning_rate"]


def test_without_the_flag_pbt_never_changes_gamma():
    cfg, learners, rounds = _pbt_rig(False)
    assert "gamma" not in learners[0].hyperparameters()
    for _ in range(20):  # mutation rate 1: every other hyperparameter moves, gamma never
        before = learners[0].hyperparameters()
        rounds.state.pbt_round += 1
        _replace_worst(rounds, learners)
        after = learners[0].hyperparameters()
        assert all(after[k] != before[k] or k == "exploration_loss_coeff" for k in before)
        assert learners[0].cfg.gamma == learners[1].cfg.gamma == 0.99
