"""The README's presets say what they change: checked against Sample Factory 2.1.1's own Atari defaults (the table
tests/data/sf2_flags.json, generated from sample-factory itself) and msf's family defaults."""

from __future__ import annotations

import json
from pathlib import Path

from msf.cfg.arguments import parse_args
from msf.cfg.presets import ATARI_SMALL_MACHINE_FLAGS, SF_ATARI_FLAGS
from msf.envs.families import apply_family_defaults

SF2 = json.loads((Path(__file__).resolve().parents[1] / "data" / "sf2_flags.json").read_text())
SF_ATARI = SF2["family_defaults"]["atari_"]
SF_FLAGS = SF2["flags"]


def test_the_atari_small_machine_preset_is_sample_factorys_atari_arguments_but_epochs_async_and_lr_schedule():
    """presets.py: Sample Factory's Atari arguments with 2 epochs (not 4), asynchronous collection (not
    --async_rl=False) and a constant lr (not a linear decay), on 2 workers x 4 envs (8 envs, as SF's 8 x 1), plus
    msf's own flags: a near-uniform first policy and 52x52 screens."""
    cfg, given = parse_args(["--env=atari_pong", *ATARI_SMALL_MACHINE_FLAGS])
    cfg = apply_family_defaults(cfg, given)
    changed = {k: (v, getattr(cfg, k)) for k, v in SF_ATARI.items() if getattr(cfg, k) != v}
    assert changed == {
        "num_epochs": (4, 2),
        "async_rl": (False, True),
        "lr_schedule": ("linear_decay", "constant"),
        "num_workers": (8, 2),
        "num_envs_per_worker": (1, 4),
    }
    assert cfg.num_workers * cfg.num_envs_per_worker == SF_ATARI["num_workers"] * SF_ATARI["num_envs_per_worker"]
    # msf's own flag (Sample Factory has none): the near-uniform first policy, where SF_ATARI_FLAGS keep SF's rule
    sf_gain = next(f["default"] for f in SF_FLAGS if f["flag"] == "--policy_init_gain")
    assert (cfg.action_head_init_gain, cfg.policy_init_gain) == (0.01, sf_gain)
    # and smaller observations (Sample Factory's Atari screens are 84x84, msf's default)
    assert (cfg.atari_screen_size, parse_args(["--env=atari_pong"])[0].atari_screen_size) == (52, 84)


def test_sample_factorys_atari_flags_differ_from_its_atari_defaults_only_in_the_worker_counts():
    """SF_ATARI_FLAGS (what families.py runs beside Sample Factory 2) are its Atari defaults, on 2 x 4 envs."""
    cfg, given = parse_args(["--env=atari_pong", *SF_ATARI_FLAGS])
    cfg = apply_family_defaults(cfg, given)
    changed = {k: (v, getattr(cfg, k)) for k, v in SF_ATARI.items() if getattr(cfg, k) != v}
    assert changed == {"num_workers": (8, 2), "num_envs_per_worker": (1, 4)}
    assert cfg.action_head_init_gain is None  # the action head takes policy_init_gain, as Sample Factory's
