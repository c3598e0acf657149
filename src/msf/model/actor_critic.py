"""The actor-critic: encoder(s), an optional recurrent core, action head, value head.

Shapes: observations ``[N, *obs_shape]`` (float32 vectors, or uint8 images); discrete actions
``[N]`` int64, continuous actions ``[N, A]`` float32; values ``[N]`` (in normalised units when the
return normaliser is on: see :meth:`ActorCritic.denormalize_values`). With the recurrent core,
its state is a flat ``[B, rnn_state_size]`` float32 per env (:func:`msf.cfg.config.rnn_state_size`: GRU ``L x H``;
LSTM ``2 x L x H``, h then c; with separate actor and critic weights the actor's core's state, then the critic's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Normal

from msf.cfg.config import Config, core_state_size, rnn_state_size
from msf.envs.registry import EnvSpaces
from msf.model.distributions import MultiCategorical, sample_categorical
from msf.model.encoders import ConvEncoder, DictEncoder, custom_encoder, mlp
from msf.model.normalizers import ReduceSum, RunningMeanStd


@dataclass
class PolicyOutput:
    """What one forward pass gives.

    Attributes:
        dist: action distribution over ``[N]`` samples.
        values: ``[N]`` value estimates, normalised units if returns are normalised.
    """

    dist: Distribution | MultiCategorical
    values: torch.Tensor


class ActorCritic(nn.Module):
    """Shared (or separate) encoder, optional GRU/LSTM core and decoder, categorical or Gaussian action head.

    With ``--actor_critic_share_weights=False`` the actor and the critic each have their own encoder, core and
    decoder (Sample Factory's separate weights): the value depends on the critic's parameters only, the action
    distribution on the actor's only. The state of the two cores is one flat vector, the actor's part first.

    Vector observations go through an MLP (``encoder_mlp_layers``) after the running mean/std
    normaliser; image observations (3-D) through a :class:`~msf.model.encoders.ConvEncoder`, scaled to
    ``[0, 1]`` and, with ``normalize_input``, normalised per element by the encoder's own running mean/std
    (Sample Factory's treatment of images). ``--obs_scale`` / ``--obs_subtract_mean`` scale plain (not dict)
    observations first: ``(obs - m) / s``, ``s`` 255 for images and 1 for vectors by default.

    The action head's output (:meth:`forward`'s first) is the logits ``[N, A]`` of a categorical, or for a
    Gaussian its means and log standard deviations side by side ``[N, 2A]`` (Sample Factory's layout): with
    ``--adaptive_stddev`` both from the head, else the means from the head and a state-independent learned log
    standard deviation (initialised to ``log(cfg.initial_stddev)``), the means squashed to ``c tanh(mean / c)``
    with ``--continuous_tanh_scale=c > 0`` (only there, as in Sample Factory). Standard deviations are clamped to
    ``[1e-4, 1e4]``. ``--decoder_mlp_layers`` adds an MLP between the core (or encoder) and the heads.

    Attributes:
        rnn_state_size: floats of recurrent state per env (:func:`msf.cfg.config.rnn_state_size`; 0 without a core).
        core_state_size: floats of one core's state (the actor's, or the critic's).

    Raises:
        ValueError: observations of an unsupported rank, or images too small for the conv encoder.
    """

    def __init__(self, cfg: Config, spaces: EnvSpaces):
        super().__init__()
        self.spaces = spaces
        self.image = len(spaces.obs_shape) == 3
        self.layout = spaces.obs_layout
        if len(spaces.obs_shape) not in (1, 3):
            raise ValueError(f"observations must be vectors or 3-D images, got shape {spaces.obs_shape}")
        # Sample Factory's preprocessing of a plain observation, (obs - m) / s; images default to s = 255
        self.obs_scale = float(cfg.obs_scale if cfg.obs_scale is not None else (255.0 if self.image else 1.0))
        self.obs_subtract = float(cfg.obs_subtract_mean)
        keys = cfg.normalize_input_keys
        normalize = cfg.normalize_input and (keys is None or self.layout is not None or "obs" in keys)
        self.obs_normalizer = None
        if normalize and not self.image and self.layout is None:
            # statistics of raw values with the epsilon scaled alike: the normalisation of (obs - m) / s, exactly
            self.obs_normalizer = RunningMeanStd(spaces.obs_shape, clip=5.0, eps=1e-5 * self.obs_scale**2)
            if (self.obs_scale, self.obs_subtract) != (1.0, 0.0):  # before the first update: the plain scaling
                self.obs_normalizer.preset(self.obs_subtract, self.obs_scale**2)
        self.nvec = spaces.action_nvec
        self.mask_slice = _mask_slice(self.layout, spaces.num_actions) if self.layout is not None else None
        self.returns_normalizer = RunningMeanStd((), clip=None) if cfg.normalize_returns else None

        def encoder() -> tuple[nn.Module, int]:
            if cfg.encoder_custom:
                enc = custom_encoder(cfg.encoder_custom)(cfg, spaces.obs_shape)
                return enc, int(enc.out_size)
            if self.layout is not None:
                enc = DictEncoder(self.layout, cfg, cfg.normalize_input)
                return enc, enc.out_size
            if self.image:
                enc = ConvEncoder(
                    spaces.obs_shape,
                    cfg.encoder_conv_architecture,
                    cfg.encoder_conv_mlp_layers,
                    cfg.nonlinearity,
                    normalize,
                    scale=self.obs_scale,
                    subtract=self.obs_subtract,
                )
                return enc, enc.out_size
            return mlp(spaces.obs_shape[0], cfg.encoder_mlp_layers, cfg.nonlinearity), cfg.encoder_mlp_layers[-1]

        separate = not cfg.actor_critic_share_weights
        self.actor_encoder, hidden = encoder()
        self.critic_encoder = encoder()[0] if separate else None
        self.rnn_type, self.rnn_layers, self.rnn_size = cfg.rnn_type, cfg.rnn_num_layers, cfg.rnn_size
        self.core_state_size, self.rnn_state_size = core_state_size(cfg), rnn_state_size(cfg)
        self.core = _core(cfg, hidden)
        self.critic_core = _core(cfg, hidden) if separate else None
        if cfg.use_rnn:
            hidden = cfg.rnn_size
        self.decoder = _decoder(cfg, hidden)
        self.critic_decoder = _decoder(cfg, hidden) if separate else None
        if self.decoder is not None:
            hidden = cfg.decoder_mlp_layers[-1]
        self.continuous = not spaces.discrete
        self.adaptive_stddev = self.continuous and cfg.adaptive_stddev
        self.tanh_scale = float(cfg.continuous_tanh_scale) if self.continuous and not cfg.adaptive_stddev else 0.0
        self.action_head = nn.Linear(hidden, spaces.num_actions * (2 if self.adaptive_stddev else 1))
        self.value_head = nn.Linear(hidden, 1)
        self.log_std = (
            nn.Parameter(torch.full((spaces.num_actions,), math.log(cfg.initial_stddev)))
            if self.continuous and not self.adaptive_stddev
            else None
        )
        head_gain = cfg.policy_init_gain if cfg.action_head_init_gain is None else cfg.action_head_init_gain
        self._initialize(cfg.policy_initialization, cfg.policy_init_gain, head_gain)
        if self.critic_decoder is not None:
            self.register_load_state_dict_pre_hook(_shared_decoder_for_both)

    def _initialize(self, kind: str, gain: float, head_gain: float) -> None:
        if kind == "torch_default":
            return
        # linear and convolutional layers, as Sample Factory's policy_initialization (the recurrent core keeps
        # torch's own initialisation there too); the action head with its own gain (--action_head_init_gain)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                g = head_gain if m is self.action_head else gain
                if kind == "orthogonal":
                    nn.init.orthogonal_(m.weight, gain=g)
                else:
                    nn.init.xavier_uniform_(m.weight, gain=g)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, *obs_shape]`` observations as float32, vectors normalised (or only scaled, see the class); images
        are scaled and normalised in their encoder."""
        obs = obs.float()
        if self.obs_normalizer is not None:
            return self.obs_normalizer.normalize(obs)
        if not self.image and self.layout is None and (self.obs_scale, self.obs_subtract) != (1.0, 0.0):
            return (obs - self.obs_subtract) * (1.0 / self.obs_scale)
        return obs

    def update_obs_statistics(self, obs: torch.Tensor, reduce_sum: ReduceSum | None = None) -> None:
        """Update the observation normaliser(s) with ``[M, *obs_shape]`` observations. With ``reduce_sum``
        (the learner's all-reduce) it is a collective: every replica calls it with its own."""
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(obs, reduce_sum)
        for enc in (self.actor_encoder, self.critic_encoder):
            if isinstance(enc, (DictEncoder, ConvEncoder)):
                enc.update_normalizers(obs if isinstance(enc, ConvEncoder) else obs.float(), reduce_sum)

    def _mask(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Logits of actions the ``action_mask`` observation forbids (entries < 0.5) become -1e9."""
        if self.mask_slice is None:
            return params
        lo, hi = self.mask_slice
        return params.masked_fill(obs[:, lo:hi].float() < 0.5, -1e9)

    def mode(self, action_params: torch.Tensor) -> torch.Tensor:
        """The most likely action (the mean of a Gaussian)."""
        if self.continuous:
            return self.gaussian(action_params)[0]
        if self.nvec is not None:
            return MultiCategorical(action_params, self.nvec).mode
        return action_params.argmax(-1)

    def forward_with_states(
        self, obs: torch.Tensor, rnn_states: torch.Tensor | None = None, dones: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """:meth:`forward` that also returns the cores' states ``[B, rnn_state_size]`` after the last step (None
        without a core)."""
        x = self.normalize_obs(obs)
        h = self.actor_encoder(x)
        hc = None if self.critic_encoder is None else self.critic_encoder(x)  # None: the critic shares the actor's
        new_states = None
        if self.core is not None:
            if rnn_states is None:
                rnn_states = torch.zeros(obs.shape[0], self.rnn_state_size, device=obs.device)
            if self.critic_core is None:
                h, new_states = run_core(self.core, h, rnn_states, dones)
            else:  # the actor's state, then the critic's (Sample Factory's order)
                S = self.core_state_size
                assert hc is not None  # separate weights: a critic encoder and core both
                h, actor_states = run_core(self.core, h, rnn_states[:, :S], dones)
                hc, critic_states = run_core(self.critic_core, hc, rnn_states[:, S:], dones)
                new_states = torch.cat([actor_states, critic_states], dim=1)
        if self.decoder is not None:
            h = self.decoder(h)
            hc = hc if self.critic_decoder is None else self.critic_decoder(hc)
        return self._action_params(h, obs), self.value_head(h if hc is None else hc).squeeze(-1), new_states

    def _action_params(self, h: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The action head on ``[N, H]`` features: logits ``[N, A]``, or Gaussian means and log standard deviations
        ``[N, 2A]`` (see the class)."""
        out = self.action_head(h)
        if not self.continuous:
            return self._mask(out, obs)
        if self.adaptive_stddev:
            return out
        assert self.log_std is not None  # a Gaussian without adaptive_stddev has one
        if self.tanh_scale > 0:
            out = torch.tanh(out / self.tanh_scale) * self.tanh_scale
        return torch.cat([out, self.log_std.expand_as(out)], dim=1)

    def gaussian(self, action_params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Means and standard deviations ``[N, A]`` of a Gaussian head's ``[N, 2A]`` parameters (the deviations
        clamped to ``[1e-4, 1e4]``, Sample Factory's bounds)."""
        means, log_std = action_params.chunk(2, dim=-1)
        return means, log_std.exp().clamp(1e-4, 1e4)

    def forward(
        self, obs: torch.Tensor, rnn_states: torch.Tensor | None = None, dones: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Action-head outputs (logits ``[N, A]`` or Gaussian means ``[N, A]``) and values ``[N]``.

        With a recurrent core, ``obs`` is ``B`` sequences of ``R = N / B`` steps, sequence-major;
        ``rnn_states`` ``[B, rnn_state_size]`` their initial states (zeros when None) and ``dones``
        ``[B, R]`` their episode ends (see :func:`run_core`). Plain tensors, so that
        DistributedDataParallel can wrap the model; :meth:`evaluate` builds the distribution.
        """
        params, values, _ = self.forward_with_states(obs, rnn_states, dones)
        return params, values

    def distribution(self, action_params: torch.Tensor) -> Distribution | MultiCategorical:
        """The action distribution of :meth:`forward`'s first output."""
        if self.nvec is not None:
            return MultiCategorical(action_params, self.nvec)
        if not self.continuous:
            return Categorical(logits=action_params, validate_args=False)
        return Normal(*self.gaussian(action_params), validate_args=False)

    def evaluate(self, obs: torch.Tensor, rnn_states: torch.Tensor | None = None) -> PolicyOutput:
        """Action distribution and values for observations ``[N, *obs_shape]`` (one step per env)."""
        action_params, values = self(obs, rnn_states)
        return PolicyOutput(self.distribution(action_params), values)

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        rnn_states: torch.Tensor | None = None,
        generators: list[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Sample one action per env: (actions, log-probs ``[N]``, values ``[N]``, next core states
        ``[N, rnn_state_size]`` or None without a core), for ``[N, *obs_shape]`` observations and the
        core's ``[N, rnn_state_size]`` states.

        The inference workers' hot path: for discrete actions it samples from the softmax directly
        (:func:`~msf.model.distributions.sample_categorical`), without building a ``torch.distributions`` object.

        ``generators``: one CPU generator per row (``--deterministic``): row ``i``'s action is drawn from
        ``generators[i]`` alone (a categorical by ``torch.multinomial``, a Gaussian as ``mean + std x
        randn``), so that it depends on neither the other rows of the batch nor the order of the calls.
        """
        params, values, new_states = self.forward_with_states(obs, rnn_states)
        if generators is not None:
            actions = self._sample_per_row(params, generators)
            return actions, self.log_prob(self.distribution(params), actions), values, new_states
        if self.continuous or self.nvec is not None:
            dist = self.distribution(params)
            actions = dist.sample()
            return actions, self.log_prob(dist, actions), values, new_states
        actions, log_probs = sample_categorical(params)
        return actions, log_probs, values, new_states

    def _sample_per_row(self, params: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """Actions ``[N, ...]`` on ``params``' device, row ``i`` drawn from ``generators[i]`` (see :meth:`act`)."""
        p = params.detach().float().cpu()
        if self.continuous:
            mean, std = self.gaussian(p)
            noise = torch.stack([torch.randn(mean.shape[1:], generator=g) for g in generators])
            return (mean + std * noise).to(params.device)
        parts = torch.split(p, list(self.nvec), dim=-1) if self.nvec is not None else (p,)
        columns = []
        for part in parts:
            probs = torch.softmax(part, dim=-1)
            columns.append(torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)]))
        actions = torch.stack(columns, dim=-1) if self.nvec is not None else columns[0]
        return actions.to(params.device)

    def log_prob(self, dist: Distribution | MultiCategorical, actions: torch.Tensor) -> torch.Tensor:
        """``[N]`` log-probabilities (summed over action dimensions for a Gaussian)."""
        lp = dist.log_prob(actions)
        return lp.sum(-1) if self.continuous else lp

    def entropy(self, dist: Distribution | MultiCategorical) -> torch.Tensor:
        """``[N]`` entropies."""
        e = dist.entropy()
        return e.sum(-1) if self.continuous else e

    def denormalize_values(self, values: torch.Tensor) -> torch.Tensor:
        """Values in return units (identity without return normalisation)."""
        return self.returns_normalizer.denormalize(values) if self.returns_normalizer is not None else values

    def normalize_values(self, values: torch.Tensor) -> torch.Tensor:
        """Return-unit values into the value head's units."""
        return self.returns_normalizer.normalize(values) if self.returns_normalizer is not None else values


def run_core(
    core: nn.RNNBase, x: torch.Tensor, states: torch.Tensor, dones: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one recurrent core (the actor's or the critic's) over ``B`` sequences of ``R`` steps.

    Args:
        core: the ``nn.GRU`` or ``nn.LSTM`` (``L`` layers of ``H``).
        x: ``[B * R, F]`` encoder features, sequence-major (each sequence's R steps consecutive).
        states: ``[B, core_state_size]`` the state before each sequence's first step (GRU ``L x H``; LSTM h then c).
        dones: ``[B, R]`` episode ends: after a step with done 1 the state is reset to zeros
            before the next step. None: no resets (one step per sequence, as in inference).

    Returns:
        ``([B * R, H], [B, core_state_size])``: outputs and the states after the last step.
    """
    B = states.shape[0]
    R = x.shape[0] // B
    L, H, lstm = core.num_layers, core.hidden_size, isinstance(core, nn.LSTM)
    seq = x.view(B, R, -1).transpose(0, 1)  # [R, B, F]
    s = states.view(B, -1, L, H).permute(1, 2, 0, 3).contiguous()  # [1 or 2, L, B, H]
    hx = (s[0], s[1]) if lstm else s[0]
    if dones is None or R == 1 or not bool(dones[:, :-1].any()):
        out, hx = core(seq, hx)
    else:
        outs = []
        keep = 1.0 - dones.to(x.dtype)  # [B, R]
        for t in range(R):
            if t:
                m = keep[:, t - 1].view(1, B, 1)
                hx = (hx[0] * m, hx[1] * m) if isinstance(hx, tuple) else hx * m
            o, hx = core(seq[t : t + 1], hx)
            outs.append(o)
        out = torch.cat(outs)
    packed = (torch.stack(hx) if isinstance(hx, tuple) else hx[None]).permute(2, 0, 1, 3).reshape(B, -1)
    return out.transpose(0, 1).reshape(B * R, H), packed


def _core(cfg: Config, in_size: int) -> nn.RNNBase | None:
    """The recurrent core of ``--use_rnn`` (GRU or LSTM, ``rnn_num_layers`` x ``rnn_size``), or None."""
    if not cfg.use_rnn:
        return None
    return (nn.GRU if cfg.rnn_type == "gru" else nn.LSTM)(in_size, cfg.rnn_size, num_layers=cfg.rnn_num_layers)


def _decoder(cfg: Config, in_size: int) -> nn.Module | None:
    """The MLP of ``--decoder_mlp_layers`` between the core (or encoder) and the heads, or None."""
    return mlp(in_size, cfg.decoder_mlp_layers, cfg.nonlinearity) if cfg.decoder_mlp_layers else None


def _mask_slice(layout, num_actions: int) -> tuple[int, int] | None:
    """Where the action mask lies in a flattened dict observation (``(start, end)``), or None without one.

    Raises:
        ValueError: the mask's size is not the number of action logits.
    """
    offset = 0
    for key, _, size in layout:
        if key == DictEncoder.MASK_KEY:
            if size != num_actions:
                raise ValueError(
                    f"the action_mask observation has {size} entries but there are {num_actions} action logits"
                )
            return offset, offset + size
        offset += size
    return None


def _shared_decoder_for_both(module, state_dict, prefix, *_) -> None:
    """A separate-weights checkpoint with one decoder for the actor's and the critic's features (msf's earlier
    layout): its ``decoder.*`` becomes the critic's decoder too (the same function; training moves them apart)."""
    own = prefix + "decoder."
    if any(k.startswith(prefix + "critic_decoder.") for k in state_dict):
        return
    for key in [k for k in state_dict if k.startswith(own)]:
        state_dict[prefix + "critic_" + key[len(prefix) :]] = state_dict[key]
