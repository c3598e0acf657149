"""The actor-critic: MLP encoder(s), action head, value head.

Shapes: observations ``[N, *obs_shape]`` float32; discrete actions ``[N]`` int64,
continuous actions ``[N, A]`` float32; values ``[N]`` (in normalised units when the
return normaliser is on: see :meth:`ActorCritic.denormalize_values`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from msf.cfg.config import Config
from msf.envs.registry import EnvSpaces
from msf.learning.normalizers import RunningMeanStd

_ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}


@dataclass
class PolicyOutput:
    """What one forward pass gives.

    Attributes:
        dist: action distribution over ``[N]`` samples.
        values: ``[N]`` value estimates, normalised units if returns are normalised.
    """

    dist: torch.distributions.Distribution
    values: torch.Tensor


def mlp(in_size: int, layers: list[int], activation: str) -> nn.Sequential:
    """Linear layers of sizes ``layers``, each followed by the activation."""
    mods: list[nn.Module] = []
    for size in layers:
        mods += [nn.Linear(in_size, size), _ACTIVATIONS[activation]()]
        in_size = size
    return nn.Sequential(*mods)


class ActorCritic(nn.Module):
    """Shared (or separate) MLP encoder with a categorical or Gaussian action head.

    The Gaussian head has a state-independent learned log standard deviation,
    initialised to ``log(cfg.initial_stddev)``.
    """

    def __init__(self, cfg: Config, spaces: EnvSpaces):
        super().__init__()
        if len(spaces.obs_shape) != 1:
            raise ValueError(f"the MLP encoder needs flat vector observations, got shape {spaces.obs_shape}")
        obs_size = spaces.obs_shape[0]
        self.spaces = spaces
        self.obs_normalizer = RunningMeanStd(spaces.obs_shape, clip=5.0) if cfg.normalize_input else None
        self.returns_normalizer = RunningMeanStd((), clip=None) if cfg.normalize_returns else None
        self.actor_encoder = mlp(obs_size, cfg.encoder_mlp_layers, cfg.nonlinearity)
        self.critic_encoder = (
            None if cfg.actor_critic_share_weights else mlp(obs_size, cfg.encoder_mlp_layers, cfg.nonlinearity)
        )
        hidden = cfg.encoder_mlp_layers[-1]
        self.action_head = nn.Linear(hidden, spaces.num_actions)
        self.value_head = nn.Linear(hidden, 1)
        self.log_std = None if spaces.discrete else nn.Parameter(
            torch.full((spaces.num_actions,), math.log(cfg.initial_stddev)))
        self._initialize(cfg.policy_initialization, cfg.policy_init_gain)

    def _initialize(self, kind: str, gain: float) -> None:
        if kind == "torch_default":
            return
        for m in self.modules():
            if isinstance(m, nn.Linear):
                if kind == "orthogonal":
                    nn.init.orthogonal_(m.weight, gain=gain)
                else:
                    nn.init.xavier_uniform_(m.weight, gain=gain)
                nn.init.zeros_(m.bias)
        # small initial policy logits: a near-uniform first policy (Andrychowicz et al. 2021, sec. 3.2)
        nn.init.orthogonal_(self.action_head.weight, gain=0.01)

    def normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.obs_normalizer.normalize(obs) if self.obs_normalizer is not None else obs

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Action-head outputs (logits ``[N, A]`` or Gaussian means ``[N, A]``) and values ``[N]``.

        Plain tensors, so that DistributedDataParallel can wrap the model; :meth:`evaluate`
        builds the distribution.
        """
        x = self.normalize_obs(obs)
        h = self.actor_encoder(x)
        hc = h if self.critic_encoder is None else self.critic_encoder(x)
        return self.action_head(h), self.value_head(hc).squeeze(-1)

    def distribution(self, action_params: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution of :meth:`forward`'s first output."""
        if self.log_std is None:
            return Categorical(logits=action_params, validate_args=False)
        return Normal(action_params, self.log_std.exp().expand_as(action_params), validate_args=False)

    def evaluate(self, obs: torch.Tensor) -> PolicyOutput:
        """Action distribution and values for observations ``[N, obs_size]``."""
        action_params, values = self(obs)
        return PolicyOutput(self.distribution(action_params), values)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions for ``[N, obs_size]`` observations: (actions, log-probs ``[N]``, values ``[N]``).

        The inference workers' hot path: for discrete actions it samples from the softmax
        directly, without building a ``torch.distributions`` object (a few fewer tensor ops
        per call, which matters at batch sizes of 10 to 100).
        """
        if self.log_std is not None:
            out = self.evaluate(obs)
            actions = out.dist.sample()
            return actions, self.log_prob(out.dist, actions), out.values
        x = self.normalize_obs(obs)
        h = self.actor_encoder(x)
        hc = h if self.critic_encoder is None else self.critic_encoder(x)
        log_p = torch.log_softmax(self.action_head(h), dim=-1)
        actions = torch.multinomial(log_p.exp(), 1)
        return actions.squeeze(1), log_p.gather(1, actions).squeeze(1), self.value_head(hc).squeeze(-1)

    def log_prob(self, dist: torch.distributions.Distribution, actions: torch.Tensor) -> torch.Tensor:
        """``[N]`` log-probabilities (summed over action dimensions for a Gaussian)."""
        lp = dist.log_prob(actions)
        return lp if self.log_std is None else lp.sum(-1)

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        """``[N]`` entropies."""
        e = dist.entropy()
        return e if self.log_std is None else e.sum(-1)

    def denormalize_values(self, values: torch.Tensor) -> torch.Tensor:
        """Values in return units (identity without return normalisation)."""
        return self.returns_normalizer.denormalize(values) if self.returns_normalizer is not None else values

    def normalize_values(self, values: torch.Tensor) -> torch.Tensor:
        """Return-unit values into the value head's units."""
        return self.returns_normalizer.normalize(values) if self.returns_normalizer is not None else values
