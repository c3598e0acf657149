"""The recurrent core over sequences with episode resets, against a step-by-step reference; the conv encoders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from msf.cfg.config import Config
from msf.envs.registry import EnvSpaces
from msf.model.actor_critic import ActorCritic
from msf.model.encoders import ConvEncoder, channel_axis


@pytest.mark.parametrize(
    "rnn_type, layers, share", [("gru", 1, True), ("lstm", 2, True), ("gru", 1, False), ("lstm", 2, False)]
)
def test_sequences_with_resets_equal_the_step_by_step_run(rnn_type, layers, share):
    torch.manual_seed(0)
    spaces = EnvSpaces((5,), np.float32, True, 3)
    cfg = Config(
        encoder_mlp_layers=[16],
        use_rnn=True,
        rnn_type=rnn_type,
        rnn_size=8,
        rnn_num_layers=layers,
        actor_critic_share_weights=share,
        decoder_mlp_layers=[] if share else [6],
    )
    model = ActorCritic(cfg, spaces)
    B, R = 4, 6
    obs = torch.randn(B, R, 5)
    dones = (torch.rand(B, R) < 0.3).float()
    h0 = torch.randn(B, model.rnn_state_size)
    # separate weights: the actor's core's state, then the critic's
    assert model.rnn_state_size == layers * 8 * (2 if rnn_type == "lstm" else 1) * (1 if share else 2)
    params, values = model(obs.reshape(B * R, 5), h0, dones)
    # reference: one step at a time, zeroing the state after an episode end
    h = h0.clone()
    ref_p, ref_v = [], []
    for t in range(R):
        p, v, h = model.forward_with_states(obs[:, t], h)
        ref_p.append(p)
        ref_v.append(v)
        h = h * (1 - dones[:, t : t + 1])
    ref_p = torch.stack(ref_p, 1).reshape(B * R, -1)
    ref_v = torch.stack(ref_v, 1).reshape(B * R)
    torch.testing.assert_close(params, ref_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(values, ref_v, rtol=1e-5, atol=1e-6)
    # the state really carries information: another initial state changes the outputs before any reset
    params2, _ = model(obs.reshape(B * R, 5), torch.zeros_like(h0), dones)
    assert not torch.allclose(params.view(B, R, -1)[:, 0], params2.view(B, R, -1)[:, 0])


def test_act_returns_the_next_state():
    torch.manual_seed(0)
    model = ActorCritic(Config(encoder_mlp_layers=[8], use_rnn=True, rnn_size=4), EnvSpaces((3,), np.float32, True, 2))
    obs, h = torch.randn(5, 3), torch.randn(5, model.rnn_state_size)
    _, _, values, h1 = model.act(obs, h)
    _, v_ref, h_ref = model.forward_with_states(obs, h)
    torch.testing.assert_close(h1, h_ref)
    torch.testing.assert_close(values, v_ref)


@pytest.mark.parametrize("shape, axis", [((4, 84, 84), 0), ((84, 84, 4), 2), ((7, 7, 3), 2), ((3, 72, 128), 0)])
def test_channel_axis_is_the_smallest_dimension(shape, axis):
    assert channel_axis(shape) == axis


@pytest.mark.parametrize(
    "arch, n_conv_out",
    [("convnet_atari", 64 * 7 * 7), ("convnet_simple", 128 * 4 * 4), ("resnet_impala", 32 * 11 * 11)],
)
def test_conv_encoders_on_atari_frames(arch, n_conv_out):
    enc = ConvEncoder((4, 84, 84), arch, [512], "relu")
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert enc.conv(x.float()).flatten(1).shape[1] == n_conv_out  # the layer arithmetic, by hand
    assert enc(x).shape == (2, 512)
    # channels-last frames give the same features as the same frames channels-first
    enc_hwc = ConvEncoder((84, 84, 4), arch, [512], "relu")
    enc_hwc.load_state_dict(enc.state_dict())
    torch.testing.assert_close(enc_hwc(x.permute(0, 2, 3, 1)), enc(x))


def test_small_images_need_resnet_impala():
    with pytest.raises(ValueError, match="too small for --encoder_conv_architecture=convnet_simple; use resnet_impala"):
        ConvEncoder((7, 7, 3), "convnet_simple", [64], "elu")
    assert ConvEncoder((7, 7, 3), "resnet_impala", [64], "elu")(torch.zeros(1, 7, 7, 3, dtype=torch.uint8)).shape == (
        1,
        64,
    )


def test_image_model_without_normalize_input_only_scales_pixels():
    model = ActorCritic(
        Config(encoder_conv_mlp_layers=[32], normalize_input=False), EnvSpaces((4, 84, 84), np.uint8, True, 6)
    )
    assert model.obs_normalizer is None and model.image and model.actor_encoder.normalizer is None
    x = torch.full((1, 4, 84, 84), 255, dtype=torch.uint8)
    torch.testing.assert_close(model(x)[0], model(torch.ones(1, 4, 84, 84) * 255.0)[0])
    model.update_obs_statistics(x)  # nothing to update
    assert "actor_encoder.normalizer.mean" not in model.state_dict()


def test_image_normalisation_is_sample_factorys_per_pixel_formula():
    """With normalize_input, each pixel of each stacked frame is normalised by its own statistics after scaling
    to [0, 1]: ((x / 255 - mean) / sqrt(var + 1e-5)).clamp(-5, 5), mean and variance over the samples seen
    (Sample Factory's RunningMeanStdInPlace, per element). The reference is computed here in float64."""
    torch.manual_seed(0)
    spaces = EnvSpaces((4, 84, 84), np.uint8, True, 6)
    model = ActorCritic(Config(encoder_conv_mlp_layers=[32]), spaces)
    plain = ActorCritic(Config(encoder_conv_mlp_layers=[32], normalize_input=False), spaces)
    plain.load_state_dict(model.state_dict(), strict=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8, generator=g)
    x[:, :, :40] = 87  # a constant background
    x[:1, :, 50:52, 50:52] = 236  # a ball seen once in 64: sqrt(63) standard deviations away
    x[1:, :, 50:52, 50:52] = 87
    # before any statistics the model sees pixels scaled to [0, 1], as without normalisation
    torch.testing.assert_close(model(x[:4])[0], plain(x[:4])[0])
    model.update_obs_statistics(x[:40])
    model.update_obs_statistics(x[40:])  # merged batch by batch: the same as all at once
    xs = x.double() / 255.0
    ref = ((xs - xs.mean(0)) / torch.sqrt(xs.var(0, unbiased=False) + 1e-5)).clamp(-5.0, 5.0)
    got = model.actor_encoder.normalizer.normalize(x.float())
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)
    assert got[:, :, :40].abs().max() < 1e-5  # the background is gone (to float32 rounding)
    assert got[0, 0, 50, 50] == 5.0 and float(got[1, 0, 50, 50]) == pytest.approx(-1 / 63**0.5, rel=1e-3)
    # the normalised images are what the conv layers see, and the statistics travel with the weights
    feats = model.actor_encoder.mlp(model.actor_encoder.conv(got).flatten(1))
    torch.testing.assert_close(model.actor_encoder(x), feats)
    assert {"actor_encoder.normalizer.mean_f32", "actor_encoder.normalizer.std_f32"} <= model.state_dict().keys()


def test_policy_initialization_covers_the_convolutions():
    """Orthogonal init of a conv layer: its weight as ``[out, in x k x k]`` has orthonormal rows scaled by the gain
    (Sample Factory initialises Conv2d and Linear alike); biases start at zero; torch's default does neither."""
    spaces = EnvSpaces((4, 84, 84), np.uint8, True, 6)
    torch.manual_seed(0)
    model = ActorCritic(Config(encoder_conv_architecture="convnet_atari", policy_init_gain=1.5), spaces)
    convs = [m for m in model.actor_encoder.conv if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 3
    for conv in convs:
        w = conv.weight.detach().reshape(conv.out_channels, -1).double()
        torch.testing.assert_close(
            w @ w.T, 1.5**2 * torch.eye(conv.out_channels, dtype=torch.float64), atol=1e-5, rtol=0
        )
        assert conv.bias.abs().max() == 0.0
    default = ActorCritic(
        Config(encoder_conv_architecture="convnet_atari", policy_initialization="torch_default"), spaces
    )
    w = default.actor_encoder.conv[0].weight.detach().reshape(32, -1).double()
    assert not torch.allclose(w @ w.T, torch.eye(32, dtype=torch.float64), atol=1e-2)


@pytest.mark.parametrize("head_gain, want", [(None, 1.5), (0.01, 0.01)])
def test_the_action_head_starts_at_its_own_gain_or_sample_factorys(head_gain, want):
    """The action head's weight ``[A, H]`` has orthogonal rows of norm ``--action_head_init_gain`` (default: the
    ``--policy_init_gain`` of every other layer, as Sample Factory initialises them all); the value head and the
    encoder keep ``--policy_init_gain``."""
    spaces = EnvSpaces((4, 84, 84), np.uint8, True, 6)
    torch.manual_seed(0)
    cfg = Config(encoder_conv_architecture="convnet_atari", policy_init_gain=1.5, action_head_init_gain=head_gain)
    model = ActorCritic(cfg, spaces)
    w = model.action_head.weight.detach().double()
    assert w.shape == (6, 512)
    torch.testing.assert_close(w @ w.T, want**2 * torch.eye(6, dtype=torch.float64), atol=1e-6, rtol=1e-5)
    v = model.value_head.weight.detach().double()
    torch.testing.assert_close(v @ v.T, torch.tensor([[1.5**2]], dtype=torch.float64), atol=1e-6, rtol=1e-5)
    assert model.action_head.bias.abs().max() == 0.0


@pytest.mark.parametrize(
    "arch, obs_shape",
    [("convnet_atari", (4, 84, 84)), ("convnet_simple", (72, 128, 3)), ("resnet_impala", (3, 64, 64))],
)
def test_learner_passes_in_channels_last_equal_a_float64_nchw_reference(arch, obs_shape):
    """With autograd on (the learner) the encoder runs its convolutions in channels_last; the features and the
    weights' gradients must be those of the plain NCHW computation, checked against a float64 copy."""
    torch.manual_seed(0)
    enc = ConvEncoder(obs_shape, arch, [64], "elu", normalize=True)
    obs = torch.randint(0, 256, (6, *obs_shape), dtype=torch.uint8)
    enc.update_normalizers(obs)
    ref = ConvEncoder(obs_shape, arch, [64], "elu", normalize=True).double()
    ref.load_state_dict(enc.state_dict())
    ref.double()
    first = next(m for m in enc.conv.modules() if isinstance(m, torch.nn.Conv2d))
    seen: list[bool] = []
    first.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    out = enc(obs)
    out.square().sum().backward()
    with torch.no_grad():  # the inference path, no autograd: the layout the channel move gives
        inference = enc(obs)
    assert seen == [True, obs_shape[-1] == 3], seen

    x = ref.normalizer.normalize(obs.double())
    if ref.axis != 0:
        x = x.movedim(ref.axis + 1, 1)
    x = x.contiguous()  # NCHW, float64
    want = ref.mlp(ref.conv(x).flatten(1))
    want.square().sum().backward()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(inference, out.detach(), rtol=1e-4, atol=1e-5)
    first_ref = next(m for m in ref.conv.modules() if isinstance(m, torch.nn.Conv2d))
    torch.testing.assert_close(first.weight.grad.double(), first_ref.weight.grad, rtol=1e-3, atol=1e-4)
    assert first.weight.is_contiguous()  # the parameters keep their layout (checkpoints, DDP buckets)


@pytest.mark.parametrize("activation", ["elu", "relu", "tanh"])
@pytest.mark.parametrize("architecture", ["convnet_simple", "convnet_atari"])
def test_in_place_activations_give_the_out_of_place_values_and_gradients(architecture, activation):
    """The conv stacks apply ELU/ReLU in place (a convolution's backward needs its input, not its output):
    outputs and gradients equal those of fresh out-of-place activations, in float64."""
    from msf.model.encoders import ACTIVATIONS, conv_layers

    torch.manual_seed(0)
    stack = conv_layers(architecture, 3, activation).double()
    assert any(getattr(m, "inplace", False) for m in stack) == (activation != "tanh")
    ref = torch.nn.Sequential(*[m if isinstance(m, torch.nn.Conv2d) else ACTIVATIONS[activation]() for m in stack])
    x = torch.randn(5, 3, 84, 84, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y1, y2 = stack(x1), ref(x2)
    w = torch.randn_like(y1)
    (y1 * w).sum().backward()
    g1 = [p.grad.clone() for p in stack.parameters()]
    stack.zero_grad()
    (y2 * w).sum().backward()
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)
    for a, p in zip(g1, ref.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-12, atol=1e-12)
