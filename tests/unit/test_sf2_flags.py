"""Sample Factory 2.1.1's command lines on msf: every one of its flags parses, switches work alone, its family
launchers' defaults are msf's family defaults (msf-train's refusals of its command lines, as a process:
tests/integration/test_sf2_command_lines.py).

The table (tests/data/sf2_flags.json) was generated once from sample-factory 2.1.1 by
tests/data/make_sf2_flag_table.py; the suite needs no Sample Factory install."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from msf.cfg.arguments import EVALUATION_FLAGS, parse_args
from msf.cfg.config import Config
from msf.distributed.nodes import NodePlan
from msf.enjoy import build_enjoy_parser
from msf.envs.families import apply_family_defaults
from msf.train import ignored_flag_notes

TABLE = json.loads((Path(__file__).resolve().parents[1] / "data" / "sf2_flags.json").read_text())
FLAGS = TABLE["flags"]
FIELDS = {f.name for f in dataclasses.fields(Config)}


def _argv(row: dict) -> list[str]:
    v = row["typical"]
    if v is None:
        return [row["flag"]]
    if isinstance(v, list):
        return [row["flag"], *v]
    return [f"{row['flag']}={v}"]


def test_the_table_is_sample_factorys_whole_parser():
    assert TABLE["sample_factory"] == "2.1.1"
    assert len(FLAGS) == 129  # 130 with -h/--help
    assert {"--algo", "--serial_mode", "--async_rl", "--save_video", "--push_to_hub"} <= {r["flag"] for r in FLAGS}


@pytest.mark.parametrize("row", FLAGS, ids=[r["flag"] for r in FLAGS])
def test_msf_train_parses_every_sample_factory_flag(row):
    cfg, given = parse_args(_argv(row))
    name = row["flag"][2:]
    assert name in given
    if name in FIELDS:  # the value reached the config, with Sample Factory's type
        got, typical = getattr(cfg, name), row["typical"]
        if typical is None:
            assert got is True
        elif isinstance(typical, list):
            assert [str(x) for x in got] == typical
        elif row["type"] == "str2bool":
            assert got is (typical == "True")
        elif row["type"] in ("int", "float"):
            assert float(got) == float(typical)
        else:
            assert got == typical
    else:  # msf-enjoy's flags: parsed (a wrong type is still an error), then left out of the config
        assert name in EVALUATION_FLAGS


@pytest.mark.parametrize("row", FLAGS, ids=[r["flag"] for r in FLAGS])
def test_msf_enjoy_parses_every_sample_factory_flag(row):
    ns = vars(build_enjoy_parser().parse_args(_argv(row)))
    assert row["flag"][2:] in ns


def test_every_boolean_flag_is_also_a_switch():
    bools = [f.name for f in dataclasses.fields(Config) if f.type in ("bool", bool)]
    assert len(bools) > 20
    for name in bools:
        default = getattr(Config(), name)
        cfg, _ = parse_args([f"--{name}"])
        assert getattr(cfg, name) is True, name
        cfg, _ = parse_args([f"--{name}", "False"])  # the value may also follow as its own word
        assert getattr(cfg, name) is False, (name, default)
    ns = vars(build_enjoy_parser().parse_args(["--save_video", "--eval_deterministic", "--no_render"]))
    assert ns["save_video"] is ns["eval_deterministic"] is ns["no_render"] is True


@pytest.mark.parametrize("family", sorted(TABLE["family_defaults"]))
def test_choosing_a_family_applies_sample_factorys_defaults_for_it(family):
    env = {"atari_": "atari_breakout", "doom_": "doom_basic", "mujoco_": "mujoco_hopper"}[family]
    sf = TABLE["family_defaults"][family]
    cfg = apply_family_defaults(Config(env=env), {"env"})
    evaluation_only = {"fps"}  # msf-enjoy's real time for doom is 35 fps with eval_env_frameskip=1
    assert set(sf) - FIELDS == evaluation_only & set(sf)
    for k, v in sf.items():
        if k in FIELDS:
            assert getattr(cfg, k) == v, k
    # a flag given wins over the family's default
    cfg = apply_family_defaults(Config(env=env, batch_size=512, gamma=0.9), {"env", "batch_size", "gamma"})
    assert (cfg.batch_size, cfg.gamma) == (512, 0.9)


def test_doom_trains_with_a_recurrent_core_as_in_sample_factory():
    # Sample Factory's global default is use_rnn=True (msf's is False): its Doom runs have a GRU
    assert apply_family_defaults(Config(env="doom_basic"), {"env"}).use_rnn is True
    assert apply_family_defaults(Config(env="CartPole-v1"), {"env"}).use_rnn is False


def test_a_flag_without_effect_is_named_once_with_the_reason():
    plan = NodePlan(
        source="single",
        launcher="local",
        nnodes=1,
        node_rank=0,
        nproc_per_node=1,
        master_addr="127.0.0.1",
        master_port=0,
        hosts=None,
    )
    notes = ignored_flag_notes({"pixel_format", "save_video", "batch_size"}, plan)
    assert len(notes) == 2
    assert notes[0].startswith("msf-train: warning: --pixel_format is accepted from Sample Factory")
    assert "channel axis" in notes[0] and "msf-enjoy" in notes[1]
    assert ignored_flag_notes({"pixel_format"}, dataclasses.replace(plan, node_rank=1)) == []


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="the mujoco extra is not installed")
def test_a_familys_sync_default_that_the_workers_do_not_fit_trains_asynchronously(tmp_path):
    """Sample Factory's MuJoCo launcher sets --async_rl=False, whose rule (an iteration of whole rollouts of every
    env) 2 workers x 3 envs x 64 steps do not fit: a default does not refuse the line, it trains asynchronously
    and says why; given explicitly, the rule is enforced."""
    from msf.cfg.validation import ConfigError
    from msf.train import prepare

    argv = ["--env=mujoco_hopper", "--num_workers=2", "--num_envs_per_worker=3", "--worker_num_splits=1"]
    argv.append(f"--train_dir={tmp_path}")
    cfg, given = parse_args([*argv, "--device=cpu"])
    cfg, _, _, _, notes = prepare(cfg, given)
    assert cfg.async_rl is True and cfg.batch_size == 1024  # the family's other defaults stay
    assert len(notes) == 1 and notes[0].startswith("msf-train: warning: --async_rl: mujoco_*'s default False")
    cfg, given = parse_args([*argv, "--device=cpu", "--async_rl=False"])
    with pytest.raises(ConfigError, match="^--async_rl: False needs a training iteration"):
        prepare(cfg, given)


def test_video_frames_minus_one_records_the_first_episode(tmp_path):
    import numpy as np

    from msf.enjoy import EvalArgs, _Video, validate_eval_args

    validate_eval_args(EvalArgs(video_frames=-1))  # Sample Factory's value, accepted

    class Env:
        def render(self):
            return np.zeros((8, 8, 3), np.uint8)

    video = _Video(str(tmp_path / "v.mp4"), 10, -1)
    for _ in range(3):
        video.record(Env())
    video.episode_ended()
    video.record(Env())
    video.close()
    assert video.frames == 3


def test_files_msf_writes_are_readable_as_open_makes_them(tmp_path):
    import os
    import stat

    from msf.persistence.summaries import file_mode, write_json_atomic

    write_json_atomic(str(tmp_path / "config.json"), {"a": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "config.json").st_mode) == file_mode()
