"""Writes tests/data/sf2_flags.json: every command-line flag of Sample Factory 2.1.1's parser
(``parse_sf_args(evaluation=True)``), with its type, default and a typical value to give it. Run once, in the
venv that ../shared/peers/setup.sh makes (it has sample-factory 2.1.1); the suite reads the file and needs no
Sample Factory install:

    /tmp/anchors-venv/bin/python tests/data/make_sf2_flag_table.py
"""

from __future__ import annotations

import argparse
import json
import os

from sample_factory.cfg.arguments import parse_sf_args

# typical values where the default says nothing (None, required) or is a machine-dependent path
TYPICAL = {
    "env": "CartPole-v1",
    "train_dir": "./train_dir",
    "seed": "1",
    "normalize_input_keys": ["obs"],
    "eval_env_frameskip": "1",
    "video_name": "replay.mp4",
    "hf_repository": "user/repo",
    "train_script": "train.py",
    "enjoy_script": "enjoy.py",
    "wandb_user": "someone",
    "wandb_group": "group",
    "actor_worker_gpus": ["0"],
    "decoder_mlp_layers": ["64"],
    "wandb_tags": ["a", "b"],
}


def typical(a: argparse.Action) -> str | list[str] | None:
    if a.dest in TYPICAL:
        return TYPICAL[a.dest]
    if isinstance(a, argparse._StoreTrueAction):
        return None  # a switch: given alone
    if a.choices:
        return str(list(a.choices)[0])
    d = a.default
    if isinstance(d, list):
        return [str(x) for x in d] or ["1"]
    if isinstance(d, bool) or (a.type is not None and a.type.__name__ == "str2bool"):
        return "True" if not d else "False"
    return str(d)


def family_defaults() -> dict[str, dict]:
    """The defaults each of Sample Factory's family launchers sets (its ``*_override_defaults``'s
    ``parser.set_defaults``), by msf family prefix."""
    from sf_examples.atari.atari_params import atari_override_defaults
    from sf_examples.mujoco.mujoco_params import mujoco_override_defaults
    from sf_examples.vizdoom.doom.doom_params import doom_override_defaults

    out = {}
    for prefix, override in (
        ("atari_", lambda p: atari_override_defaults("atari_breakout", p)),
        ("doom_", doom_override_defaults),
        ("mujoco_", lambda p: mujoco_override_defaults("mujoco_hopper", p)),
    ):
        parser, _ = parse_sf_args(argv=["--env=x"], evaluation=True)
        override(parser)
        out[prefix] = dict(parser._defaults)
    return out


def main() -> None:
    parser, _ = parse_sf_args(argv=["--env=CartPole-v1"], evaluation=True)
    rows = []
    for a in parser._actions:
        if not a.option_strings[0].startswith("--"):
            continue  # -h
        rows.append(
            {
                "flag": a.option_strings[0],
                "type": a.type.__name__ if a.type is not None else None,
                "switch": isinstance(a, argparse._StoreTrueAction),
                "default": a.default if isinstance(a.default, (int, float, str, list, type(None))) else repr(a.default),
                "choices": list(a.choices) if a.choices else None,
                "typical": typical(a),
            }
        )
    rows = [r for r in rows if r["flag"] != "--train_dir"] + [
        next({**r, "default": "./train_dir"} for r in rows if r["flag"] == "--train_dir")
    ]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sf2_flags.json")
    data = {"sample_factory": "2.1.1", "source": "parse_sf_args(evaluation=True)", "flags": rows}
    data["family_defaults"] = family_defaults()
    with open(out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"{len(rows)} flags -> {out}")


if __name__ == "__main__":
    main()
