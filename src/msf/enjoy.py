"""``msf-enjoy``: evaluate a trained policy, print its returns, optionally record a video.

Usage: ``msf-enjoy --env=ENV --experiment=NAME [--train_dir=DIR] [--max_num_episodes=10]
[--eval_deterministic=True] [--save_video=True --video_frames=N --video_name=NAME] [--no_render=True]``
(also ``python -m msf.enjoy``); what it does, and its exit codes: :data:`DESCRIPTION`.

The env is the training one without the wrappers meant for training only (it gets ``evaluation=True`` in its
``env_config``), one in this process. Video frames (``render_mode="rgb_array"``, no display needed: see
:mod:`msf.envs.offscreen`) go to an mp4 with ffmpeg (the ``imageio-ffmpeg`` wheel ships it), one per env step, at
the rate that plays them in real time (:func:`msf.envs.families.video_fps`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import cast

import gymnasium as gym
import numpy as np
import torch

from msf.cfg.arguments import EVALUATION_FLAGS, SCOPE_NOTES, add_flags, build_parser
from msf.cfg.config import FIXED_FLAGS, Config, fixed_for, merge_env_args
from msf.cfg.flags import FIXED, IGNORED
from msf.cfg.flags import EvaluationFlags as EvalArgs
from msf.cfg.validation import ConfigError, Problems
from msf.persistence.checkpoint import CheckpointError, load_into, load_latest_checkpoint
from msf.persistence.sf2_checkpoint import as_msf_checkpoint

DESCRIPTION = """Evaluate the policy of TRAIN_DIR/EXPERIMENT: load its latest (or best) checkpoint and its saved
config (flags given here override it), play --max_num_episodes episodes (or --max_num_frames frames) with the
training environment minus its training-only wrappers, print each episode's return and length and their
means, write them to TRAIN_DIR/EXPERIMENT/eval.json; --save_video writes an mp4 (no display needed).
Exit codes: 0 done, 2 invalid flags, no experiment or no checkpoint."""


def build_enjoy_parser() -> argparse.ArgumentParser:
    """The parser of ``msf-enjoy``: every training flag (given ones override the saved config) and the
    evaluation flags (:class:`msf.cfg.flags.EvaluationFlags`)."""
    # of the scopes, only "fixed" matters here: the others are about launching and resuming training
    parser = build_parser(prog="msf-enjoy", description=DESCRIPTION, scope_notes={FIXED: SCOPE_NOTES[FIXED]})
    add_flags(parser, EvalArgs)
    return parser


def _load_config(cfg: Config, given: set[str]) -> Config:
    """The experiment's saved config with the flags in ``given`` on top.

    Raises:
        ConfigError: no such experiment folder, an unreadable config, or a Sample Factory one msf cannot map.
    """
    from msf.persistence.sf2_checkpoint import Sf2Refused, config_file, msf_config_dict

    exp_dir = os.path.join(cfg.train_dir, cfg.experiment)
    path = config_file(exp_dir)  # config.json, or msf's own beside a Sample Factory one
    if not os.path.isdir(exp_dir):
        raise ConfigError(
            f"--experiment: no experiment {cfg.experiment!r} in --train_dir={cfg.train_dir!r} (no folder {exp_dir})"
        )
    if not os.path.exists(path):
        return cfg
    try:
        with open(path) as f:
            saved = Config.from_dict(msf_config_dict(json.load(f), path, Config, EVALUATION_FLAGS)).to_dict()
    except Sf2Refused as e:  # a Sample Factory config msf cannot map
        raise ConfigError(str(e)) from None
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"--experiment: the saved config {path} is unreadable ({e})") from None
    current = cfg.to_dict()
    for k in sorted(given & FIXED_FLAGS):
        if saved[k] != current[k] and fixed_for(k, str(saved["env"])):
            raise ConfigError(
                f"--{k}: the experiment {cfg.experiment!r} was trained with {saved[k]!r}, not "
                f"{current[k]!r}: its checkpoints fit only that"
            )
    saved.update({k: current[k] for k in given if k in current and k != "env_args"})
    saved["env_args"] = merge_env_args(saved.get("env_args") or {}, current["env_args"], given)[0]
    return Config(**saved)


def _policy_actions(model, obs: np.ndarray, deterministic: bool, bounds, state: torch.Tensor | None):
    """Actions for ``[A, ...]`` observations (one per agent), sampled or the most likely; and the core's
    next states ``[A, rnn_state_size]``."""
    with torch.no_grad():
        params, _, state = model.forward_with_states(torch.as_tensor(np.asarray(obs)), state)
        dist = model.distribution(params)
        a = model.mode(params) if deterministic else dist.sample()
    a = a.numpy()
    if bounds is not None:
        a = np.clip(a, *bounds)
    return a, state


def validate_eval_args(ev: EvalArgs) -> None:
    """Raises:
    ConfigError: every count that would play or record nothing, one line each (naming the flag)."""
    p = Problems()
    for name in ("max_num_episodes", "max_num_frames"):
        p.check(getattr(ev, name) >= 1, name, f"must be a positive integer, got {getattr(ev, name)}")
    p.check(
        ev.video_frames >= 1 or ev.video_frames == -1,
        "video_frames",
        f"must be a positive integer, or -1 for the first episode, got {ev.video_frames}",
    )
    p.check(ev.fps >= 0, "fps", f"must be >= 0 (0: real time), got {ev.fps}")
    p.raise_if_any([f.name for f in dataclasses.fields(EvalArgs)])


def evaluate(cfg: Config, ev: EvalArgs) -> dict:
    """Play the episodes; return the content of ``eval.json``.

    Raises:
        ConfigError: the policy index is out of range, the experiment has no (readable) checkpoint of the
            kind asked for, it cannot be converted or does not fit the model, or the env cannot render the video
            asked for.
    """
    from msf.envs.families import eval_frameskip, video_fps
    from msf.envs.registry import spaces_of
    from msf.model.actor_critic import ActorCritic

    exp_dir = os.path.join(cfg.train_dir, cfg.experiment)
    skip, repeat = eval_frameskip(cfg)
    state = read_checkpoint(cfg, exp_dir, ev.policy_index, ev.load_checkpoint_kind)
    render = _render_mode(ev, cfg.env)
    seed = cfg.seed if cfg.seed is not None else 0
    env = _make_eval_env(cfg, seed, render, frameskip=skip)
    video = None
    t0 = time.monotonic()
    try:
        model = ActorCritic(cfg, spaces_of(env))
        state = load_model(model, state)
        model.eval()
        fps = ev.fps or video_fps(cfg.env, env, skip)  # one frame per env step, played in real time
        print(
            f"msf-enjoy: {cfg.env} | {state['path']} (env steps {state['env_steps']}, policy version "
            f"{state['policy_version']}) | {'deterministic' if ev.eval_deterministic else 'sampled'} actions"
        )
        if ev.save_video:
            path = ev.video_name or "replay.mp4"
            video = _Video(path if os.path.dirname(path) else os.path.join(exp_dir, path), fps, ev.video_frames)
        episodes, frames = _play(cfg, ev, env, model, seed, render, video, skip, repeat)
    finally:
        if video is not None:
            video.close()
        env.close()
    returns = [e["return"] for e in episodes]
    lengths = [e["length"] for e in episodes]
    return {
        "env": cfg.env,
        "experiment": cfg.experiment,
        "checkpoint": state["path"],
        "env_steps": state["env_steps"],
        "policy_index": ev.policy_index,
        "policy_version": state["policy_version"],
        "deterministic": ev.eval_deterministic,
        "episodes": episodes,
        "num_episodes": len(episodes),
        "return_mean": float(np.mean(returns)) if returns else None,
        "return_std": float(np.std(returns)) if returns else None,
        "length_mean": float(np.mean(lengths)) if lengths else None,
        "env_frames": frames,
        "wall_seconds": time.monotonic() - t0,
        "video": video.path if video else None,
        "video_frames": video.frames if video else 0,
        "video_fps": fps if video else None,
    }


def read_checkpoint(
    cfg: Config,
    exp_dir: str,
    policy_index: int = 0,
    kind: str = "latest",
    prog: str = "msf-enjoy",
    flag: str = "load_checkpoint_kind",
) -> dict:
    """The newest readable checkpoint of ``kind`` of policy ``policy_index`` (a broken newer file is named in a
    warning and left where it is: only msf-train sets one aside, when it resumes). ``prog`` and ``flag``: the
    command (in the warnings) and the flag (in the error) to name; for the commands that reuse this
    (``msf-export``).

    Raises:
        ConfigError: the index is out of range, or there is no readable checkpoint of that kind.
    """
    if not 0 <= policy_index < cfg.num_policies:
        raise ConfigError(
            f"--policy_index: must be in [0, {cfg.num_policies}) for {cfg.experiment!r} "
            f"(trained with --num_policies={cfg.num_policies}), got {policy_index}"
        )

    def warn(path: str, reason: str, used: str) -> None:
        print(
            f"{prog}: warning: checkpoint {path} is unreadable ({reason}); using the previous one, {used} (the file is "
            "left as it is)",
            file=sys.stderr,
        )

    with _refusals(flag):
        return cast(dict, load_latest_checkpoint(exp_dir, policy_index, kind=kind, required=True, on_unreadable=warn))


def load_model(model: torch.nn.Module, state: dict, flag: str = "experiment") -> dict:
    """Load the checkpoint ``state`` into ``model`` (a Sample Factory 2.1.1 one converted first); return msf's.

    Raises:
        ConfigError: it cannot be converted, or does not fit the model.
    """
    with _refusals(flag):
        state = cast(dict, as_msf_checkpoint(state, model))  # a dict gives a dict
        load_into(state, lambda s: model.load_state_dict(s["model"]))
    return state


@contextlib.contextmanager
def _refusals(flag: str):
    """A :class:`CheckpointError` as a ``ConfigError`` naming ``--flag`` (unless it names a flag itself)."""
    try:
        yield
    except CheckpointError as e:
        raise ConfigError(str(e) if str(e).startswith("--") else f"--{flag}: {e}") from None


def _render_mode(ev: EvalArgs, env_name: str) -> str | None:
    """``rgb_array`` for a video (made ready to render off-screen), ``human`` when a display is there and
    wanted, else None.

    Raises:
        ConfigError: a MuJoCo env, no display, and no off-screen OpenGL backend works here.
    """
    if ev.save_video:
        from msf.envs.offscreen import prepare_offscreen

        prepare_offscreen(env_name)
        return "rgb_array"
    if not ev.no_render and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "human"
    return None


def _make_eval_env(cfg: Config, seed: int, render: str | None, frameskip: int | None = None):
    """The training env without its training-only wrappers (``frameskip`` frames per step, see
    :func:`eval_frameskip`); with ``render``, rendered once to check it can.

    Raises:
        ConfigError: the env cannot render here.
    """
    from msf.envs.device_env import device_env_entry, make_device_env
    from msf.envs.offscreen import is_gl_failure
    from msf.envs.registry import env_config_of, make_env, one_vector_env, vector_only

    extra = {"frameskip": frameskip} if frameskip is not None and frameskip != cfg.env_frameskip else {}
    entry, config = device_env_entry(cfg.env), env_config_of(cfg, seed=seed, evaluation=True, **extra)
    if entry is not None or vector_only(cfg.env):  # played as a batch of one env
        if render == "rgb_array":
            kind = "a device-side env" if entry else "registered only as a vector env"
            raise ConfigError(f"--save_video: {cfg.env} is {kind}, which msf-enjoy does not render; leave it out")
        if entry is not None:
            one = make_device_env(cfg, 1, torch.device("cpu"), seed, config)
            return _OneOfBatch(one, entry.observation_space, entry.action_space, on_device=True)
        venv = one_vector_env(cfg.env, config)
        return _OneOfBatch(venv, venv.single_observation_space, venv.single_action_space, on_device=False)
    env = make_env(cfg.env, config, render_mode=render)
    if render is not None:
        try:
            env.reset(seed=seed)
            env.render()
        except Exception as e:
            env.close()
            if isinstance(e, gym.error.DependencyNotInstalled):
                raise ConfigError(f"--save_video: {cfg.env} cannot render here ({e}); or use --no_render") from None
            if is_gl_failure(e):  # an OpenGL backend chosen by the user (MUJOCO_GL), or by an env of its own
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(
                    f"--save_video: {cfg.env} cannot make an OpenGL context here ({first}); without a display, "
                    "MuJoCo renders with MUJOCO_GL=egl (apt-get install libegl1) or MUJOCO_GL=osmesa (libosmesa6)"
                ) from None
            raise
    return env


class _OneOfBatch(gym.Env):
    """The only env of a batch env of one, as the gymnasium env that :func:`_play` steps: a vector env registered
    with :func:`msf.envs.register_vector_env` (NumPy in and out) or a device env registered with
    :func:`msf.envs.register_device_env` (``on_device``: torch tensors; made on the CPU). Observations
    ``[*obs_shape]`` and rewards as NumPy; ``step`` takes the one env's action.

    Either resets an ended env in its own way (same-step, next-step or not at all): :func:`_play` resets after every
    end, so none of them shows. A device env is seeded once, by its factory's ``seed``: ``reset``'s is not passed on.
    """

    def __init__(self, env, observation_space: gym.Space, action_space: gym.Space, on_device: bool):
        self.env, self.on_device = env, on_device
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        obs = self.env.reset() if self.on_device else self.env.reset(seed=seed)[0]
        return np.asarray(obs[0]), {}

    def step(self, action):
        a = np.asarray(action)[None]
        if self.on_device:
            a = torch.as_tensor(a, dtype=torch.int64 if a.dtype.kind in "iu" else torch.float32)
        obs, reward, terminated, truncated = self.env.step(a)[:4]
        return np.asarray(obs[0]), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}

    def close(self):
        self.env.close()


class _Video:
    """An mp4 of rendered frames (``env.render()`` in ``rgb_array`` mode), at most ``max_frames`` of them; -1: the
    first episode's (Sample Factory's meaning of ``--video_frames=-1``)."""

    def __init__(self, path: str, fps: float, max_frames: int):
        import imageio.v2 as imageio

        self.path, self.max_frames, self.frames = path, max_frames, 0
        self.full = False  # with -1: the first episode has ended
        self.writer = imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=2, ffmpeg_log_level="error")

    def record(self, env) -> None:
        if not self.full and (self.max_frames == -1 or self.frames < self.max_frames):
            self.writer.append_data(np.asarray(env.render(), dtype=np.uint8))
            self.frames += 1

    def episode_ended(self) -> None:
        self.full = self.full or self.max_frames == -1

    def close(self) -> None:
        self.writer.close()


def _env_action(env, model):
    """A function from the policy's action array of one agent to what ``env.step`` takes for it."""
    tuple_actions = isinstance(env.action_space, gym.spaces.Tuple)
    scalar_actions = not model.continuous and model.nvec is None

    def env_action(a: np.ndarray):
        if tuple_actions:
            return tuple(int(x) for x in a)
        return int(a) if scalar_actions else a

    return env_action


def _play(
    cfg: Config,
    ev: EvalArgs,
    env,
    model,
    seed: int,
    render: str | None,
    video: _Video | None,
    frameskip: int | None = None,
    repeat: int = 1,
):
    """Play until ``--max_num_episodes`` episodes ended or ``--max_num_frames`` frames passed; each action is
    taken ``repeat`` times, of ``frameskip`` frames each (:func:`eval_frameskip`).

    Returns:
        ``(episodes, frames)``: per finished episode ``{"return", "length"}`` (and ``"agent_returns"`` with
        several agents, whose mean is the return), and the env frames played.
    """
    from msf.envs.registry import num_agents_of

    space = env.action_space
    bounds = (space.low, space.high) if hasattr(space, "low") else None
    env_action = _env_action(env, model)
    A = num_agents_of(env)
    episodes: list[dict] = []
    frames = 0
    obs, _ = env.reset(seed=seed)
    if video is not None:
        video.record(env)
    ret, length = np.zeros(A), 0
    core_state = None  # the recurrent core's state (zeros at each episode start)
    while len(episodes) < ev.max_num_episodes and frames < ev.max_num_frames:
        # a multi-agent env: the policy plays every agent (self-play)
        batch = np.asarray(obs)[None] if A == 1 else np.stack(obs)
        actions, core_state = _policy_actions(model, batch, ev.eval_deterministic, bounds, core_state)
        for k in range(repeat):
            obs, r, term, trunc, _ = env.step(env_action(actions[0]) if A == 1 else [env_action(a) for a in actions])
            ret += np.asarray(r, dtype=np.float64).reshape(A)
            frames += frameskip or cfg.env_frameskip
            if render == "human" and ev.fps:
                time.sleep(1.0 / ev.fps)
            ended = np.all(np.asarray(term) | np.asarray(trunc))
            if ended or k == repeat - 1:
                break
            if video is not None:  # the frames between two actions (--eval_env_frameskip)
                video.record(env)
        length += 1
        if ended:
            episode = {"return": float(ret.mean()), "length": length}
            if A > 1:
                episode["agent_returns"] = ret.tolist()  # "return" is their mean
            episodes.append(episode)
            if video is not None:
                video.episode_ended()
            print(f"episode {len(episodes)}: return {episode['return']:.2f}, length {length}")
            ret, length, core_state = np.zeros(A), 0, None
            if len(episodes) < ev.max_num_episodes:
                obs, _ = env.reset()
        if len(episodes) < ev.max_num_episodes and video is not None:
            video.record(env)
    return episodes, frames


def main(argv: list[str] | None = None, parsed: tuple[dict, set[str]] | None = None) -> int:
    """Parse, load, play, report; return the exit code. ``parsed``: the values of every flag of
    :func:`build_enjoy_parser` (and ``env_args``) and the names of those given explicitly, instead of ``argv``
    (:func:`msf.sf2.enjoy`)."""
    from msf.cfg.arguments import given_flags
    from msf.persistence.summaries import write_json_atomic

    if parsed is None:
        argv = sys.argv[1:] if argv is None else argv
        ns = vars(build_enjoy_parser().parse_args(argv))
        given = given_flags(argv, ns)
    else:
        ns, given = dict(parsed[0]), set(parsed[1])
    ev = EvalArgs(**{f.name: ns.pop(f.name) for f in dataclasses.fields(EvalArgs)})
    if ev.push_to_hub:
        print(
            "msf-enjoy: error: --push_to_hub: msf does not upload to the Hugging Face hub (these machines cannot reach "
            "it, and no upload is tested); copy the experiment folder and use huggingface-cli upload",
            file=sys.stderr,
        )
        return 2
    for name in ("hf_repository", "train_script", "enjoy_script"):
        if getattr(ev, name) is not None:
            print(f"msf-enjoy: note: --{name} is accepted from Sample Factory and ignored: {IGNORED[name]}")
    cfg = Config(**ns)
    try:
        validate_eval_args(ev)
        cfg = _load_config(cfg, given)
        result = evaluate(cfg, ev)
    except ConfigError as e:
        for line in e.problems:
            print(f"msf-enjoy: error: {line}", file=sys.stderr)
        return 2
    exp_dir = os.path.join(cfg.train_dir, cfg.experiment)
    write_json_atomic(os.path.join(exp_dir, "eval.json"), result)
    if result["return_mean"] is None:
        print(f"no episode ended within --max_num_frames={ev.max_num_frames}")
    else:
        n = result["num_episodes"]
        print(
            f"{n} episode{'' if n == 1 else 's'}: return mean {result['return_mean']:.2f} "
            f"(std {result['return_std']:.2f}), length mean {result['length_mean']:.1f}"
        )
    if result["video"]:
        print(f"video: {result['video']} ({result['video_frames']} frames)")
    print(f"results in {os.path.join(exp_dir, 'eval.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
