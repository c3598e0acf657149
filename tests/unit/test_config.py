"""Flags: parsing (Sample Factory spellings), validation messages, derived values."""

from __future__ import annotations

import dataclasses

import pytest

from msf.cfg.arguments import build_parser, parse_args
from msf.cfg.config import Config, Derived
from msf.cfg.validation import ConfigError, validate


def test_sample_factory_spellings_parse(tmp_path):
    cfg, given = parse_args(["--with_vtrace=False", "--normalize_input", "true", "--encoder_mlp_layers", "64", "32",
                             "--train_for_env_steps=1e6", f"--train_dir={tmp_path}", "--seed=3"])
    assert cfg.with_vtrace is False and cfg.normalize_input is True
    assert cfg.encoder_mlp_layers == [64, 32]
    assert cfg.train_for_env_steps == 1_000_000 and isinstance(cfg.train_for_env_steps, int)
    assert cfg.seed == 3
    assert {"encoder_mlp_layers", "train_for_env_steps", "seed", "with_vtrace"} <= given and "gamma" not in given


def test_every_field_is_a_flag_with_help_and_group():
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    for f in dataclasses.fields(Config):
        assert f.name in dests
        assert f.metadata["help"] and f.metadata["group"]
    text = parser.format_help()
    for group in ("sampling", "learning", "model", "stopping", "checkpoints"):
        assert group in text


def test_sample_factory_defaults():
    c = Config()
    assert (c.batch_size, c.rollout, c.num_envs_per_worker, c.worker_num_splits) == (1024, 32, 2, 2)
    assert (c.ppo_clip_ratio, c.ppo_clip_value, c.learning_rate, c.gamma, c.gae_lambda) == (0.1, 1.0, 1e-4, 0.99, 0.95)
    assert (c.exploration_loss_coeff, c.max_grad_norm, c.max_policy_lag) == (0.003, 4.0, 1000)
    assert c.encoder_mlp_layers == [512, 512] and c.nonlinearity == "elu"


@pytest.mark.parametrize("changes, flag", [
    ({"batch_size": 48}, "--batch_size"),
    ({"rollout": 1}, "--rollout"),
    ({"num_epochs": 0}, "--num_epochs"),
    ({"recurrence": 0}, "--recurrence"),
    ({"learning_rate": 0.0}, "--learning_rate"),
    ({"lr_adaptive_min": 1.0, "lr_adaptive_max": 0.1}, "--lr_adaptive_min"),
    ({"encoder_mlp_layers": []}, "--encoder_mlp_layers"),
    ({"policy_workers_per_policy": 3, "num_workers": 2}, "--policy_workers_per_policy"),
    ({"experiment": "a/b"}, "--experiment"),
])
def test_invalid_values_name_the_flag(tmp_path, changes, flag):
    cfg = dataclasses.replace(Config(train_dir=str(tmp_path)), **changes)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith(flag + ":")


def test_derived_values():
    cfg = Config(num_workers=3, num_envs_per_worker=4, worker_num_splits=2, batch_size=256, rollout=32,
                 num_batches_per_epoch=2)
    d = Derived.of(cfg)
    assert d.envs_per_split == 2
    assert d.trajectories_per_batch == 8 and d.trajectories_per_iteration == 16
    # spares across workers hold at least two iterations' worth of finished trajectories
    assert cfg.num_workers * (d.slots_per_worker - cfg.num_envs_per_worker) >= 2 * d.trajectories_per_iteration
    assert Derived.of(Config(env_frameskip=4)).frameskip == 4
    assert Derived.of(Config(env_frameskip=4, summaries_use_frameskip=False)).frameskip == 1
