"""RunHealth on hand-built numbers: the warning of a run whose batch does not fill, and of a high dropped share."""

from __future__ import annotations

import logging

from msf.cfg.config import Derived
from msf.runner.run_health import DROP_WINDOW_S, NO_STEP_FIRST_S, RunHealth

from .conftest import tiny_config


def _health(**changes) -> tuple[RunHealth, int]:
    cfg = tiny_config(**changes)
    derived = Derived.of(cfg)
    return RunHealth(cfg, derived, [5]), derived.trajectories_per_iteration * cfg.rollout


def test_no_sgd_step_is_warned_at_growing_intervals_with_the_time_a_batch_takes(caplog):
    health, batch = _health(batch_size=4000, rollout=4)  # 1,000 trajectories a batch
    caplog.set_level(logging.WARNING, logger="msf")
    health.observe(0.0, False, [(0, 0)], [5])  # the envs still start: the clock has not begun
    health.observe(100.0, True, [(0, 0)], [5])  # sampling begins at 100 s
    for t in range(101, 100 + int(NO_STEP_FIRST_S)):
        health.observe(float(t), True, [(1, 0)], [5])  # one trajectory (4 samples) a second
    assert not caplog.records  # under 30 s of sampling: nothing yet
    health.observe(100.0 + NO_STEP_FIRST_S, True, [(1, 0)], [5])
    (warning,) = [r.getMessage() for r in caplog.records]
    # 30 trajectories in 30 s: 1 a second, 1,000 seconds for a batch
    assert f"120 of the {batch} samples" in warning and "about 1000 s" in warning, warning
    for flag in ("--batch_size", "--num_workers", "--num_envs_per_worker", "--rollout"):
        assert flag in warning
    for t in range(131, 160):
        health.observe(float(t), True, [(1, 0)], [5])
    assert len(caplog.records) == 1  # not at every pass: the next one at 60 s
    health.observe(160.0, True, [(1, 0)], [5])
    assert len(caplog.records) == 2
    assert health.untrained([5]) and not health.untrained([6])
    summary = {"policies": {"0": {}}}
    health.add_to_summary(summary, 160.0)
    assert summary["policies"]["0"]["batch_seconds"] == batch / 4  # 60 trajectories in 60 s


def test_a_policy_that_trains_is_not_warned_about(caplog):
    health, _ = _health(batch_size=4000, rollout=4)
    caplog.set_level(logging.WARNING, logger="msf")
    health.observe(0.0, True, [(1, 0)], [5])
    health.observe(1.0, True, [(1, 0)], [6])  # an SGD step
    health.observe(NO_STEP_FIRST_S * 3, True, [(1, 0)], [6])
    assert not caplog.records and not health.untrained([6])


def test_a_high_dropped_share_over_the_window_is_warned_once_and_kept_for_the_summary(caplog):
    health, batch = _health()
    per_iteration = batch // 4  # trajectories (rollout 4)
    caplog.set_level(logging.WARNING, logger="msf")
    # an iteration of nothing but drops (too few to judge), which falls out of the window (with it, 3 of 5 were
    # dropped); then half dropped: not above the threshold
    health.observe(0.0, True, [(per_iteration, per_iteration)], [6])
    health.observe(DROP_WINDOW_S + 1, True, [(4 * per_iteration, 2 * per_iteration)], [7])
    assert not caplog.records
    health.observe(DROP_WINDOW_S + 2, True, [(4 * per_iteration, 4 * per_iteration)], [8])  # 6 of 8 dropped
    health.observe(DROP_WINDOW_S + 3, True, [(4 * per_iteration, 4 * per_iteration)], [9])
    (warning,) = [r.getMessage() for r in caplog.records]  # once
    for flag in ("--max_policy_lag", "--num_epochs", "--num_batches_per_epoch", "--num_batches_to_accumulate"):
        assert flag in warning
    summary = {"policies": {"0": {}}}
    health.add_to_summary(summary, DROP_WINDOW_S + 3)
    assert summary["policies"]["0"]["dropped_share_warned"] == 0.75


def test_a_few_dropped_trajectories_are_not_a_share():
    health, batch = _health()
    health.observe(0.0, True, [(1, 1)], [6])  # 100% of one trajectory: less than two iterations' worth
    summary = {"policies": {"0": {}}}
    health.add_to_summary(summary, 1.0)
    assert summary["policies"]["0"]["dropped_share_warned"] is None
