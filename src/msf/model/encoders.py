"""Encoders: an MLP for vector observations, convolutional networks for images.

Images arrive as ``[N, *obs_shape]`` uint8 with the channels on the smallest dimension
(``[C, H, W]`` after a frame stack, ``[H, W, C]`` from most renderers); the encoder moves them
first and scales them to ``[0, 1]``.
"""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}


def mlp(in_size: int, layers: list[int], activation: str) -> nn.Sequential:
    """Linear layers of sizes ``layers``, each followed by the activation."""
    mods: list[nn.Module] = []
    for size in layers:
        mods += [nn.Linear(in_size, size), ACTIVATIONS[activation]()]
        in_size = size
    return nn.Sequential(*mods)


def channel_axis(shape: tuple[int, ...]) -> int:
    """The channel axis of a 3-D image shape: the smallest dimension (the first one on a tie)."""
    return min(range(3), key=lambda i: (shape[i], i))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int, activation: str):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.body = nn.Sequential(act(), nn.Conv2d(channels, channels, 3, padding=1),
                                  act(), nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def conv_layers(architecture: str, in_channels: int, activation: str) -> nn.Sequential:
    """The convolutional part of ``architecture``.

    * ``convnet_simple``: 32 8x8 stride 4, 64 4x4 stride 2, 128 3x3 stride 2.
    * ``convnet_atari``: the Nature DQN (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1.
    * ``resnet_impala``: the IMPALA network (Espeholt et al. 2018, fig. 3): for 16, 32, 32 channels a
      3x3 convolution, a 3x3 max-pool of stride 2, two residual blocks.
    """
    act = ACTIVATIONS[activation]
    if architecture in ("convnet_simple", "convnet_atari"):
        last = 128 if architecture == "convnet_simple" else 64
        last_stride = 2 if architecture == "convnet_simple" else 1
        return nn.Sequential(nn.Conv2d(in_channels, 32, 8, stride=4), act(), nn.Conv2d(32, 64, 4, stride=2), act(),
                             nn.Conv2d(64, last, 3, stride=last_stride), act())
    if architecture == "resnet_impala":
        mods: list[nn.Module] = []
        c = in_channels
        for out in (16, 32, 32):
            mods += [nn.Conv2d(c, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                     _ResidualBlock(out, activation), _ResidualBlock(out, activation)]
            c = out
        return nn.Sequential(*mods, act())
    raise ValueError(f"unknown encoder_conv_architecture {architecture!r}")


class ConvEncoder(nn.Module):
    """Image ``[N, *obs_shape]`` (any dtype; uint8 pixel values) to ``[N, out_size]`` features.

    Raises:
        ValueError: the image is too small for the architecture (the message says which fits).
    """

    def __init__(self, obs_shape: tuple[int, ...], architecture: str, mlp_layers: list[int], activation: str):
        super().__init__()
        self.axis = channel_axis(obs_shape)
        chw = (obs_shape[self.axis], *[d for i, d in enumerate(obs_shape) if i != self.axis])
        self.conv = conv_layers(architecture, chw[0], activation)
        try:
            with torch.no_grad():
                n = self.conv(torch.zeros(1, *chw)).flatten(1).shape[1]
        except RuntimeError:
            raise ValueError(f"images of shape {tuple(obs_shape)} are too small for --encoder_conv_architecture="
                             f"{architecture}; use resnet_impala, which pools with padding") from None
        self.mlp = mlp(n, mlp_layers, activation)
        self.out_size = mlp_layers[-1] if mlp_layers else n

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() * (1.0 / 255.0)
        if self.axis != 0:
            x = x.movedim(self.axis + 1, 1)
        return self.mlp(self.conv(x).flatten(1))


EncoderFactory = "Callable[[Config, tuple[int, ...]], nn.Module]"
_ENCODERS: dict = {}


def register_encoder(name: str, factory) -> None:
    """Register ``factory(cfg, obs_shape) -> nn.Module`` as ``--encoder_custom=name``.

    The module it returns maps ``[N, *obs_shape]`` observations (float32, after the running normaliser
    for vector observations; uint8 images as stored) to ``[N, out_size]`` features, and must have an
    ``out_size`` attribute. Like :func:`msf.envs.register_env`, the registration must happen at import of a
    module that every process imports: pass ``--encoder_custom=module:name``.
    """
    _ENCODERS[name] = factory


def custom_encoder(spec: str):
    """The factory registered as ``spec`` (``name`` or ``module:name``).

    Raises:
        ValueError: no such encoder, or the module cannot be imported.
    """
    import importlib

    module, _, name = spec.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"cannot import module {module!r} named in {spec!r} ({e})") from None
    if name not in _ENCODERS:
        raise ValueError(f"no encoder registered as {name!r} (msf.model.register_encoder; registered: "
                         f"{sorted(_ENCODERS) or 'none'})")
    return _ENCODERS[name]
