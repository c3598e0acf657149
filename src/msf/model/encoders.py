"""Encoders: an MLP for vector observations, convolutional networks for images.

Images arrive as ``[N, *obs_shape]`` uint8 with the channels on the smallest dimension
(``[C, H, W]`` after a frame stack, ``[H, W, C]`` from most renderers); the encoder moves them
first and scales them to ``[0, 1]``.
"""

from __future__ import annotations

import importlib
from typing import cast

import torch
from torch import nn

from msf.model.normalizers import ReduceSum, RunningMeanStd
from msf.runtime.registrations import registry

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


def _in_place(activation: str) -> nn.Module:
    """``activation`` computed in place where torch offers it (ELU, ReLU; not Tanh)."""
    act = ACTIVATIONS[activation]
    return act(inplace=True) if activation in ("elu", "relu") else act()


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int, activation: str):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.body = nn.Sequential(
            act(), nn.Conv2d(channels, channels, 3, padding=1), act(), nn.Conv2d(channels, channels, 3, padding=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def conv_layers(architecture: str, in_channels: int, activation: str) -> nn.Sequential:
    """The convolutional part of ``architecture``.

    * ``convnet_simple``: 32 8x8 stride 4, 64 4x4 stride 2, 128 3x3 stride 2.
    * ``convnet_atari``: the Nature DQN (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1.
    * ``convnet_impala``: the shallow IMPALA network (Espeholt et al. 2018, fig. 3, left): 16 8x8/4, 32 4x4/2.
    * ``resnet_impala``: the IMPALA network (Espeholt et al. 2018, fig. 3): for 16, 32, 32 channels a
      3x3 convolution, a 3x3 max-pool of stride 2, two residual blocks.
    """
    act = ACTIVATIONS[activation]
    if architecture == "convnet_impala":  # the small network of the IMPALA paper (Espeholt et al. 2018, fig. 3)
        return nn.Sequential(
            nn.Conv2d(in_channels, 16, 8, stride=4),
            _in_place(activation),
            nn.Conv2d(16, 32, 4, stride=2),
            _in_place(activation),
        )
    if architecture in ("convnet_simple", "convnet_atari"):
        last = 128 if architecture == "convnet_simple" else 64
        last_stride = 2 if architecture == "convnet_simple" else 1
        # in place: a convolution's backward needs its input, not its output, so the activation may overwrite
        # it (one buffer less per layer; ELU's backward then works from its result)
        return nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4),
            _in_place(activation),
            nn.Conv2d(32, 64, 4, stride=2),
            _in_place(activation),
            nn.Conv2d(64, last, 3, stride=last_stride),
            _in_place(activation),
        )
    if architecture == "resnet_impala":
        mods: list[nn.Module] = []
        c = in_channels
        for out in (16, 32, 32):
            mods += [
                nn.Conv2d(c, out, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out, activation),
                _ResidualBlock(out, activation),
            ]
            c = out
        return nn.Sequential(*mods, act())
    raise ValueError(f"unknown encoder_conv_architecture {architecture!r}")


class ConvEncoder(nn.Module):
    """Image ``[N, *obs_shape]`` (any dtype; uint8 pixel values) to ``[N, out_size]`` features.

    Pixels are scaled to ``[0, 1]``. With ``normalize`` (``--normalize_input``, as Sample Factory does for
    images) each element of the image (pixel, channel, stacked frame) is then normalised by its own running
    mean and variance and clipped to ``[-5, 5]``: constant background becomes 0 and the few pixels that move
    (a ball, a paddle) stand out. The statistics are updated by the learner (:meth:`update_normalizers`).
    On a CPU with autograd on (the learner's passes) the conv stack gets its input in channels_last memory,
    which oneDNN runs faster; the values and the parameters' layout are those of the NCHW computation.

    Raises:
        ValueError: the image is too small for the architecture (the message says which fits).
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        architecture: str,
        mlp_layers: list[int],
        activation: str,
        normalize: bool = False,
        scale: float = 255.0,
        subtract: float = 0.0,
    ):
        """``scale``, ``subtract``: pixels become ``(x - subtract) / scale`` (``--obs_scale``,
        ``--obs_subtract_mean``; 255 and 0 scale to ``[0, 1]``). With ``normalize`` the statistics are kept on raw
        values with the variance epsilon ``1e-5 x scale^2``, which is Sample Factory's normalisation of the scaled
        values, ``((x - m) / s - mu') / sqrt(var' + 1e-5)``, exactly (``subtract`` cancels)."""
        super().__init__()
        self.scale, self.subtract = float(scale), float(subtract)
        self.axis = channel_axis(obs_shape)
        chw = (obs_shape[self.axis], *[d for i, d in enumerate(obs_shape) if i != self.axis])
        self.conv = conv_layers(architecture, chw[0], activation)
        try:
            with torch.no_grad():
                n = self.conv(torch.zeros(1, *chw)).flatten(1).shape[1]
        except RuntimeError:
            raise ValueError(
                f"images of shape {tuple(obs_shape)} are too small for --encoder_conv_architecture="
                f"{architecture}; use resnet_impala, which pools with padding"
            ) from None
        self.mlp = mlp(n, mlp_layers, activation)
        self.out_size = mlp_layers[-1] if mlp_layers else n
        eps = 1e-5 * self.scale**2
        self.normalizer = RunningMeanStd(tuple(obs_shape), clip=5.0, eps=eps) if normalize else None
        if self.normalizer is not None:  # before the first statistics: the plain scaling, (x - subtract) / scale
            self.normalizer.preset(self.subtract, self.scale**2 - eps)

    def update_normalizers(self, obs: torch.Tensor, reduce_sum: ReduceSum | None = None) -> None:
        """Merge ``[M, *obs_shape]`` images into the per-element statistics (summed over replicas by
        ``reduce_sum``)."""
        if self.normalizer is not None:
            self.normalizer.update(obs, reduce_sum)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.normalizer is not None:
            x = self.normalizer.normalize(x)
        elif self.subtract:
            x = (x - self.subtract) * (1.0 / self.scale)
        else:
            x = x * (1.0 / self.scale)
        if self.axis != 0:
            x = x.movedim(self.axis + 1, 1)
        if x.device.type == "cpu" and torch.is_grad_enabled():
            # the learner's passes: on a CPU, oneDNN runs the convolutions' forward + backward faster in
            # channels_last (NHWC) than in NCHW on the learner's large minibatches, while inference's small
            # batches are slower in NHWC, so they keep their layout (benchmarks/HISTORY.md, "channels_last in
            # the learner"). Only the activations' memory layout changes: same values up to float rounding,
            # parameters and checkpoints as they were.
            x = x.contiguous(memory_format=torch.channels_last)
        return self.mlp(self.conv(x).flatten(1))


_ENCODERS: dict = registry("encoder")  # carried to every process msf spawns (msf.runtime.registrations)


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
    module, _, name = spec.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"cannot import module {module!r} named in {spec!r} ({e})") from None
    if name not in _ENCODERS:
        raise ValueError(
            f"no encoder registered as {name!r} (msf.model.register_encoder; registered: {sorted(_ENCODERS) or 'none'})"
        )
    return _ENCODERS[name]


class DictEncoder(nn.Module):
    """A ``Dict`` observation flattened into ``[N, total]`` float32 (see ``EnvSpaces.obs_layout``), split
    again per key: 3-D keys through a :class:`ConvEncoder` (normalised per element with ``normalize_input``),
    the others through their own running mean/std normaliser (with ``normalize_input``) and MLP; the features
    are concatenated ``[N, out_size]``. The ``action_mask`` key is not encoded. ``--normalize_input_keys``
    limits the normalisation to the keys it names; ``--obs_scale`` and ``--obs_subtract_mean`` do not apply to
    dict observations (as in Sample Factory, where they touch only the plain ``obs``).

    Args:
        layout: ``((key, shape, size), ...)`` in the flattened order.
    """

    MASK_KEY = "action_mask"

    def __init__(self, layout, cfg, normalize: bool):
        super().__init__()
        self.slices: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        offset = 0
        self.encoders = nn.ModuleDict()
        self.normalizers = cast("dict[str, RunningMeanStd]", nn.ModuleDict())  # a ModuleDict, typed by its values
        self.out_size = 0
        for key, shape, size in layout:
            self.slices[key] = (offset, offset + size, tuple(shape))
            offset += size
            if key == self.MASK_KEY:
                continue
            keys = getattr(cfg, "normalize_input_keys", None)
            normalize_key = normalize and (keys is None or key in keys)
            if len(shape) != 3:
                enc: nn.Module = mlp(size, cfg.encoder_mlp_layers, cfg.nonlinearity)
                self.out_size += cfg.encoder_mlp_layers[-1]
                if normalize_key:
                    self.normalizers[key] = RunningMeanStd((size,), clip=5.0)
            else:
                enc = ConvEncoder(
                    shape, cfg.encoder_conv_architecture, cfg.encoder_conv_mlp_layers, cfg.nonlinearity, normalize_key
                )
                self.out_size += enc.out_size
            self.encoders[key] = enc

    def part(self, x: torch.Tensor, key: str) -> torch.Tensor:
        lo, hi, shape = self.slices[key]
        return x[:, lo:hi].reshape(x.shape[0], *shape)

    def update_normalizers(self, x: torch.Tensor, reduce_sum: ReduceSum | None = None) -> None:
        """Update each key's normaliser (vector keys here, image keys in their :class:`ConvEncoder`) with
        ``[M, total]`` observations (moments summed over replicas by ``reduce_sum``)."""
        for key, norm in self.normalizers.items():
            norm.update(self.part(x, key), reduce_sum)
        for key, enc in self.encoders.items():
            if isinstance(enc, ConvEncoder):
                enc.update_normalizers(self.part(x, key), reduce_sum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = []
        for key, enc in self.encoders.items():
            part = self.part(x, key)
            if key in self.normalizers:
                part = self.normalizers[key].normalize(part)
            feats.append(enc(part))
        return torch.cat(feats, dim=1)
