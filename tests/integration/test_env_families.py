"""Sample Factory's environment families end to end: spaces, frame counting, a short training run.

A family whose extra is not installed is skipped with the reason (the README's setup installs [all])."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError
from msf.envs.families import EXTRAS, family_of, require_extra
from msf.envs.registry import env_config_of, env_spaces, make_env

from .conftest import read_summary, run_msf

FAMILIES = [
    # env, obs shape, obs dtype, discrete, frameskip
    ("atari_breakout", (4, 84, 84), np.uint8, True, 4),
    ("doom_basic", (72, 128, 3), np.uint8, True, 4),
    ("mujoco_hopper", (11,), np.float32, False, 1),
    ("MiniGrid-Empty-5x5-v0", (7, 7, 3), np.uint8, True, 1),
]


def _skip_without_extra(env: str) -> None:
    extra, modules = EXTRAS[family_of(env)]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"the {extra} extra is not installed here (missing {', '.join(missing)}; no wheel for this machine?)"
        )


@pytest.mark.parametrize("env, shape, dtype, discrete, frameskip", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_trains_end_to_end(train_dir, env, shape, dtype, discrete, frameskip):
    _skip_without_extra(env)
    spaces = env_spaces(env, env_config_of(Config()))
    assert (spaces.obs_shape, spaces.obs_dtype, spaces.discrete) == (shape, dtype, discrete)
    r = run_msf(
        [
            f"--env={env}",
            "--experiment=fam",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--batch_size=128",
            "--rollout=16",
            "--encoder_conv_mlp_layers",
            "64",
            "--encoder_mlp_layers",
            "64",
            "--train_for_env_steps=6000",
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "fam")
    assert s["status"] == "done" and s["env"] == env
    assert s["env_frames"] == frameskip * s["env_steps"]  # Sample Factory's counting
    cfg = json.loads((train_dir / "fam" / "config.json").read_text())
    # the budget counts frames, and the run ends within the training iteration that spends it (Sample Factory's
    # Atari and MuJoCo defaults, which the family applies, have 4 minibatches per iteration)
    iteration = 128 * cfg["num_batches_per_epoch"]
    assert 6000 <= s["env_frames"] < 6000 + iteration * frameskip
    assert cfg["env_frameskip"] == frameskip
    # --set_workers_cpu_affinity (default True): 2 workers spread evenly over 1 or more cores, so worker i runs
    # on core i mod cores only, as the OS reports it from inside the worker
    cores = sorted(os.sched_getaffinity(0))
    for w in range(2):  # the workers log to the console (stderr)
        assert f"rollout worker {w} uses CPU cores [{cores[w % len(cores)]}]" in r.stderr, r.stderr[-3000:]
    # Sample Factory's niceness: the learner as started (--default_niceness=0), inference +2, rollout workers +10
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert f"learner runs at niceness {base}" in r.stderr
    assert f"inference worker of policy 0 runs at niceness {min(19, base + 2)}" in r.stderr
    for w in range(2):
        assert f"rollout worker {w} runs at niceness {min(19, base + 10)}" in r.stderr
    # and the plan is in the run's log.txt
    plan = ", ".join(f"{w}: [{cores[w % len(cores)]}]" for w in range(2))
    assert f"rollout workers pinned to CPU cores: {plan}" in (train_dir / "fam" / "log.txt").read_text()
    # msf-enjoy plays the trained policy in the evaluation version of the env
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            f"--env={env}",
            "--experiment=fam",
            f"--train_dir={train_dir}",
            "--max_num_episodes=1",
            "--max_num_frames=400",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "fam" / "eval.json").read_text())
    assert ev["env_frames"] == 400 or ev["num_episodes"] == 1


def test_atari_training_wrappers_and_evaluation_wrappers():
    _skip_without_extra("atari_breakout")
    from msf.envs.families import EpisodicLife
    from msf.envs.seeding import reset_ignores_seed

    def chain(env):
        names = []
        while hasattr(env, "env"):
            names.append(type(env).__name__)
            env = env.env
        return names

    train = make_env("atari_breakout", env_config_of(Config()))
    evaluation = make_env("atari_breakout", env_config_of(Config(), evaluation=True))
    assert "EpisodicLife" in chain(train) and "TransformReward" in chain(train)
    assert "EpisodicLife" not in chain(evaluation) and "TransformReward" not in chain(evaluation)
    # a lost life ends the training episode, but the game goes on
    life = train
    while not isinstance(life, EpisodicLife):
        life = life.env
    train.reset(seed=0)
    lives0 = life.env.unwrapped.ale.lives()
    for _ in range(5000):
        _, _, terminated, truncated, _ = train.step(train.action_space.sample())
        if terminated or truncated:
            break
    assert terminated and not life.game_over
    assert life.env.unwrapped.ale.lives() == lives0 - 1
    train.reset()
    assert life.env.unwrapped.ale.lives() == lives0 - 1  # not a new game
    # a reset with a seed starts a new game from it: the same first frame as the first reset with that seed
    first = train.reset(seed=0)[0]
    assert life.env.unwrapped.ale.lives() == lives0
    for _ in range(50):
        train.step(3)  # LEFT: the paddle moves
    assert np.array_equal(train.reset(seed=0)[0], first)
    train.close()
    # so --deterministic's check of the env's seeding finds it seeded (it warned before the seed forced a new game)
    assert not reset_ignores_seed("atari_breakout", env_config_of(Config()))
    evaluation.close()


def test_a_missing_extra_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real(name, *a))
    with pytest.raises(
        ConfigError, match=r"^--env: atari_pong needs the atari extra .*pip install 'multi-sample-factory\[atari\]'"
    ):
        require_extra("atari_pong")


def test_unknown_family_members_are_refused(tmp_path):
    _skip_without_extra("mujoco_hopper")
    r = run_msf(["--env=mujoco_nosuch", "--experiment=x", f"--train_dir={tmp_path}"], timeout=60)
    assert r.returncode == 2 and "--env: unknown MuJoCo task 'nosuch'" in r.stderr
    r = run_msf(
        [
            "--env=MiniGrid-Empty-5x5-v0",
            "--encoder_conv_architecture=convnet_simple",
            "--experiment=y",
            f"--train_dir={tmp_path}",
        ],
        timeout=60,
    )
    assert r.returncode == 2 and "--encoder_conv_architecture:" in r.stderr and "resnet_impala" in r.stderr


def test_doom_makes_its_folder_before_any_engine_starts(tmp_path, monkeypatch):
    """ViZDoom's engine creates ./_vizdoom/ at its first reset; two engines starting together in a fresh
    directory raced for it and the loser died with SIGSEGV (a CI failure). Making the env creates it first."""
    _skip_without_extra("doom_basic")
    monkeypatch.chdir(tmp_path)
    env = make_env("doom_basic", env_config_of(Config()))
    try:
        assert (tmp_path / "_vizdoom").is_dir()  # before any engine ran: no reset yet
        env.reset(seed=0)
        obs, *_ = env.step(0)
        assert obs.shape == (72, 128, 3)
    finally:
        env.close()
    # a file in its place would crash the engine: refused with the path and what to do
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "_vizdoom").write_text("")
    with pytest.raises(ConfigError, match=r"_vizdoom' is not a folder; ViZDoom keeps its files .* remove or rename"):
        make_env("doom_basic", env_config_of(Config()))


@pytest.mark.parametrize(
    "flags, render, shape",
    [
        ({}, (160, 120), (72, 128, 3)),  # Sample Factory's render and resize
        ({"wide_aspect_ratio": True}, (256, 144), (72, 128, 3)),
        ({"res_w": 160, "res_h": 120}, (160, 120), (120, 160, 3)),  # no resize needed
    ],
)
def test_doom_renders_at_sample_factorys_resolution(tmp_path, monkeypatch, flags, render, shape):
    import dataclasses

    _skip_without_extra("doom_basic")
    monkeypatch.chdir(tmp_path)
    cfg = dataclasses.replace(Config(), **flags)
    env = make_env("doom_basic", env_config_of(cfg))
    try:
        obs, _ = env.reset(seed=0)
        game = env.unwrapped.game
        assert (game.get_screen_width(), game.get_screen_height()) == render
        assert obs.shape == env.observation_space.shape == shape and obs.dtype == np.uint8
        # the observation is the engine's screen, resized by area averaging (float64 reference of a 2x2 box
        # filter where the render is exactly twice the observation in each direction)
        screen = game.get_state().screen_buffer  # [H, W, 3] RGB24
        if render == (2 * shape[1], 2 * shape[0]):
            ref = screen.astype(np.float64).reshape(shape[0], 2, shape[1], 2, 3).mean(axis=(1, 3))
            assert np.abs(obs - ref).max() <= 1.0
        elif render == shape[1::-1]:
            np.testing.assert_array_equal(obs, screen)
    finally:
        env.close()
    assert env_spaces("doom_basic", env_config_of(cfg)).obs_shape == shape


def _threads_run(train_dir, extra: list[str]) -> str:
    """A 45-s atari_pong run with --learner_threads=0 (past the 30-s retune); its log."""
    r = run_msf(
        [
            "--env=atari_pong",
            "--experiment=thr",
            f"--train_dir={train_dir}",
            "--num_workers=2",
            "--num_envs_per_worker=2",
            "--batch_size=128",
            "--rollout=32",
            "--num_epochs=2",
            "--experiment_summaries_interval=5",
            "--train_for_seconds=45",
            *extra,
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return (train_dir / "thr" / "log.txt").read_text()


@pytest.mark.slow
def test_a_synchronous_learner_takes_the_cores_the_waiting_workers_leave(train_dir):
    """--learner_threads=0 with --async_rl=False (the Atari family's default, as in Sample Factory): the workers
    wait while the learner trains, so it has all the cores from the start and keeps them (no retune at 30 s)."""
    import re

    _skip_without_extra("atari_pong")
    log = _threads_run(train_dir, [])
    cores = len(os.sched_getaffinity(0))
    assert re.findall(r"learner: (\d+) torch thread\(s\) \(--learner_threads=0 with --async_rl=False", log) == [
        str(cores)
    ], log[-3000:]
    assert "torch thread(s) from now on" not in log
    assert read_summary(train_dir, "thr")["async_rl"] is False


@pytest.mark.slow
def test_learner_threads_are_chosen_once_from_the_measured_load(train_dir):
    """--learner_threads=0, asynchronous: 30 s in, the learner sets its threads once from its workers' measured
    waiting, by the rule of ``auto_learner_threads`` applied to the figures the log reports."""
    import re

    _skip_without_extra("atari_pong")
    log = _threads_run(train_dir, ["--async_rl=True"])
    cores = len(os.sched_getaffinity(0))
    start = re.findall(r"learner: (\d+) torch thread\(s\) \(--learner_threads=0: chosen again", log)
    assert start == [str(max(1, cores - 3))]  # 2 rollout workers + 1 inference worker hold a core each
    # the note (runtime/affinity.learner_threads_note) has two forms: the workers' busy cores when they fit into
    # the cores, else each kind's busy-or-waiting-for-a-core share (oversubscribed)
    fits = re.findall(
        r"learner: (\d+) torch thread\(s\) from now on, was (\d+) \(the workers kept ([\d.]+) of "
        r"([\d.]+) cores busy; the learner waited (\d+)% ",
        log,
    )
    over = re.findall(
        r"learner: (\d+) torch thread\(s\) from now on, was (\d+) \((\d+) rollout and (\d+) inference worker\(s\) "
        r"on ([\d.]+) cores were busy or waiting for a core (\d+)% and (\d+)% of the time: the cores are "
        r"oversubscribed; the learner waited (\d+)% ",
        log,
    )
    assert len(fits) + len(over) == 1, log[-3000:]  # once, never revised
    if fits:
        after, before, busy, share, waited = int(fits[0][0]), int(fits[0][1]), *map(float, fits[0][2:])
    else:
        after, before, n_r, n_i, share, r_busy, i_busy, waited = (float(x) for x in over[0])
        after, before, busy = int(after), int(before), (n_r * r_busy + n_i * i_busy) / 100
    assert before == int(start[0]) and share == cores
    by_load = max(1, min(int(share), int(share - busy + 0.5)))
    if abs(waited - 10) < 1:  # the log rounds the share: at the 10% threshold either answer is the rule's
        assert after in (before, by_load)
    else:
        assert after == (before if waited > 10 else by_load)
