"""Two device groups at half the batch learn what one group learns: the env steps CartPole-v1 needs to a mean
return of 475, over 5 seeds, with one group x 512 and two groups x 256 (the same global batch), asynchronous (the
default) and with --deterministic=True. Every run stops at 475 (--stop_at_return_mean), so a run costs the steps it
measures and no more."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from .conftest import SLACK_S, SMALL_ENV_FLAGS, first_step_reaching, read_summary, run_msf, run_msf_together

SEEDS = (0, 1, 2, 3, 4)
MORE_SEEDS = ((5, 6, 7, 8, 9), (10, 11, 12, 13, 14))  # the asynchronous test's further rounds, if it needs them
BUDGET = 200_000  # env steps per run; a run that has not reached 475 by then counts as never (inf)
# The small-env settings hold no accumulated iteration (--num_batches_to_accumulate=0): on these 2 cores the two
# groups' learners are the slow stage, so the experience of a spare iteration waited a whole iteration for them. With
# 1 accumulated iteration the mean policy lag was 7.7 SGD steps (2 groups) against 4.4 (1 group) and the 2-group
# median 1.06x; with 0, 3.7 against 2.8 and 0.97x (30 seeds each, 2026-12-05, benchmarks/HISTORY.md).
FLAGS = [f for f in SMALL_ENV_FLAGS if not f.startswith("--batch_size")]
ONE, TWO = ["--batch_size=512"], ["--batch_size=256", "--nproc_per_node=2"]  # the README's 2 workers x 16 envs


def _args(train_dir, name: str, seed: int, extra: list[str]) -> list[str]:
    return [
        "--env=CartPole-v1",
        f"--experiment={name}",
        f"--train_dir={train_dir}",
        f"--seed={seed}",
        f"--train_for_env_steps={BUDGET}",
        "--experiment_summaries_interval=1",
        "--stop_at_return_mean=475",
        *FLAGS,
        *extra,
    ]


def _steps(train_dir, name: str, r) -> tuple[float, dict]:
    """(The run's env steps to 475 or inf, its summary), checked against its TensorBoard curve."""
    assert r.returncode == 0, (name, r.stderr[-3000:])
    s = read_summary(train_dir, name)
    assert s["status"] == "done"
    step = s["return_target_reached_at"]
    assert step == first_step_reaching(train_dir / name, 475.0)  # the first summary at 475 stopped the run
    return (math.inf if step is None else float(step)), s


def _run(train_dir, name: str, seed: int, extra: list[str]) -> tuple[float, dict]:
    """One run to a mean return of 475 (it stops there: --stop_at_return_mean) or the budget; (its env steps to
    475 or inf, its summary)."""
    # a run takes ~1 min on a quiet 2-core machine
    return _steps(train_dir, name, run_msf(_args(train_dir, name, seed, extra), timeout=600 + SLACK_S))


@pytest.mark.slow
@pytest.mark.timeout(3600)  # up to 30 runs of 10-20 s each on a quiet 2-core machine; several times that on a busy one
def test_two_groups_at_half_the_batch_need_no_more_samples_than_one_group(train_dir):
    """Over 5 seeds, the median env steps of 2 groups x 256 to a mean return of 475 (the job's last 100 episodes)
    at most 10% above one group x 512's. An asynchronous run does not repeat, and per-seed figures spread by 12-13%
    (sd / mean; 77k to 134k over 30 runs of each), so a 5-seed median ratio moves by several percent between
    repetitions: when it is above 1.10, five more seeds of each run, up to 15, and the bound is on the medians of all
    the seeds run. Resampling the 60 runs measured on 2026-12-05 (median ratio 0.97; benchmarks/HISTORY.md), one round
    fails 1.3% of the time and three rounds 0.01%; a true ratio of 1.20 passes 8% of the time, 1.30 2%.
    Before the episode window was the job's (each rank gave its whole --stats_avg), the same comparison measured
    about 30% above; with one accumulated iteration of trajectories, 6% above (benchmarks/HISTORY.md)."""
    one, two = [], []
    for seeds in (SEEDS, *MORE_SEEDS):
        for seed in seeds:  # interleaved: the machine's drift falls on both alike
            one.append(_run(train_dir, f"one_s{seed}", seed, ONE)[0])
            steps, s = _run(train_dir, f"two_s{seed}", seed, TWO)
            two.append(steps)
            _check_two_group_run(train_dir / f"two_s{seed}", s)
        m1, m2 = statistics.median(one), statistics.median(two)
        print(f"asynchronous, env steps to 475: 1x512 {one} (median {m1}), 2x256 {two} (median {m2})")
        if m1 < math.inf and m2 <= 1.10 * m1:
            break
    # both learn CartPole within the budget (most seeds reach 475), and 2 groups need at most 10% more steps
    assert m1 < math.inf and m2 < math.inf, (one, two)
    assert m2 <= 1.10 * m1, (one, two)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 10 runs of ~1 min each on a quiet 2-core machine; several times that on a busy one
def test_deterministic_two_groups_at_half_the_batch_reach_475_within_10_percent_of_one_group(train_dir):
    """--deterministic=True, the same 32 envs with the same seeds as 1 group x 512 or 2 groups x 256, 5 seeds: the
    medians of the env steps to a mean return of 475 differ by less than 10%. Each run is the same on every
    repetition (its curve is written every iteration, and it stops at the first iteration at 475), so this test
    gives the same figures on every run on the same software; the 1- and 2-group runs of a seed agree to the
    all-reduce's rounding at first (test_deterministic.py, 19 iterations) and drift apart over hundreds of
    iterations, so their per-seed steps differ, and the issue's bound is on the medians."""
    one, two = [], []
    for seed in SEEDS:
        # a seed's two runs at once: deterministic runs do not depend on the load, and they share the cores
        names = (f"det_one_s{seed}", f"det_two_s{seed}")
        r1, r2 = run_msf_together(
            [_args(train_dir, n, seed, [*extra, "--deterministic=True"]) for n, extra in zip(names, (ONE, TWO))],
            timeout=1200 + SLACK_S,
        )
        one.append(_steps(train_dir, names[0], r1)[0])
        steps, s = _steps(train_dir, names[1], r2)
        two.append(steps)
        assert s["world_size"] == 2 and s["policy_lag_max_run"] == 0.0
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"deterministic, env steps to 475: 1x512 {one} (median {m1}), 2x256 {two} (median {m2})")
    assert m1 < math.inf and m2 < math.inf, (one, two)
    assert abs(m2 - m1) < 0.10 * m1, (one, two)


def _check_two_group_run(exp, s: dict) -> None:
    """What a 2-group run leaves: both ranks' figures and log lines, a checkpoint of the global state that loads
    without DDP."""
    assert (s["world_size"], s["nproc_per_node"], s["nnodes"]) == (2, 2, 1)
    assert len(s["fps_per_rank"]) == 2 and all(f > 0 for f in s["fps_per_rank"])
    log = (exp / "log.txt").read_text()
    assert "[rank 0]" in log and "[rank 1]" in log
    state = torch.load(sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))[-1], weights_only=True)
    assert state["world_size"] == 2 and state["env_steps"] == s["env_steps"]
    assert not any(k.startswith("module.") for k in state["model"])
