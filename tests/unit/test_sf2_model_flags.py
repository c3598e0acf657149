"""Sample Factory 2's model and input flags, each against an independent computation: --obs_scale and
--obs_subtract_mean, --normalize_input_keys, --adaptive_stddev, --continuous_tanh_scale, --decoder_mlp_layers,
--env_framestack, --eval_env_frameskip, and the older configs that predate them."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError, resolve_sample_factory_flags
from msf.envs.registry import EnvSpaces
from msf.model.actor_critic import ActorCritic
from msf.model.encoders import ConvEncoder


def _sf_normalised(x: torch.Tensor, m: float, s: float, batch: torch.Tensor) -> torch.Tensor:
    """Sample Factory's preprocessing in float64: scale, then a running mean/std (here: of one batch, the first
    update replaces the initial statistics), epsilon 1e-5, clipped to [-5, 5]."""
    xs, bs = (x.double() - m) / s, (batch.double() - m) / s
    mean, var = bs.mean(0), bs.var(0, unbiased=False)
    return ((xs - mean) / torch.sqrt(var + 1e-5)).clamp(-5, 5)


@pytest.mark.parametrize("m, s", [(0.0, 1.0), (3.0, 10.0), (128.0, 128.0)])
def test_vector_observations_are_scaled_then_normalised_as_in_sample_factory(m, s):
    torch.manual_seed(0)
    spaces = EnvSpaces((5,), np.float32, True, 2)
    cfg = Config(encoder_mlp_layers=[8], obs_subtract_mean=m, obs_scale=s)
    model = ActorCritic(cfg, spaces)
    batch = torch.randn(400, 5) * 20 + 7
    model.update_obs_statistics(batch)
    x = torch.randn(30, 5) * 20 + 7
    torch.testing.assert_close(model.normalize_obs(x).double(), _sf_normalised(x, m, s, batch), atol=2e-5, rtol=0)
    # without the normaliser: only (x - m) / s
    plain = ActorCritic(Config(encoder_mlp_layers=[8], obs_subtract_mean=m, obs_scale=s, normalize_input=False), spaces)
    torch.testing.assert_close(plain.normalize_obs(x).double(), (x.double() - m) / s, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("m, s", [(0.0, 255.0), (128.0, 128.0), (0.0, 1.0)])
def test_images_are_scaled_then_normalised_as_in_sample_factory(m, s):
    torch.manual_seed(0)
    shape = (2, 12, 12)
    enc = ConvEncoder(shape, "resnet_impala", [16], "elu", normalize=True, scale=s, subtract=m)
    batch = torch.randint(0, 256, (200, *shape), dtype=torch.uint8)
    enc.update_normalizers(batch)
    x = torch.randint(0, 256, (10, *shape), dtype=torch.uint8)
    ref = _sf_normalised(x.flatten(1), m, s, batch.flatten(1).float()).view(10, *shape)
    torch.testing.assert_close(enc.normalizer.normalize(x.float()).double(), ref, atol=1e-4, rtol=0)
    plain = ConvEncoder(shape, "resnet_impala", [16], "elu", normalize=False, scale=s, subtract=m)
    # the unnormalised input of the conv stack: (x - m) / s; checked through a recording first layer
    seen = []
    plain.conv[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    plain(x)
    torch.testing.assert_close(seen[0].double(), (x.double() - m) / s, atol=1e-6, rtol=1e-6)


def test_images_default_to_pixels_in_zero_one_and_vectors_to_one():
    img = ActorCritic(Config(normalize_input=False), EnvSpaces((3, 36, 36), np.uint8, True, 2))
    vec = ActorCritic(Config(normalize_input=False, encoder_mlp_layers=[4]), EnvSpaces((3,), np.float32, True, 2))
    assert (img.obs_scale, vec.obs_scale) == (255.0, 1.0)


def test_normalize_input_keys_limits_the_normalised_keys():
    from msf.model.encoders import DictEncoder

    layout = (("a", (3,), 3), ("b", (2,), 2))
    both = DictEncoder(layout, Config(encoder_mlp_layers=[4]), normalize=True)
    only_a = DictEncoder(layout, Config(encoder_mlp_layers=[4], normalize_input_keys=["a"]), normalize=True)
    assert set(both.normalizers) == {"a", "b"} and set(only_a.normalizers) == {"a"}
    # a plain observation is Sample Factory's key "obs"
    spaces = EnvSpaces((3,), np.float32, True, 2)
    assert ActorCritic(Config(encoder_mlp_layers=[4], normalize_input_keys=["obs"]), spaces).obs_normalizer
    assert ActorCritic(Config(encoder_mlp_layers=[4], normalize_input_keys=["other"]), spaces).obs_normalizer is None


def test_adaptive_stddev_comes_from_the_head_per_state():
    torch.manual_seed(0)
    model = ActorCritic(Config(encoder_mlp_layers=[8], adaptive_stddev=True), EnvSpaces((4,), np.float32, False, 3))
    assert model.log_std is None and model.action_head.out_features == 6
    obs = torch.randn(7, 4)
    params, _ = model(obs)
    h = model.actor_encoder(model.normalize_obs(obs))
    raw = model.action_head(h)
    torch.testing.assert_close(params, raw)
    dist = model.distribution(params)
    torch.testing.assert_close(dist.mean, raw[:, :3])
    torch.testing.assert_close(dist.stddev, raw[:, 3:].exp().clamp(1e-4, 1e4))
    assert not torch.allclose(dist.stddev[0], dist.stddev[1])  # it depends on the state


def test_a_learned_stddev_and_tanh_squashed_means():
    torch.manual_seed(0)
    c = 0.5
    cfg = Config(encoder_mlp_layers=[8], adaptive_stddev=False, continuous_tanh_scale=c, initial_stddev=0.3)
    model = ActorCritic(cfg, EnvSpaces((4,), np.float32, False, 2))
    with torch.no_grad():
        model.action_head.weight.mul_(400.0)  # means far beyond the scale
    obs = torch.randn(50, 4) * 3
    params, _ = model(obs)
    raw = model.action_head(model.actor_encoder(model.normalize_obs(obs)))
    torch.testing.assert_close(params[:, :2], c * torch.tanh(raw / c))
    assert params[:, :2].abs().max() <= c and raw.abs().max() > 2 * c
    torch.testing.assert_close(params[:, 2:], torch.full((50, 2), float(np.log(0.3))))
    actions, log_probs, _, _ = model.act(obs)
    ref = torch.distributions.Normal(params[:, :2].double(), 0.3).log_prob(actions.double()).sum(-1)
    torch.testing.assert_close(log_probs.double(), ref, atol=1e-5, rtol=0)


def test_decoder_layers_sit_between_the_core_and_the_heads():
    torch.manual_seed(0)
    spaces = EnvSpaces((4,), np.float32, True, 3)
    model = ActorCritic(Config(encoder_mlp_layers=[8], decoder_mlp_layers=[16, 5]), spaces)
    assert model.action_head.in_features == 5 and model.value_head.in_features == 5
    obs = torch.randn(6, 4)
    h = model.decoder(model.actor_encoder(model.normalize_obs(obs)))
    logits, values = model(obs)
    torch.testing.assert_close(logits, model.action_head(h))
    torch.testing.assert_close(values, model.value_head(h).squeeze(-1))
    # parameters: encoder 4*8+8, decoder 8*16+16 + 16*5+5, heads 5*3+3 + 5+1 (normaliser buffers are no parameters)
    assert sum(p.numel() for p in model.parameters()) == 40 + 144 + 85 + 18 + 6


def test_an_older_config_keeps_the_model_it_was_trained_with():
    old = {k: v for k, v in Config().to_dict().items() if k not in ("adaptive_stddev", "decoder_mlp_layers")}
    cfg = Config.from_dict(old)
    assert cfg.adaptive_stddev is False and cfg.decoder_mlp_layers == []  # msf's Gaussian head before the flag
    assert Config.from_dict(Config().to_dict()).adaptive_stddev is True  # Sample Factory's default, saved


def test_batched_sampling_is_the_envpool_backend():
    cfg = resolve_sample_factory_flags(Config(env="atari_pong", batched_sampling=True), {"batched_sampling"})
    assert cfg.env_backend == "envpool"
    with pytest.raises(ConfigError, match="^--batched_sampling: .*--env_backend=gymnasium"):
        resolve_sample_factory_flags(
            Config(env="atari_pong", batched_sampling=True, env_backend="gymnasium"),
            {"batched_sampling", "env_backend"},
        )
    with pytest.raises(ConfigError, match="^--batched_sampling: False .* contradicts --env_backend=envpool"):
        resolve_sample_factory_flags(
            Config(env="atari_pong", batched_sampling=False, env_backend="envpool"), {"batched_sampling", "env_backend"}
        )
    kept = Config(env="atari_pong", batched_sampling=False, env_backend="envpool")  # only one of them given
    assert resolve_sample_factory_flags(kept, {"env_backend"}) is kept
    cartpole = resolve_sample_factory_flags(Config(env="CartPole-v1", batched_sampling=True), {"batched_sampling"})
    assert cartpole.env_backend == "envpool"  # EnvPool ports gymnasium's classic control
    with pytest.raises(
        ConfigError,
        match="^--batched_sampling: .*atari_\\* and mujoco_\\* envs and CartPole-v0, .* only, not 'FrozenLake-v1'",
    ):
        resolve_sample_factory_flags(Config(env="FrozenLake-v1", batched_sampling=True), {"batched_sampling"})


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="the atari extra is not installed")
@pytest.mark.parametrize("stack, shape", [(None, (4, 84, 84)), (2, (2, 84, 84)), (1, (1, 84, 84))])
def test_env_framestack_sets_the_atari_stack(stack, shape):
    from msf.envs.registry import env_config_of, make_env

    env = make_env("atari_pong", env_config_of(Config(env="atari_pong", env_framestack=stack)))
    obs, _ = env.reset(seed=0)
    assert obs.shape == shape == env.observation_space.shape
    env.close()


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="the atari extra is not installed")
def test_atari_screen_size_resizes_the_same_screen():
    """--atari_screen_size=64: [4, 64, 64] observations of the same game state as the 84-px env's with the same
    seed (the area resize keeps the mean brightness: within 1 of 255 of the 84-px frame's, frame by frame), and a
    model flag that a resumed run cannot change."""
    from msf.cfg.config import FIXED_FLAGS
    from msf.envs.registry import env_config_of, make_env

    obs = {}
    for size in (84, 64):
        env = make_env("atari_pong", env_config_of(Config(env="atari_pong", atari_screen_size=size)))
        o, _ = env.reset(seed=3)
        for _ in range(40):
            o, *_ = env.step(2)
        assert o.shape == (4, size, size) == env.observation_space.shape and o.dtype == np.uint8
        obs[size] = o.reshape(4, -1).astype(np.float64)
        env.close()
    assert obs[84].std() > 1
    np.testing.assert_allclose(obs[64].mean(axis=1), obs[84].mean(axis=1), atol=1.0)
    assert "atari_screen_size" in FIXED_FLAGS


def test_eval_env_frameskip_repeats_each_action_over_smaller_steps():
    from msf.envs.families import eval_frameskip

    assert eval_frameskip(Config(env="doom_basic", env_frameskip=4, eval_env_frameskip=1)) == (1, 4)
    assert eval_frameskip(Config(env="atari_pong", env_frameskip=4, eval_env_frameskip=2)) == (2, 2)
    assert eval_frameskip(Config(env="atari_pong", env_frameskip=4)) == (4, 1)
    assert eval_frameskip(Config(env="CartPole-v1", eval_env_frameskip=1)) == (1, 1)  # no frames to skip
    with pytest.raises(ConfigError, match="^--eval_env_frameskip: must divide the training frameskip 4"):
        eval_frameskip(Config(env="doom_basic", env_frameskip=4, eval_env_frameskip=3))
    with pytest.raises(ConfigError, match="^--eval_env_frameskip: must be a positive integer, got 0"):
        eval_frameskip(Config(env="atari_pong", eval_env_frameskip=0))


def test_the_envs_of_one_worker_start_at_different_moments():
    """--decorrelate_envs_on_one_worker (Sample Factory's default): env j of a worker takes j x rollout random
    actions after its first reset, drawn from its action space seeded by its seed; recomputed here by hand."""
    import gymnasium as gym

    from msf.envs.vector import GymSplit

    cfg = Config(env="CartPole-v1", rollout=8, num_envs_per_worker=3)
    worker = 1  # its envs are job-wide 3, 4, 5: the 0th, 1st and 2nd of the worker
    first = GymSplit(cfg, worker, [3, 4, 5], seed=100).reset()
    for j, index in enumerate([3, 4, 5]):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=100 + index)
        env.action_space.seed(100 + index)
        for _ in range(j * 8):
            obs, _, te, tr, _ = env.step(env.action_space.sample())
            if te or tr:
                obs, _ = env.reset()
        np.testing.assert_array_equal(first[j], obs)
    plain = GymSplit(Config(env="CartPole-v1", decorrelate_envs_on_one_worker=False), worker, [3, 4, 5], seed=100)
    np.testing.assert_array_equal(plain.reset()[2], gym.make("CartPole-v1").reset(seed=105)[0])


def test_the_decorrelation_of_a_worker_costs_steps_linear_in_its_envs():
    """256 envs of rollout 32 on one worker take 65,280 random steps in all, none 16 rollouts (512) or more: at most
    256 x 512, where Sample Factory's j x rollout made 256 x 255 / 2 x 32 = 1,044,480 (148 s of start-up); a worker
    of 16 envs or fewer keeps j x rollout."""
    from msf.envs.vector import GymSplit

    cfg = Config(env="CartPole-v1", rollout=32, num_envs_per_worker=256)
    steps = GymSplit(cfg, 1, list(range(256, 512)), seed=0).random_steps  # worker 1: envs 256..511
    assert steps[:5] == [0, 2, 4, 6, 8] and steps[-1] == 510
    assert sum(steps) == 65_280 and max(steps) < 512
    assert GymSplit(Config(env="CartPole-v1", rollout=32, num_envs_per_worker=16), 0, [0, 15], 0).random_steps == [
        0,
        15 * 32,
    ]


def test_worker_i_of_n_waits_i_over_n_of_the_decorrelation_time():
    from msf.sampling.rollout_worker import decorrelation_delay

    cfg = Config(num_workers=4, decorrelate_experience_max_seconds=8)
    assert [decorrelation_delay(cfg, i) for i in range(4)] == [0.0, 2.0, 4.0, 6.0]
    assert decorrelation_delay(Config(num_workers=4, decorrelate_experience_max_seconds=8, benchmark=True), 3) == 0
    with pytest.raises(ConfigError, match="^--decorrelate_experience_max_seconds: must be 0 with --deterministic"):
        from msf.cfg.validation import validate

        validate(Config(deterministic=True, decorrelate_experience_max_seconds=5, device="cpu"))


def test_the_stall_watch_names_the_workers_that_stepped_nothing_while_the_learner_waited():
    from msf.runner.reporter import StallWatch

    w = StallWatch(interval=20, reporting_interval=60)
    assert w.check(0.0, [5, 5], learner_waiting=True, started=True) is None  # the wait begins
    assert w.check(10.0, [9, 5], learner_waiting=True, started=True) is None  # not yet 20 s
    assert w.check(25.0, [12, 5], learner_waiting=True, started=True) == ([1], 25.0)  # worker 1 never moved
    assert w.check(40.0, [13, 5], learner_waiting=True, started=True) is None  # reported 15 s ago
    assert w.check(41.0, [13, 5], learner_waiting=False, started=True) is None  # the learner trains: a new wait
    assert w.check(70.0, [13, 5], learner_waiting=True, started=True) is None
    assert w.check(95.0, [14, 6], learner_waiting=True, started=True) is None  # both stepped during this wait
    assert StallWatch(20, 60).check(100.0, [0], learner_waiting=True, started=False) is None  # still starting


def test_env_info_cache_round_trip(tmp_path):
    from msf.envs.registry import env_spaces, load_env_info, save_env_info

    for name in ("CartPole-v1", "Pendulum-v1"):
        spaces = env_spaces(name)
        save_env_info(str(tmp_path), name, spaces)
        assert load_env_info(str(tmp_path), name) == spaces
    assert load_env_info(str(tmp_path), "CartPole-v1") is None  # the file holds Pendulum's
    assert load_env_info(str(tmp_path / "nowhere"), "CartPole-v1") is None
    # read under a key (the env flags and a script's own): another key makes the env again
    from msf.envs.registry import env_info_key

    key = env_info_key(Config(env="Pendulum-v1", env_args={"corridor_len": 5}))
    assert key["env_args"] == {"corridor_len": 5} and "res_w" in key and "seed" not in key
    save_env_info(str(tmp_path), "Pendulum-v1", env_spaces("Pendulum-v1"), key)
    assert load_env_info(str(tmp_path), "Pendulum-v1", key) == env_spaces("Pendulum-v1")
    other = env_info_key(Config(env="Pendulum-v1", env_args={"corridor_len": 7}))
    assert load_env_info(str(tmp_path), "Pendulum-v1", other) is None
