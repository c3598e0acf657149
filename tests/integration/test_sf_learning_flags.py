"""Sample Factory's learning flags end to end on CartPole-v1 (100k steps, the small-env settings):
``--kl_loss_coeff`` (the fixed KL penalty) and ``--optimizer=lamb`` still learn.

A random policy's CartPole-v1 return is about 22; the small-env settings reach about 425 at 100k steps (seed 0).
Learning runs (about 20 s each on a quiet machine): the slow suite. The flags' values are checked against
independent references in the default suite (tests/unit/test_losses.py, test_optimizers.py, test_sf2_model_flags.py).
"""

from __future__ import annotations

import math

import pytest

from msf.plot import read_curves

from .conftest import SMALL_ENV_FLAGS, read_summary, run_msf

STEPS = 100_000
pytestmark = pytest.mark.slow


def _train(train_dir, experiment: str, *flags: str) -> dict:
    r = run_msf(
        [
            "--env=CartPole-v1",
            f"--experiment={experiment}",
            f"--train_dir={train_dir}",
            f"--train_for_env_steps={STEPS}",
            *SMALL_ENV_FLAGS,
            *flags,  # after the presets: they win
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, experiment)
    assert s["status"] == "done" and s["env_steps"] >= STEPS
    return s


def test_cartpole_learns_with_the_fixed_kl_loss(train_dir):
    """Seeds 0, 1, 2 reached 242, 447, 500 in ~25 s each."""
    s = _train(train_dir, "kl", "--seed=1", "--kl_loss_coeff=0.1")
    assert s["episode_return_mean"] >= 150, s
    # the penalty was on: kl_loss_coeff x the mean KL(current || behaviour), a small positive number
    kl_loss = read_curves(str(train_dir / "kl"))["train/kl_loss"].values
    assert len(kl_loss) > 0 and all(math.isfinite(v) and v >= 0 for v in kl_loss) and kl_loss.max() > 1e-6
    assert kl_loss.max() < 0.1 * 1.0  # coeff x KL, with the KL far below 1 nat


def test_cartpole_learns_with_lamb(train_dir):
    """LAMB's step is relative to each tensor's norm (lr x min(||w||, 10) per tensor), so it needs a larger lr than
    Adam's 3e-4: at a constant 1e-2, seeds 0, 1, 2 reached 485, 497, 481 in ~25 s each (3e-4 with the
    small-env adaptive schedule, capped at 2e-3: 49)."""
    s = _train(train_dir, "lamb", "--seed=0", "--optimizer=lamb", "--learning_rate=1e-2", "--lr_schedule=constant")
    assert s["episode_return_mean"] >= 300, s


def test_cartpole_learns_with_a_decoder_and_scaled_observations(train_dir):
    """--decoder_mlp_layers and --obs_scale / --obs_subtract_mean (their values checked against a float64
    reference in tests/unit/test_sf2_model_flags.py) leave the small-env settings learning."""
    s = _train(train_dir, "dec", "--seed=0", "--decoder_mlp_layers", "64", "--obs_scale=4", "--obs_subtract_mean=0.5")
    assert s["episode_return_mean"] >= 150, s


def test_a_continuous_policy_learns_with_a_learned_stddev_and_tanh_squashed_means(train_dir):
    """Sample Factory's MuJoCo head (--adaptive_stddev=False) with --continuous_tanh_scale=1 on a target-reaching
    task (msf_test_envs.TargetReach): 10 per episode for the perfect policy, below 0 for the untrained one."""
    r = run_msf(
        [
            "--env=msf_test_envs:MsfTargetReach-v0",
            "--experiment=reach",
            f"--train_dir={train_dir}",
            "--train_for_env_steps=60000",
            "--num_workers=2",
            "--num_envs_per_worker=8",
            "--batch_size=256",
            "--learning_rate=1e-3",
            "--adaptive_stddev=False",
            "--continuous_tanh_scale=1",
            "--initial_stddev=0.5",
            "--encoder_mlp_layers",
            "64",
            "64",
            "--seed=0",
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "reach")
    assert s["status"] == "done" and s["episode_return_mean"] >= 8.0, s
