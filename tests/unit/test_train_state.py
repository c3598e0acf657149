"""The training state: what a checkpoint captures is what a restore gives back, bit for bit, to a fresh learner."""

from __future__ import annotations

import logging
import math

import torch

from msf.cfg.config import Derived
from msf.learning.learner import Learner
from msf.persistence.checkpoint import save_checkpoint
from msf.persistence.train_state import TrainState

from .conftest import make_learner, tiny_config

CFG = tiny_config(num_epochs=2)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    B, T = Derived.of(CFG).trajectories_per_iteration, CFG.rollout
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(B, T + 1, 3, generator=g),
        "actions": torch.randint(0, 2, (B, T), generator=g),
        "log_probs": torch.full((B, T), math.log(0.5)),
        "values": torch.randn(B, T, generator=g),
        "rewards": torch.randn(B, T, generator=g),
        "dones": torch.zeros(B, T, dtype=torch.uint8),
        "time_outs": torch.zeros(B, T, dtype=torch.uint8),
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
    }


def _trained_state() -> tuple[Learner, TrainState]:
    learner = make_learner(CFG, seed=0)
    learner.train(_batch(1))  # Adam has moments now, the normalisers have statistics
    state = TrainState.fresh(num_policies=1, stats_avg=3)
    state.env_steps, state.episodes, state.dropped_trajectories = 1000, 12, 2
    state.policies[0].returns.extend([1.0, 2.0, 3.0, 4.0])  # keeps the last 3
    state.policies[0].lengths.extend([10, 20, 30, 40])
    state.policies[0].best_metric = 2.5
    state.pbt_round = 1
    state.pbt_replacements.append({"round": 1, "recipient": 0, "donor": 1, "weights_checksum": 2**50 + 3})
    return learner, state


def _assert_same_learner_state(a: Learner, b: Learner) -> None:
    ma, mb = a.model.state_dict(), b.model.state_dict()
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k
    oa, ob = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys() and oa["state"]
    for i in oa["state"]:
        for k, v in oa["state"][i].items():
            assert torch.equal(v, ob["state"][i][k]), (i, k)
    assert a.train_step == b.train_step and a.lr == b.lr


def test_capture_then_restore_gives_a_fresh_learner_the_same_state_and_the_counters(tmp_path):
    learner, state = _trained_state()
    save_checkpoint(state.capture(0, learner, CFG.to_dict(), world_size=2), str(tmp_path), keep=2)
    fresh = make_learner(CFG, seed=7)  # other initial weights: all of them must come from the file
    assert not torch.equal(
        fresh.model.state_dict()["action_head.weight"], learner.model.state_dict()["action_head.weight"]
    )
    restored = TrainState.restore([fresh], str(tmp_path), resume=True, learning_rate=CFG.learning_rate, stats_avg=3)
    _assert_same_learner_state(learner, fresh)
    assert (restored.env_steps, restored.episodes, restored.dropped_trajectories) == (1000, 12, 2)
    assert list(restored.policies[0].returns) == [2.0, 3.0, 4.0]
    assert list(restored.policies[0].lengths) == [20, 30, 40] and restored.policies[0].best_metric == 2.5
    assert restored.pbt_round == 1 and restored.pbt_replacements == state.pbt_replacements
    assert restored.resumed_env_steps == 1000 and restored.purge_step(frameskip=4) == 4001
    restored.policies[0].returns.append(5.0)  # it keeps stats_avg episodes from now on too
    assert list(restored.policies[0].returns) == [3.0, 4.0, 5.0]
    # and it trains on as the original does
    torch.manual_seed(3)
    learner.train(_batch(2))
    torch.manual_seed(3)
    fresh.train(_batch(2))
    _assert_same_learner_state(learner, fresh)


def test_the_captured_checkpoint_names_its_policy_and_run():
    learner, state = _trained_state()
    ckpt = state.capture(0, learner, {"env": "x"}, world_size=2)
    assert ckpt["policy"] == 0 and ckpt["policy_version"] == learner.policy_version == ckpt["train_step"] > 0
    assert ckpt["config"] == {"env": "x"} and ckpt["world_size"] == 2 and "msf_version" in ckpt
    assert ckpt["episode_returns"] == [2.0, 3.0, 4.0] and ckpt["best_metric"] == 2.5


def test_a_changed_learning_rate_replaces_the_checkpoints(tmp_path, caplog):
    learner, state = _trained_state()
    save_checkpoint(state.capture(0, learner, CFG.to_dict(), 1), str(tmp_path), keep=2)
    fresh = make_learner(CFG, seed=7)
    with caplog.at_level(logging.INFO, logger="msf"):
        TrainState.restore([fresh], str(tmp_path), resume=True, learning_rate=CFG.learning_rate * 2, stats_avg=3)
    assert fresh.lr == CFG.learning_rate * 2
    assert "--learning_rate changed" in caplog.text


def test_no_resume_reads_nothing_and_starts_afresh(tmp_path):
    learner, state = _trained_state()
    save_checkpoint(state.capture(0, learner, CFG.to_dict(), 1), str(tmp_path), keep=2)
    fresh = make_learner(CFG, seed=7)
    before = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    restored = TrainState.restore([fresh], str(tmp_path), resume=False, learning_rate=CFG.learning_rate, stats_avg=3)
    assert restored.env_steps == 0 and restored.resumed_env_steps is None and restored.purge_step(4) is None
    assert fresh.train_step == 0 and all(torch.equal(v, fresh.model.state_dict()[k]) for k, v in before.items())


def test_the_exchange_decides_which_state_each_policy_resumes_from(tmp_path):
    """Another rank's newer checkpoint (what ``Collectives.newest_state`` returns) wins over none on disk."""
    learner, state = _trained_state()
    theirs = {**state.capture(0, learner, CFG.to_dict(), 2), "path": "rank 1's checkpoint"}
    seen = []

    def exchange(mine):
        seen.append(mine)
        return theirs

    fresh = make_learner(CFG, seed=7)
    restored = TrainState.restore([fresh], str(tmp_path), True, CFG.learning_rate, 3, exchange=exchange)
    assert seen == [None]  # nothing on this rank's disk
    _assert_same_learner_state(learner, fresh)
    assert restored.env_steps == 1000
