"""Sample Factory's environment families: ``atari_<game>``, ``doom_<scenario>``, ``mujoco_<name>``,
``MiniGrid-*``. Each needs an optional extra (``pip install 'multi-sample-factory[atari]'``, ...);
without it, the name is refused with the pip command, before anything is spawned.

Every maker takes the ``env_config`` of :func:`msf.envs.registry.make_env`; with
``evaluation=True`` it leaves out the wrappers meant for training only (life loss as episode end,
reward clipping), so that ``msf-enjoy`` reports the game's own returns.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Callable, cast

import gymnasium as gym
import numpy as np

from msf.cfg.validation import ConfigError

MakeFn = Callable[[str, dict], gym.Env]

# Frames per env step of each family (Sample Factory counts frames: env_frames = env_steps x frameskip)
FRAMESKIP = {"atari_": 4, "doom_": 4}

# Frames per second of game time of the families whose steps skip frames: the Atari 2600's 60 Hz, Doom's 35 tics/s.
# A video of one frame per step plays in real time at GAME_FPS / FRAMESKIP (see video_fps).
GAME_FPS = {"atari_": 60, "doom_": 35}

MUJOCO = {
    "hopper": "Hopper-v5",
    "halfcheetah": "HalfCheetah-v5",
    "walker": "Walker2d-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
    "humanoidstandup": "HumanoidStandup-v5",
    "swimmer": "Swimmer-v5",
    "reacher": "Reacher-v5",
    "pusher": "Pusher-v5",
    "inverted_pendulum": "InvertedPendulum-v5",
    "inverted_double_pendulum": "InvertedDoublePendulum-v5",
}

DOOM = {
    "basic": "VizdoomBasic-v1",
    "defend_the_center": "VizdoomDefendCenter-v1",
    "defend_the_line": "VizdoomDefendLine-v1",
    "health_gathering": "VizdoomHealthGathering-v1",
    "health_gathering_supreme": "VizdoomHealthGatheringSupreme-v1",
    "my_way_home": "VizdoomMyWayHome-v1",
    "deadly_corridor": "VizdoomDeadlyCorridor-v1",
    "take_cover": "VizdoomTakeCover-v1",
    "predict_position": "VizdoomPredictPosition-v1",
    "deathmatch": "VizdoomDeathmatch-v1",
}

ATARI_NOOP_MAX = 30
"""Atari: each episode starts with a random count of no-op steps, at most this many, in every backend."""

DOOM_RESOLUTION = (72, 128)  # height, width: Sample Factory's doom observations (--res_h, --res_w)

EXTRAS = {
    "atari_": ("atari", ("ale_py", "cv2")),
    "doom_": ("vizdoom", ("vizdoom", "cv2")),
    "mujoco_": ("mujoco", ("mujoco",)),
    "MiniGrid-": ("minigrid", ("minigrid",)),
    "unity_": ("unity", ("mlagents_envs",)),
}


def family_of(name: str) -> str | None:
    """The family prefix of ``name`` (``"atari_"``, ``"doom_"``, ``"mujoco_"``, ``"MiniGrid-"``, ``"unity_"``),
    or None."""
    return next((p for p in EXTRAS if name.startswith(p)), None)


def require_extra(name: str) -> None:
    """Raises ConfigError naming the pip command when the family of ``name`` lacks its packages."""
    family = family_of(name)
    if family is None:
        return
    extra, modules = EXTRAS[family]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"--env: {name} needs the {extra} extra (missing: {', '.join(missing)}): "
            f"pip install 'multi-sample-factory[{extra}]'"
        )


class EpisodicLife(gym.Wrapper):
    """Atari training: a lost life ends the episode (terminated), but the game goes on: the next
    ``reset`` only takes a no-op step unless the game is really over (Mnih et al. 2015's training
    protocol). Gymnasium's ``AtariPreprocessing(terminal_on_life_loss=True)`` would restart the game.
    A ``reset(seed=...)`` always starts a new game from that seed (gymnasium's meaning of a seed), so that
    ``--deterministic``'s check of the env's seeding (two resets with one seed) sees the same first frame."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def _atari_id(game: str) -> str:
    key = f"ale/{game.replace('_', '')}-v5"
    for env_id in gym.registry:
        if env_id.lower() == key:
            return env_id
    raise ConfigError(
        f"--env: no Atari game {game!r} in ale-py (atari_<game>, e.g. atari_pong, atari_breakout, atari_space_invaders)"
    )


def make_atari(name: str, env_config: dict[str, Any]) -> gym.Env:
    """``atari_<game>``: no-op starts (30), frameskip 4 (``env_config["frameskip"]``) with max-pooling of the last two
    frames, S x S grayscale (S: ``env_config["atari_screen_size"]``, 84), a stack of ``env_framestack`` (4) frames
    ``[env_framestack, S, S]`` uint8; for training also life loss as episode end and rewards clipped to [-1, 1].
    Sticky actions (``repeat_action_probability=0.25``) and the full action set with ``env_config``
    ``atari_sticky_actions`` / ``atari_full_action_space``."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make(
        _atari_id(name[len("atari_") :]),
        frameskip=1,
        render_mode=env_config.get("render_mode"),
        repeat_action_probability=0.25 if env_config.get("atari_sticky_actions") else 0.0,
        full_action_space=bool(env_config.get("atari_full_action_space")),
    )
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=ATARI_NOOP_MAX,
        frame_skip=int(env_config.get("frameskip") or FRAMESKIP["atari_"]),
        screen_size=int(env_config.get("atari_screen_size") or 84),
        grayscale_obs=True,
        terminal_on_life_loss=False,
        scale_obs=False,
    )
    if not env_config.get("evaluation"):
        env = EpisodicLife(env)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))
    stack = int(env_config.get("env_framestack") or 4)
    return gym.wrappers.FrameStackObservation(env, stack) if stack > 1 else _with_channel(env)


def _with_channel(env: gym.Env) -> gym.Env:
    """A grayscale ``[S, S]`` Atari screen as one channel ``[1, S, S]`` (``--env_framestack=1``)."""
    space = cast(gym.spaces.Box, env.observation_space)
    shaped = gym.spaces.Box(0, 255, (1, *space.shape), dtype=space.dtype)
    return gym.wrappers.TransformObservation(env, lambda o: o[None], shaped)


def make_doom(name: str, env_config: dict[str, Any]) -> gym.Env:
    """``doom_<scenario>`` (the scenarios the vizdoom package ships): the screen only, rendered at 160x120
    (``wide_aspect_ratio``: 256x144) as Sample Factory renders it, not at the scenarios' own 320x240 (four times
    the pixels, which the engine pays for at every step), resized to ``res_w`` x ``res_h`` (128x72) RGB
    ``[res_h, res_w, 3]`` uint8; 4 frames per step (the action repeated)."""
    from vizdoom import gymnasium_wrapper  # noqa: F401 - registers the Vizdoom* ids

    scenario = name[len("doom_") :]
    if scenario not in DOOM:
        raise ConfigError(f"--env: unknown doom scenario {scenario!r}; valid: " + ", ".join(f"doom_{k}" for k in DOOM))
    _vizdoom_folder()
    wide = bool(env_config.get("wide_aspect_ratio", False))
    env = gym.make(
        DOOM[scenario],
        frame_skip=int(env_config.get("frameskip") or FRAMESKIP["doom_"]),
        render_mode=env_config.get("render_mode"),
        screen_resolution="RES_256X144" if wide else "RES_160X120",
    )
    screen = cast("dict[str, gym.spaces.Box]", env.observation_space)["screen"]
    env = gym.wrappers.TransformObservation(env, lambda o: o["screen"], screen)
    size = (int(env_config.get("res_h", DOOM_RESOLUTION[0])), int(env_config.get("res_w", DOOM_RESOLUTION[1])))
    return env if size == screen.shape[:2] else gym.wrappers.ResizeObservation(env, size)


def _vizdoom_folder() -> None:
    """Create ``./_vizdoom/`` in the working directory before any ViZDoom engine starts.

    The engine (at its first ``reset``) creates that folder when missing; two engines starting together in a
    fresh directory can both find it missing, and the one whose ``mkdir`` fails crashes. Every env creates the
    folder here first, so no engine ever needs to.

    Raises:
        ConfigError: ``./_vizdoom`` exists and is not a folder (the engine would crash on it).
    """
    try:
        os.makedirs("_vizdoom", exist_ok=True)
    except FileExistsError:
        raise ConfigError(
            f"--env: {os.path.abspath('_vizdoom')!r} is not a folder; ViZDoom keeps its files "
            "in ./_vizdoom/ of the working directory: remove or rename it"
        ) from None
    except OSError:
        pass  # a read-only working directory: the engine reports that itself


# What a ViZDoom game keeps in /dev/shm, each name followed by the game's instance id (the engine's
# ``+viz_instance_id`` argument): its shared memory and the two message queues. The controller (in the rollout
# worker) removes them when it closes the game; a worker killed first leaves them.
VIZDOOM_SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")


def remove_engine_files(command_lines: Any, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove the /dev/shm files of the ViZDoom games whose engines had to be killed (their command lines, as
    :func:`msf.runtime.reaping.stop_children` returns them), once nothing of the run uses them any more.

    Returns:
        the names removed.
    """
    ids = set()
    for args in command_lines:
        args = list(args)
        if "+viz_instance_id" in args[:-1]:
            ids.add(args[args.index("+viz_instance_id") + 1])
    if not ids:
        return []
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    for name in names:
        if any(name == prefix + i for prefix in VIZDOOM_SHM_PREFIXES for i in ids):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def make_mujoco(name: str, env_config: dict[str, Any]) -> gym.Env:
    """``mujoco_<name>``: gymnasium's MuJoCo task (v5), observations as they are."""
    task = name[len("mujoco_") :]
    if task not in MUJOCO:
        raise ConfigError(f"--env: unknown MuJoCo task {task!r}; valid: " + ", ".join(f"mujoco_{k}" for k in MUJOCO))
    return gym.make(MUJOCO[task], render_mode=env_config.get("render_mode"))


def make_minigrid(name: str, env_config: dict[str, Any]) -> gym.Env:
    """``MiniGrid-*``: the agent's partial view ``[7, 7, 3]`` uint8 (object, colour, state per cell)."""
    import minigrid  # noqa: F401 - registers the MiniGrid ids
    from minigrid.wrappers import ImgObsWrapper

    try:
        env = gym.make(name, render_mode=env_config.get("render_mode"))
    except gym.error.Error as e:
        raise ConfigError(f"--env: unknown MiniGrid environment {name!r} ({e})") from None
    return ImgObsWrapper(env)


def make_unity(name: str, env_config: dict[str, Any]) -> gym.Env:
    """``unity_*``: see :func:`msf.envs.unity.make_unity`."""
    from msf.envs.unity import make_unity as make

    path = env_config.get("unity_env_path")
    if path and not os.path.isfile(path):
        raise ConfigError(f"--unity_env_path: no file {path!r} (the executable of a built Unity scene)")
    return make(name, env_config)


MAKERS: dict[str, MakeFn] = {
    "atari_": make_atari,
    "doom_": make_doom,
    "mujoco_": make_mujoco,
    "MiniGrid-": make_minigrid,
    "unity_": make_unity,
}


# Sample Factory 2.1.1's defaults for each family, as its launchers set them (sf_examples: atari_override_defaults,
# doom_override_defaults, mujoco_override_defaults; Doom's GRU is Sample Factory's global use_rnn=True, which msf's
# global default does not share): the same command line trains the same configuration on both. A flag given wins.
# Evaluation-only ones (Doom's fps=35) are msf-enjoy's own: real time there is 35 fps with eval_env_frameskip=1.
SF_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "atari_": dict(
        summaries_use_frameskip=True,
        use_record_episode_statistics=True,
        encoder_conv_architecture="convnet_atari",
        obs_scale=255.0,
        gamma=0.99,
        env_frameskip=4,
        env_framestack=4,
        exploration_loss_coeff=0.01,
        num_workers=8,
        num_envs_per_worker=1,
        worker_num_splits=1,
        train_for_env_steps=10_000_000,
        nonlinearity="relu",
        kl_loss_coeff=0.0,
        use_rnn=False,
        adaptive_stddev=False,
        reward_scale=1.0,
        with_vtrace=False,
        recurrence=1,
        batch_size=256,
        rollout=128,
        max_grad_norm=0.5,
        num_epochs=4,
        num_batches_per_epoch=4,
        ppo_clip_ratio=0.1,
        value_loss_coeff=0.5,
        exploration_loss="entropy",
        learning_rate=0.00025,
        lr_schedule="linear_decay",
        shuffle_minibatches=False,
        gae_lambda=0.95,
        batched_sampling=False,
        normalize_input=True,
        normalize_returns=True,
        serial_mode=False,
        async_rl=False,
        experiment_summaries_interval=3,
        adam_eps=1e-5,
    ),
    "doom_": dict(
        ppo_clip_value=0.2,
        obs_subtract_mean=0.0,
        obs_scale=255.0,
        exploration_loss="symmetric_kl",
        exploration_loss_coeff=0.001,
        normalize_returns=True,
        normalize_input=True,
        env_frameskip=4,
        eval_env_frameskip=1,
        heartbeat_reporting_interval=600,
        use_rnn=True,
    ),
    "mujoco_": dict(
        batched_sampling=False,
        num_workers=8,
        num_envs_per_worker=8,
        worker_num_splits=2,
        train_for_env_steps=10_000_000,
        encoder_mlp_layers=[64, 64],
        env_frameskip=1,
        nonlinearity="tanh",
        batch_size=1024,
        kl_loss_coeff=0.1,
        use_rnn=False,
        adaptive_stddev=False,
        policy_initialization="torch_default",
        reward_scale=1.0,
        rollout=64,
        max_grad_norm=3.5,
        num_epochs=2,
        num_batches_per_epoch=4,
        ppo_clip_ratio=0.2,
        value_loss_coeff=1.3,
        exploration_loss_coeff=0.0,
        learning_rate=0.00295,
        lr_schedule="linear_decay",
        shuffle_minibatches=False,
        gamma=0.99,
        gae_lambda=0.95,
        with_vtrace=False,
        recurrence=1,
        normalize_input=True,
        normalize_returns=True,
        value_bootstrap=True,
        experiment_summaries_interval=3,
        save_every_sec=15,
        serial_mode=False,
        async_rl=False,
    ),
    # not a Sample Factory family: msf's choice for MiniGrid's 7x7 views
    "MiniGrid-": dict(encoder_conv_architecture="resnet_impala"),
}


def family_defaults(name: str) -> dict[str, Any]:
    """The flags that choosing ``--env=name`` sets, where not given (see :data:`SF_FAMILY_DEFAULTS`); {} for an env
    of no family."""
    return dict(SF_FAMILY_DEFAULTS.get(family_of(name) or "", {}))


def apply_family_defaults(cfg, given: set[str]):
    """``cfg`` with its env family's defaults (:data:`SF_FAMILY_DEFAULTS`) for the flags not in ``given``."""
    changes = {k: v for k, v in family_defaults(cfg.env).items() if k not in given}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def eval_frameskip(cfg) -> tuple[int, int]:
    """``(frames per env step, steps per action)`` of the evaluation env: with ``--eval_env_frameskip=e`` for an
    env whose maker skips frames (atari_*, doom_*: 4), the env steps ``e`` frames and each action is repeated
    ``4 / e`` times, so that the policy acts as often as in training and a video shows every frame (Sample
    Factory's evaluation rule); otherwise ``(cfg.env_frameskip, 1)``.

    Raises:
        ConfigError: ``e`` does not divide the training frameskip.
    """
    trained = FRAMESKIP.get(family_of(cfg.env) or "")
    e = cfg.eval_env_frameskip
    if e is not None and e < 1:
        raise ConfigError(f"--eval_env_frameskip: must be a positive integer, got {e}")
    if e is None or trained is None or e == trained:
        return cfg.env_frameskip, 1
    if trained % e:
        raise ConfigError(f"--eval_env_frameskip: must divide the training frameskip {trained} of {cfg.env}, got {e}")
    return e, trained // e


def video_fps(name: str, env: gym.Env, frameskip: int | None = None) -> float:
    """Frames per second that play a video of one frame per env step of ``env`` (made for ``name``) in real time.

    Gymnasium's ``render_fps`` is that rate for most envs (CartPole's 50, MuJoCo's ``1 / dt`` of a step); the
    Atari and Doom envs give their game's rate instead (ALE 30, ViZDoom 35), while a step here is 4 frames: their
    videos would play 2x and 4x too fast at it. For them, :data:`GAME_FPS` over :data:`FRAMESKIP`: 15 and 8.75.
    """
    family = family_of(name)
    if family in GAME_FPS:  # frameskip: the evaluation env's frames per step (--eval_env_frameskip)
        return GAME_FPS[family] / (frameskip or FRAMESKIP[family])
    return float(env.metadata.get("render_fps") or 30)


def family_maker(name: str) -> MakeFn | None:
    """The maker of ``name``'s family, after checking its extra is installed; None for other names."""
    family = family_of(name)
    if family is None:
        return None
    require_extra(name)
    return MAKERS[family]
