"""``msf-enjoy --save_video``: a MuJoCo video without a display, and videos that play in real time."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from msf.cfg.config import Config

from .conftest import msf_env


def _experiment(train_dir, env: str):
    """An experiment folder of ``env`` as a run leaves it (config.json, one checkpoint), made here without
    training: msf-enjoy plays its untrained policy. Returns the folder."""
    from msf.cfg.config import Derived
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.learning.learner import Learner
    from msf.persistence.checkpoint import save_checkpoint
    from msf.persistence.train_state import TrainState

    cfg = apply_family_defaults(Config(env=env, experiment="vid", train_dir=str(train_dir)), set())
    exp = train_dir / "vid"
    exp.mkdir(parents=True)
    (exp / "config.json").write_text(json.dumps(cfg.to_dict()))
    learner = Learner(cfg, Derived.of(cfg), env_spaces(cfg.env, env_config_of(cfg)), "cpu")
    save_checkpoint(TrainState.fresh(1, cfg.stats_avg).capture(0, learner, cfg.to_dict(), 1), str(exp), keep=1)
    return exp


def _enjoy(exp, env: str, frames: int, environ: dict, episodes: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            f"--env={env}",
            f"--experiment={exp.name}",
            f"--train_dir={exp.parent}",
            f"--max_num_episodes={episodes}",
            f"--max_num_frames={8 * frames}",  # an untrained policy's episode of Pong lasts minutes
            "--save_video=True",
            f"--video_frames={frames}",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=environ,
        cwd=exp.parent,  # ViZDoom writes _vizdoom.ini and _vizdoom/ into the working folder
    )


def _headless() -> dict:
    environ = msf_env()
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM"):
        environ.pop(name, None)
    return environ


def test_a_mujoco_video_is_recorded_without_a_display(tmp_path):
    """No display and no MUJOCO_GL: msf-enjoy chooses an off-screen backend itself. Before, gymnasium's renderer
    took GLFW, and the run ended with exit code 1 and a ``mujoco.FatalError`` traceback."""
    import imageio.v2 as imageio

    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("the mujoco extra is not installed here")
    exp = _experiment(tmp_path / "train_dir", "mujoco_hopper")
    r = _enjoy(exp, "mujoco_hopper", 12, _headless(), episodes=10)  # the untrained hopper falls in ~10 steps
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((exp / "eval.json").read_text())
    video = imageio.get_reader(str(exp / "replay.mp4"))
    frames = [video.get_data(i) for i in range(video.count_frames())]
    assert len(frames) == ev["video_frames"] == 12
    assert frames[0].shape == (480, 480, 3)  # gymnasium's MuJoCo render size
    assert frames[0].std() > 10  # the scene, not a blank frame
    assert ev["video_fps"] == video.get_meta_data()["fps"] == 125  # Hopper's 1 / dt: one step is 8 ms


def _skip_without(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"the {extra} extra is not installed here (no {module})")


@pytest.mark.parametrize(
    "env, module, extra, game_fps, skip",
    [
        # 35 tics per second of game time; Sample Factory's Doom evaluation steps 1 tic (--eval_env_frameskip=1),
        # repeating each action 4 times, so the video shows every tic
        ("doom_basic", "vizdoom", "vizdoom", 35, 1),
        ("atari_pong", "ale_py", "atari", 60, 4),  # the Atari 2600's 60 frames per second, 4 per step
    ],
)
def test_a_video_of_a_frameskipping_env_plays_in_real_time(tmp_path, env, module, extra, game_fps, skip):
    """One video frame per env step of ``skip`` game frames: the video's rate is the game's over ``skip``. Before,
    the envs' render_fps (ViZDoom's 35, ALE's 30) played Doom 4x and Atari 2x too fast."""
    import imageio.v2 as imageio
    import imageio_ffmpeg

    _skip_without(module, extra)
    fps = game_fps / skip
    exp = _experiment(tmp_path / "train_dir", env)
    r = _enjoy(exp, env, 20, msf_env())
    assert r.returncode == 0, r.stderr[-3000:]
    path = str(exp / "replay.mp4")
    assert imageio.get_reader(path).get_meta_data()["fps"] == pytest.approx(fps)
    frames, seconds = imageio_ffmpeg.count_frames_and_secs(path)
    ev = json.loads((exp / "eval.json").read_text())
    assert frames == ev["video_frames"] and ev["video_fps"] == pytest.approx(fps)
    # as long as the game time it shows (to the 1/100 s that ffmpeg reports)
    assert seconds == pytest.approx(frames * skip / game_fps, abs=0.02), (frames, seconds)
