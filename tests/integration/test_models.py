"""Models end to end: a recurrent core remembers what a feed-forward policy cannot."""

from __future__ import annotations

import json

import pytest

from .conftest import read_summary, run_msf

MEMORY = [
    "--env=msf_test_envs:MsfCueMemory-v0",
    "--seed=0",
    "--num_workers=2",
    "--num_envs_per_worker=16",
    "--batch_size=256",
    "--rollout=32",
    "--encoder_mlp_layers",
    "32",
    "--learning_rate=1e-3",
    "--train_for_env_steps=200000",
]


@pytest.mark.slow  # default-suite time; the GRU's maths and its determinism stay in the default suite
@pytest.mark.parametrize("rnn", [["--use_rnn=True", "--rnn_size=32"], []], ids=["gru", "feed_forward"])
def test_memory_task_needs_the_recurrent_core(train_dir, rnn):
    """The cue is shown once, 8 blank steps pass, then the agent must name it: with a GRU at least 95% right
    within 200,000 env steps; without one, no better than luck (at most 60%)."""
    exp = "mem_" + ("gru" if rnn else "ff")
    # Without a core the agent can only guess: over the default 100 episodes a fair coin's mean exceeds 0.60
    # in 1.8% of runs (binomial tail), a flaky test. Over the last 1,000 episodes (the last ~10,000 of the
    # 200,000 steps) that chance is about 1e-10, while an agent that remembers still scores 1.0 there.
    window = [] if rnn else ["--stats_avg=1000"]
    r = run_msf([*MEMORY, f"--experiment={exp}", f"--train_dir={train_dir}", *rnn, *window], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, exp)
    assert s["env_steps"] >= 200_000
    if rnn:
        assert s["episode_return_mean"] >= 0.95, s
    else:
        assert s["episode_return_mean"] <= 0.60, s


@pytest.mark.slow  # default-suite time (CI's slow suite runs it)
def test_lstm_core_trains_and_resumes(train_dir):
    args = [
        *MEMORY[:-1],
        "--experiment=lstm",
        f"--train_dir={train_dir}",
        "--use_rnn=True",
        "--rnn_type=lstm",
        "--rnn_size=16",
        "--recurrence=16",
    ]
    r = run_msf([*args, "--train_for_env_steps=20000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    first = read_summary(train_dir, "lstm")
    r = run_msf([*args, "--train_for_env_steps=40000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "lstm")
    assert s["status"] == "done" and s["env_steps"] >= 40000
    assert s["resumed_from_env_steps"] == first["env_steps"]
    # msf-enjoy carries the core's state through each episode
    import json
    import subprocess
    import sys

    from .conftest import msf_env

    r = subprocess.run(
        [sys.executable, "-m", "msf.enjoy", "--experiment=lstm", f"--train_dir={train_dir}", "--max_num_episodes=20"],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "lstm" / "eval.json").read_text())
    assert ev["num_episodes"] == 20 and all(e["length"] == 10 for e in ev["episodes"])  # cue, 8 blanks, query


def test_separate_recurrent_actor_and_critic_train_play_and_export(train_dir):
    """``--use_rnn=True --actor_critic_share_weights=False``: two GRUs, their states side by side per env in the
    trajectory buffer, the inference workers, the learner's sequences, msf-enjoy and the exported file."""
    import subprocess
    import sys

    import torch

    from msf.persistence.checkpoint import list_checkpoints

    from .conftest import msf_env

    args = [
        "--env=msf_test_envs:MsfCueMemory-v0",
        "--experiment=separate",
        f"--train_dir={train_dir}",
        "--num_workers=2",
        "--num_envs_per_worker=4",
        "--rollout=16",
        "--recurrence=8",
        "--batch_size=128",
        "--encoder_mlp_layers",
        "16",
        "--decoder_mlp_layers",
        "8",
        "--use_rnn=True",
        "--rnn_size=8",
        "--actor_critic_share_weights=False",
        "--train_for_env_steps=4000",
    ]
    r = run_msf(args, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "separate")
    assert s["status"] == "done" and s["env_steps"] >= 4000 and s["train_steps"] > 0
    state = torch.load(list_checkpoints(str(train_dir / "separate"))[-1], weights_only=True)
    for name in ("core.weight_hh_l0", "critic_core.weight_hh_l0", "decoder.0.weight", "critic_decoder.0.weight"):
        assert name in state["model"], name
    exp = ["--experiment=separate", f"--train_dir={train_dir}"]
    r = subprocess.run(
        [sys.executable, "-m", "msf.enjoy", *exp, "--max_num_episodes=3", "--no_render"],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "separate" / "eval.json").read_text())
    assert ev["num_episodes"] == 3 and all(e["length"] == 10 for e in ev["episodes"])
    r = subprocess.run(
        [sys.executable, "-m", "msf.export", *exp, "--format=torchscript"],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    desc = json.loads((train_dir / "separate" / "export" / "policy_p0.pt.json").read_text())
    assert desc["inputs"][1]["shape"] == ["batch", 16] and desc["rnn"]["cores"] == 2  # 2 GRUs of 8


SPACES_FLAGS = [
    "--num_workers=2",
    "--num_envs_per_worker=8",
    "--batch_size=256",
    "--encoder_mlp_layers",
    "64",
    "--learning_rate=1e-3",
    "--seed=0",
]


def _enjoy(train_dir, exp: str, episodes: int, *extra: str) -> dict:
    import json
    import subprocess
    import sys

    from .conftest import msf_env

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            f"--experiment={exp}",
            f"--train_dir={train_dir}",
            f"--max_num_episodes={episodes}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((train_dir / exp / "eval.json").read_text())


def test_dict_observations_and_action_masks(train_dir):
    """The cue arrives one-hot inside a Dict; the mask forbids one action per step at -10 if taken."""
    from msf.envs.registry import env_spaces

    spaces = env_spaces("msf_test_envs:MsfDictMask-v0")
    assert spaces.obs_layout == (("action_mask", (3,), 3), ("cue", (3,), 3), ("noise", (4,), 4))
    r = run_msf(
        [
            "--env=msf_test_envs:MsfDictMask-v0",
            "--experiment=dm",
            f"--train_dir={train_dir}",
            *SPACES_FLAGS,
            "--train_for_env_steps=60000",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = _enjoy(train_dir, "dm", 10)
    assert all(e["return"] >= 0 for e in ev["episodes"]), ev  # a forbidden action was never taken
    assert read_summary(train_dir, "dm")["episode_return_mean"] >= 18  # and the cue is read: 20 at best


@pytest.mark.parametrize("env", ["MsfMultiDiscrete-v0", pytest.param("MsfTupleActions-v0", marks=pytest.mark.slow)])
def test_multi_discrete_and_tuple_actions(train_dir, env):
    from msf.envs.registry import env_spaces

    spaces = env_spaces(f"msf_test_envs:{env}")
    assert (spaces.action_nvec, spaces.action_shape, spaces.num_actions) == ((3, 3), (2,), 6)
    r = run_msf(
        [
            f"--env=msf_test_envs:{env}",
            "--experiment=md",
            f"--train_dir={train_dir}",
            *SPACES_FLAGS,
            "--train_for_env_steps=60000",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # random choices earn 2 x 0.5 x 1/3 per step = 6.7 per episode; both dimensions right: 20
    assert read_summary(train_dir, "md")["episode_return_mean"] >= 14
    ev = _enjoy(train_dir, "md", 3, "--eval_deterministic=True")  # the most likely choice in each dimension
    assert ev["return_mean"] >= 18, ev
