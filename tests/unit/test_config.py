"""Flags: parsing (Sample Factory spellings), validation messages, derived values."""

from __future__ import annotations

import dataclasses

import pytest

from msf.cfg.arguments import build_parser, parse_args
from msf.cfg.config import Config, Derived
from msf.cfg.validation import ConfigError, validate


def test_sample_factory_spellings_parse(tmp_path):
    cfg, given = parse_args(
        [
            "--with_vtrace=False",
            "--normalize_input",
            "true",
            "--encoder_mlp_layers",
            "64",
            "32",
            "--train_for_env_steps=1e6",
            f"--train_dir={tmp_path}",
            "--seed=3",
        ]
    )
    assert cfg.with_vtrace is False and cfg.normalize_input is True
    assert cfg.encoder_mlp_layers == [64, 32]
    assert cfg.train_for_env_steps == 1_000_000 and isinstance(cfg.train_for_env_steps, int)
    assert cfg.seed == 3
    assert {"encoder_mlp_layers", "train_for_env_steps", "seed", "with_vtrace"} <= given and "gamma" not in given


def test_every_field_is_a_flag_with_help_and_group():
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    for f in dataclasses.fields(Config):
        if f.metadata.get("cli") is False:  # Config.env_args: a launch script's own flags (msf.sf2)
            assert f.name not in dests
            continue
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


@pytest.mark.parametrize(
    "changes, flag",
    [
        ({"batch_size": 48}, "--batch_size"),
        ({"rollout": 1}, "--rollout"),
        ({"num_epochs": 0}, "--num_epochs"),
        ({"recurrence": 0}, "--recurrence"),
        ({"learning_rate": 0.0}, "--learning_rate"),
        ({"lr_adaptive_min": 1.0, "lr_adaptive_max": 0.1}, "--lr_adaptive_min"),
        ({"encoder_mlp_layers": []}, "--encoder_mlp_layers"),
        ({"policy_workers_per_policy": 3, "num_workers": 2}, "--policy_workers_per_policy"),
        ({"experiment": "a/../b"}, "--experiment"),
        ({"experiment": "/abs"}, "--experiment"),
        ({"learner_threads": -1}, "--learner_threads"),
        ({"rollout": 0}, "--rollout"),
        ({"worker_num_splits": 0}, "--worker_num_splits"),
        ({"num_workers": 0}, "--num_workers"),
        ({"lr_adaptive_max": -1.0}, "--lr_adaptive_max"),
        ({"num_batches_to_accumulate": -1}, "--num_batches_to_accumulate"),  # 0 is valid: no spare slots
        ({"seed": -1}, "--seed"),  # a rollout worker's env seeding failed, after the start
        ({"seed": 2**43}, "--seed"),  # with --deterministic, an inference worker's generator seed overflowed
    ],
)
def test_invalid_values_name_the_flag(tmp_path, changes, flag):
    cfg = dataclasses.replace(Config(train_dir=str(tmp_path)), **changes)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith(flag + ":")
    assert len(e.value.problems) == 1  # one mistake, one line: a combination with an invalid part is not checked


def test_every_invalid_flag_is_reported_at_once_in_help_order(tmp_path):
    cfg = Config(train_dir=str(tmp_path), gamma=1.5, rollout=0, worker_num_splits=0, nnodes=0, learning_rate=-1.0)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.problems == [
        "--worker_num_splits: must be a positive integer, got 0",
        "--rollout: must be a positive integer, got 0",
        "--learning_rate: must be positive, got -1.0",
        "--gamma: must be in [0, 1], got 1.5",
        "--nnodes: must be a positive integer, got 0",
    ]


def test_msf_train_prints_every_invalid_flag_and_exits_2(tmp_path, capsys):
    from msf.train import main

    code = main([f"--train_dir={tmp_path}", "--batch_size=48", "--num_epochs=0", "--env=CartPole-v1"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "msf-train: error: --batch_size: must be a multiple of rollout=32 (the learner trains on whole "
        "trajectories), got 48",
        "msf-train: error: --num_epochs: must be a positive integer, got 0",
    ]


@pytest.mark.parametrize("env", ["NoSuchEnv-v0", "doom_no_such_scenario"])
def test_a_fatal_error_comes_alone_without_the_pbt_warning_before_it(tmp_path, capsys, env):
    """The PBT warning (no replacement within the budget) is for a run that starts; an env that cannot be made
    ends the start with one line."""
    from msf.train import main

    code = main(
        [
            f"--train_dir={tmp_path}",
            f"--env={env}",
            "--num_workers=1",
            "--num_policies=2",
            "--with_pbt=True",
            "--train_for_env_steps=1000",
        ]
    )
    assert code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("msf-train: error: --env:"), lines


def test_the_pbt_warning_is_given_for_a_run_that_starts():
    from msf.runner.launch import SINGLE
    from msf.train import start_warnings

    cfg = Config(num_policies=2, with_pbt=True, train_for_env_steps=1000)
    assert start_warnings(cfg, SINGLE, []) == [
        "msf-train: warning: --with_pbt: no replacement can happen within --train_for_env_steps=1000 "
        "(--pbt_start_mutation=20000000, --pbt_period_env_steps=5000000)"
    ]
    assert start_warnings(dataclasses.replace(cfg, train_for_env_steps=10**9), SINGLE, []) == []


def test_help_gives_each_default_once():
    """argparse adds "(default: X)" to every flag's help; a help that says what its default is gets none."""
    import re

    text = build_parser().format_help().split("options:", 1)[1]
    entries = {e.split()[0]: " ".join(e.split()) for e in re.split(r"\n(?=  -)", text) if e.strip()}
    assert len(entries) > 100
    for entry in entries.values():
        assert len(re.findall(r"\bdefault\b", entry, re.IGNORECASE)) <= 1, entry
    assert "(default: 0.99)" in entries["--gamma"]
    assert "the default is the number of CPU cores" in entries["--num_workers"]
    assert "(default: a random one)" in entries["--seed"] and "None" not in entries["--seed"]
    assert "Default: one per visible GPU" in entries["--nproc_per_node"] and "None" not in entries["--nproc_per_node"]


def test_msf_enjoy_checks_its_own_flags_at_once():
    from msf.enjoy import EvalArgs, validate_eval_args

    with pytest.raises(ConfigError) as e:
        validate_eval_args(EvalArgs(max_num_episodes=0, fps=-1, video_frames=0))
    assert [p.split(":")[0] for p in e.value.problems] == ["--max_num_episodes", "--video_frames", "--fps"]


def test_flag_scopes_come_from_the_fields_and_show_in_help():
    from msf.cfg import config
    from msf.distributed import rendezvous
    from msf.runner import experiment

    assert {"env", "encoder_mlp_layers", "num_policies", "atari_screen_size", "res_w", "res_h"} <= config.FIXED_FLAGS
    assert set(config.FAMILY_ONLY_FLAGS) <= config.FIXED_FLAGS
    assert {"device", "nproc_per_node", "master_port"} <= config.LAUNCH_FLAGS
    assert {"node_rank", "seed", "num_workers"} <= config.PER_NODE_FLAGS
    assert not config.FIXED_FLAGS & (config.LAUNCH_FLAGS | config.PER_NODE_FLAGS)
    assert experiment.fixed_for is config.fixed_for and experiment.LAUNCH_FLAGS is config.LAUNCH_FLAGS
    assert rendezvous.PER_NODE_FLAGS is config.PER_NODE_FLAGS
    helps = {a.dest: a.help for a in build_parser()._actions}
    assert "[fixed once the experiment exists]" in helps["env"]
    assert "[may differ between nodes]" in helps["node_rank"] and "[" not in helps["gamma"]


def test_derived_values():
    cfg = Config(
        num_workers=3, num_envs_per_worker=4, worker_num_splits=2, batch_size=256, rollout=32, num_batches_per_epoch=2
    )
    d = Derived.of(cfg)
    assert d.envs_per_split == 2
    assert d.trajectories_per_batch == 8 and d.trajectories_per_iteration == 16
    # spares across workers hold at least two iterations' worth of finished trajectories
    assert cfg.num_workers * (d.slots_per_worker - cfg.num_envs_per_worker) >= 2 * d.trajectories_per_iteration
    # Sample Factory's Atari line: 2 workers x 4 envs, 8 trajectories of 128 per iteration: spares for 2 iterations
    # (8 per worker), or with --num_batches_to_accumulate=1 for 1 (4 per worker: one per env, the minimum)
    atari = dict(num_workers=2, num_envs_per_worker=4, rollout=128, batch_size=256, num_batches_per_epoch=4)
    assert Derived.of(Config(**atari)).slots_per_worker == 4 + 8
    assert Derived.of(Config(**atari, num_batches_to_accumulate=1)).slots_per_worker == 4 + 4
    assert Derived.of(Config(**atari), num_agents=2).slots_per_worker == 8 + 8  # one slot per agent row at least
    # 0: no spares, only the slot each env writes; a finished trajectory holds it until the learner copies it out
    assert Derived.of(Config(**atari, num_batches_to_accumulate=0)).slots_per_worker == 4
    assert Derived.of(Config(**atari, num_batches_to_accumulate=0), num_agents=2).slots_per_worker == 8
    assert Derived.of(Config(env_frameskip=4)).frameskip == 4
    assert Derived.of(Config(env_frameskip=4, summaries_use_frameskip=False)).frameskip == 1


def _saved_experiment(tmp_path, **changes):
    import json

    saved = Config(train_dir=str(tmp_path), experiment="e", **changes)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text(json.dumps(saved.to_dict()))
    return saved


def test_resume_takes_the_saved_config_with_given_flags_on_top(tmp_path):
    from msf.runner.experiment import resume_config

    _saved_experiment(tmp_path, learning_rate=3e-4, batch_size=512, nproc_per_node=2, master_port=4000, seed=7)
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e", "--learning_rate=1e-3", "--batch_size=512"])
    merged, changes = resume_config(cfg, given)
    assert merged.learning_rate == 1e-3  # given: overrides
    assert merged.batch_size == 512 and merged.seed == 7  # saved, not the defaults
    assert merged.nproc_per_node is None and merged.master_port == 0  # launch flags: from this command line
    assert changes == ["--learning_rate: 0.0003 -> 0.001"]  # batch_size was given but did not change


@pytest.mark.parametrize(
    "env, argv, flag",
    [
        ("CartPole-v1", ["--env=Pendulum-v1"], "env"),
        ("CartPole-v1", ["--encoder_mlp_layers", "64"], "encoder_mlp_layers"),
        ("CartPole-v1", ["--normalize_input=False"], "normalize_input"),
        ("atari_pong", ["--env=atari_pong", "--atari_screen_size=64"], "atari_screen_size"),
        ("doom_basic", ["--env=doom_basic", "--res_w=64"], "res_w"),  # the observation's shape, as the screen's
        ("doom_basic", ["--env=doom_basic", "--res_h=36"], "res_h"),
    ],
)
def test_resume_refuses_flags_that_fix_the_model(tmp_path, env, argv, flag):
    from msf.runner.experiment import resume_config

    _saved_experiment(tmp_path, env=env)
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e", *argv])
    with pytest.raises(ConfigError, match=f"^--{flag}: cannot change for the existing experiment 'e'"):
        resume_config(cfg, given)


def test_a_fixed_flag_of_another_env_family_may_change_on_resume(tmp_path):
    """--atari_screen_size and --res_w shape nothing of a CartPole experiment: a change is a warned change, not a
    refusal (a fresh user was refused over a flag that did nothing for the env)."""
    from msf.runner.experiment import resume_config

    _saved_experiment(tmp_path, env="CartPole-v1", atari_screen_size=30)
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e", "--atari_screen_size=64", "--res_w=64"])
    merged, changes = resume_config(cfg, given)
    assert (merged.atari_screen_size, merged.res_w) == (64, 64)
    assert changes == ["--atari_screen_size: 30 -> 64", "--res_w: 128 -> 64"]


def test_a_family_flag_is_fixed_by_the_saved_env_when_the_command_line_names_none(tmp_path):
    """Resuming an atari_pong experiment without --env (the default env is CartPole-v1): the saved env decides,
    so a changed --atari_screen_size is still refused."""
    from msf.runner.experiment import resume_config

    _saved_experiment(tmp_path, env="atari_pong")
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e", "--atari_screen_size=64"])
    with pytest.raises(ConfigError, match="^--atari_screen_size: cannot change for the existing experiment 'e'"):
        resume_config(cfg, given)


def test_restart_and_new_experiments_ignore_saved_configs(tmp_path):
    from msf.runner.experiment import resume_config

    _saved_experiment(tmp_path, learning_rate=3e-4)
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e", "--restart_behavior=restart"])
    assert resume_config(cfg, given) == (cfg, [])
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=other"])
    assert resume_config(cfg, given) == (cfg, [])


def test_resume_refuses_checkpoints_without_their_config(tmp_path):
    """A config.json deleted by hand: resuming with this command line's flags would build another model than the
    checkpoints' (a device group then failed loading them, exit 1), so it is refused before anything starts."""
    from msf.runner.experiment import resume_config

    _saved_experiment(tmp_path, encoder_mlp_layers=[64])
    (tmp_path / "e" / "config.json").unlink()
    (tmp_path / "e" / "checkpoint_p0").mkdir()
    (tmp_path / "e" / "checkpoint_p0" / "checkpoint_000000012_3072.pth").write_bytes(b"")
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e"])
    config = tmp_path / "e" / "config.json"
    with pytest.raises(ConfigError, match=f"^--experiment: {config} is missing, and the checkpoints in "):
        resume_config(cfg, given)
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e", "--restart_behavior=restart"])
    assert resume_config(cfg, given) == (cfg, [])


def test_a_saved_config_edited_by_hand_is_checked_as_the_command_line_is(tmp_path, capsys):
    """A value of the wrong type in config.json is one line naming the file and the flag (it was a TypeError's
    traceback from deep in the start-up); a value of the right type is validated even when the command line
    changes nothing (a batch of 100 with a rollout of 32 trained)."""
    import json

    from msf.runner.experiment import resume_config
    from msf.train import main

    saved = _saved_experiment(tmp_path, rollout=32)
    path = tmp_path / "e" / "config.json"
    path.write_text(json.dumps({**saved.to_dict(), "batch_size": "abc", "learning_rate": 1}))
    cfg, given = parse_args([f"--train_dir={tmp_path}", "--experiment=e"])
    with pytest.raises(ConfigError, match=rf"^--experiment: the saved config {path} is unreadable \(batch_size: 'abc'"):
        resume_config(cfg, given)
    path.write_text(json.dumps({**saved.to_dict(), "batch_size": 100, "learning_rate": 1}))
    merged, changes = resume_config(cfg, given)
    assert (merged.batch_size, merged.learning_rate, changes) == (100, 1, [])
    assert main([f"--train_dir={tmp_path}", "--experiment=e"]) == 2
    assert capsys.readouterr().err.startswith("msf-train: error: --batch_size: must be a multiple of rollout=32")


def test_restarts_within_one_second_keep_every_old_folder(tmp_path, monkeypatch):
    """--restart_behavior=restart names the old folder by the second: a second restart within it failed with an
    OSError's traceback (the name was taken)."""
    import os

    from msf.runner import experiment

    monkeypatch.setattr(experiment.time, "strftime", lambda fmt: "20261206_230000")
    cfg = Config(train_dir=str(tmp_path), experiment="e", restart_behavior="restart")
    for i in range(3):
        (tmp_path / "e").mkdir(exist_ok=True)
        (tmp_path / "e" / f"run{i}").write_text("")
        experiment.prepare_experiment_dir(cfg)
    old = "e_old_20261206_230000"
    assert sorted(os.listdir(tmp_path)) == ["e", old, f"{old}_2", f"{old}_3"]
    assert [sorted(os.listdir(tmp_path / f)) for f in (old, f"{old}_2", f"{old}_3")] == [
        ["run0"],
        ["config.json", "run1"],
        ["config.json", "run2"],
    ]


def test_symmetric_kl_is_refused_where_it_is_undefined():
    import numpy as np

    from msf.envs.registry import EnvSpaces
    from msf.train import check_model

    cfg = Config(exploration_loss="symmetric_kl", encoder_mlp_layers=[8], env="mujoco_hopper")
    box = EnvSpaces((3,), np.float32, False, 2)
    with pytest.raises(ConfigError, match="--exploration_loss=symmetric_kl needs discrete actions"):
        check_model(cfg, box)
    masked = EnvSpaces((5,), np.float32, True, 2, obs_layout=(("x", (3,), 3), ("action_mask", (2,), 2)))
    with pytest.raises(ConfigError, match="masks actions"):
        check_model(cfg, masked)
    check_model(cfg, EnvSpaces((3,), np.float32, False, 5, action_nvec=(3, 2)))  # MultiDiscrete: fine


def test_an_atari_screen_too_small_for_the_conv_stack_names_both_flags():
    """convnet_atari (8x8/4, 4x4/2, 3x3/1) needs 36 pixels: 36 builds, 35 is refused before anything spawns, with
    the flag that makes it fit named."""
    import numpy as np

    from msf.envs.registry import EnvSpaces
    from msf.train import check_model

    cfg = Config(env="atari_pong", encoder_conv_architecture="convnet_atari", atari_screen_size=35)
    check_model(cfg, EnvSpaces((4, 36, 36), np.uint8, True, 6))
    with pytest.raises(
        ConfigError,
        match=r"^--encoder_conv_architecture: images of shape \(4, 35, 35\) are too small for "
        r"--encoder_conv_architecture=convnet_atari; .*, or a larger --atari_screen_size$",
    ):
        check_model(cfg, EnvSpaces((4, 35, 35), np.uint8, True, 6))
