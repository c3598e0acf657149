"""The reporter's windows and points on a fake clock, a PBT round beside it, and what summary.json holds."""

from __future__ import annotations

import pytest
import torch

from msf.cfg.config import Derived
from msf.distributed.collectives import Collectives, tensor_checksums
from msf.distributed.topology import RankInfo
from msf.persistence.train_state import TrainState
from msf.runner.pbt_round import PbtRounds
from msf.runner.reporter import IterationCounts, Reporter
from msf.sampling.messages import InferenceCounters, RolloutCounters
from msf.sampling.published_weights import PublishedWeights

from .conftest import make_learner, tiny_config

CFG = tiny_config(
    encoder_mlp_layers=[8],
    num_workers=2,
    num_policies=2,
    learner_threads=1,
    with_pbt=True,
    pbt_period_env_steps=1000,
    pbt_start_mutation=0,
    pbt_replace_reward_gap=0.0,
    pbt_replace_reward_gap_absolute=0.0,
)


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Points:
    """TensorBoard's place: the points added, by step."""

    def __init__(self):
        self.points: list[tuple[int, dict]] = []

    def add(self, scalars: dict, step: int) -> None:
        self.points.append((step, dict(scalars)))


def _setup():
    derived = Derived.of(CFG)
    learners = [make_learner(CFG, seed=p) for p in range(2)]
    state = TrainState.fresh(2, CFG.stats_avg)
    rollout, inference = [RolloutCounters(), RolloutCounters()], [InferenceCounters()]
    clock, tb = Clock(100.0), Points()
    rep = Reporter(CFG, derived, RankInfo(), state, learners, rollout, inference, tb, Collectives(), 100.0, clock)
    return rep, learners, state, rollout, inference, clock, tb


def test_waiting_shares_and_fps_are_measured_from_one_summary_to_the_next():
    rep, _, state, rollout, inference, clock, tb = _setup()
    clock.t = 110.0  # 10 s: each rollout worker waited 5 s, the inference worker 2.5 s, the learner 1 s
    for c in rollout:
        c.add_wait(5.0)
    inference[0].add_wait(2.5)
    state.env_steps = 2000
    rep.agreed(IterationCounts(env_steps=1000, learner_wait=1.0))
    rep.summaries()
    step, s = tb.points[-1]
    assert step == 2000
    assert (s["perf/wait_share_rollout"], s["perf/wait_share_inference"]) == (0.5, 0.25)
    assert s["perf/wait_share_learner"] == pytest.approx(0.1)
    assert s["perf/fps_since_start"] == 200.0
    assert rep.global_stats["fps_per_rank"] == [100.0]  # this replica's 1000 steps in 10 s
    clock.t = 130.0  # the next window: 20 s, in which each rollout worker waited 2 s more, nobody else
    for c in rollout:
        c.add_wait(2.0)
    rep.summaries()
    _, s = tb.points[-1]
    assert s["perf/wait_share_rollout"] == pytest.approx(0.1)
    assert (s["perf/wait_share_inference"], s["perf/wait_share_learner"]) == (0.0, 0.0)


def test_a_pbt_round_between_two_summaries_leaves_the_waiting_window_alone():
    rep, learners, state, rollout, _, clock, tb = _setup()
    weights = [PublishedWeights(x.model) for x in learners]
    pbt = PbtRounds(CFG, state, learners, weights, Collectives(), True, frames=0)
    state.policies[0].returns.extend([1.0, 3.0])  # objective 2: the recipient
    state.policies[1].returns.extend([10.0])  # objective 10: the donor
    for c in rollout:
        c.add_wait(4.0)
    clock.t = 110.0
    assert pbt.due(1000)
    pbt.run(1000)
    clock.t = 120.0
    rep.summaries()
    _, s = tb.points[-1]
    assert s["perf/wait_share_rollout"] == pytest.approx(4.0 / 20.0)  # over the 20 s since the start
    # and the round's record: policy 0 took policy 1's weights, bit for bit, as both checksums say
    (rec,) = state.pbt_replacements
    assert (rec["round"], rec["frames"], rec["recipient"], rec["donor"]) == (1, 1000, 0, 1)
    assert (rec["recipient_objective"], rec["donor_objective"]) == (2.0, 10.0)
    donor_sum = int(tensor_checksums(list(learners[1].model.state_dict().values())).sum())
    assert rec["weights_checksum"] == rec["donor_weights_checksum"] == donor_sum
    for k, v in learners[1].model.state_dict().items():
        assert torch.equal(learners[0].model.state_dict()[k], v), k
    assert learners[0].hyperparameters() == rec["hyperparameters"]


def test_the_summary_holds_the_runs_figures():
    rep, learners, state, _, _, clock, _ = _setup()
    state.policies[0].returns.extend([4.0, 6.0])
    state.policies[0].lengths.extend([40, 60])
    state.env_steps, state.episodes, state.dropped_trajectories = 3000, 2, 1
    for _ in range(3):
        rep.trained(1, None, {"loss": 0.5})
    rep.trained(0, (0.0, 1.0, 2.0), {"loss": 0.1})
    rep.trained(0, (0.0, 0.5, 1.0), {"loss": 0.2})  # the run's largest lag stays
    rep.trained(1, (1.0, 3.0, 5.0), {"loss": 0.3})
    rep.summaries()
    s = rep.summary("done", wall=10.0)
    assert {
        "status",
        "env",
        "experiment",
        "msf_version",
        "env_steps",
        "env_frames",
        "wall_seconds",
        "fps",
        "train_steps",
        "policy_version",
        "episodes",
        "episode_return_mean",
        "episode_length_mean",
        "policy_lag_mean",
        "policy_lag_max",
        "policy_lag_max_run",
        "async_rl",
        "serial_mode",
        "dropped_trajectories",
        "env_step_calls",
        "env_steps_trained",
        "env_steps_dropped",
        "env_steps_discarded",
        "world_size",
        "nproc_per_node",
        "nnodes",
        "fps_per_rank",
        "seed",
        "num_policies",
        "policies",
        "pbt_replacements",
        "resumed_from_env_steps",
        "envs_started_after_s",
        "startup_s",
        "return_target_reached_at",
        "sampler_nodes",
    } == s.keys()
    assert (s["status"], s["env_steps"], s["episodes"], s["dropped_trajectories"]) == ("done", 3000, 2, 1)
    assert s["fps"] == 300.0 and s["episode_return_mean"] == 5.0 and s["episode_length_mean"] == 50.0
    assert set(s["policies"]) == {"0", "1"}
    assert s["policies"]["1"]["episode_return_mean"] is None and s["policies"]["1"]["empty_batches"] == 3
    # the run's largest lag, per policy and (policy 0's) at the top, as gathered over the ranks
    assert (s["policy_lag_max_run"], s["policies"]["1"]["policy_lag_max_run"]) == (2.0, 5.0)
    assert (s["async_rl"], s["serial_mode"]) == (True, False)
    assert s["return_target_reached_at"] is None  # no --stop_at_return_mean
    assert s["sampler_nodes"] is None  # no --sampler_port
    assert (s["policies"]["0"]["empty_batches"], rep.policies[0].lag, rep.policies[0].train) == (
        0,
        (0.0, 0.5, 1.0),
        {"loss": 0.2},
    )


def test_a_return_target_is_reached_at_a_summary_and_noted_with_its_frames():
    rep, _, state, _, _, _, _ = _setup()
    assert not rep.reached_target(5.0)  # no summary yet: no means
    state.policies[1].returns.extend([4.0, 6.0])
    state.env_steps = 700
    rep.summaries()
    assert not rep.reached_target(None) and not rep.reached_target(5.5)
    assert rep.target_reached_frames is None
    state.env_steps = 800  # a later count: the summary's frames are noted
    assert rep.reached_target(5.0) and rep.target_reached_frames == 700


def test_the_summary_reports_the_current_lr_beside_the_configured_one():
    """A kl_adaptive schedule moves the lr away from --learning_rate: summary.json gives both, and the current one
    is the checkpoint's ``lr``."""
    import math

    cfg = tiny_config(
        encoder_mlp_layers=[8],
        num_batches_per_epoch=2,
        learner_threads=1,
        learning_rate=3e-3,
        lr_schedule="kl_adaptive_minibatch",
        lr_schedule_kl_threshold=1.0,  # every minibatch's KL is below half of it: the lr goes up by 1.5 each time
    )
    derived = Derived.of(cfg)
    learner = make_learner(cfg, seed=0)
    B, T = derived.trajectories_per_iteration, cfg.rollout
    learner.train(
        {
            "obs": torch.randn(B, T + 1, 3),
            "actions": torch.randint(0, 2, (B, T)),
            "log_probs": torch.full((B, T), math.log(0.5)),
            "values": torch.zeros(B, T),
            "rewards": torch.randn(B, T),
            "dones": torch.zeros(B, T, dtype=torch.uint8),
            "time_outs": torch.zeros(B, T, dtype=torch.uint8),
            "policy_versions": torch.zeros(B, T, dtype=torch.int64),
        }
    )
    state = TrainState.fresh(1, cfg.stats_avg)
    rep = Reporter(
        cfg,
        derived,
        RankInfo(),
        state,
        [learner],
        [RolloutCounters()],
        [InferenceCounters()],
        Points(),
        Collectives(),
        100.0,
        Clock(100.0),
    )
    policy = rep.summary("done", wall=1.0)["policies"]["0"]
    assert policy["hyperparameters"]["learning_rate"] == 3e-3  # the configured one, as given
    assert policy["learning_rate_current"] == pytest.approx(3e-3 * 1.5**2)  # two minibatches moved it
    assert policy["learning_rate_current"] == state.capture(0, learner, cfg.to_dict(), 1)["lr"]
