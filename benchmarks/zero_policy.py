"""An encoder that costs nothing, for measuring msf's own pipeline (``benchmarks/pipeline_overhead.py``).

``--encoder_custom=zero_policy:zero`` (with this folder on the path of every process) gives the policy an
encoder that ignores its ``[N, *obs_shape]`` observations and returns ``[N, 1]`` zeros, and a recurrent core
(where the flags ask for one, as Doom's do) that returns zeros and passes its states through unchanged
(:class:`ZeroCore`): what is left of the inference pass is the observations' copy out of the trajectory buffer,
the states' reads and writes, the heads' one-feature linear layers and the action sampling; everything else a
rollout is (env steps, shared-memory writes, requests, replies) is the real thing.

The core is swapped by wrapping ``msf.model.actor_critic._core`` when this module is imported; the wrapper builds
a :class:`ZeroCore` only for a config whose ``--encoder_custom`` is this module's encoder, so a process that
imported it builds every other model as before.
"""

from __future__ import annotations

import torch
from torch import nn

from msf.model import actor_critic, register_encoder

SPEC = "zero_policy:zero"


class ZeroEncoder(nn.Module):
    """``[N, *obs_shape]`` -> ``[N, 1]`` zeros (float32, on the observations' device)."""

    out_size = 1

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], 1, device=obs.device)


class ZeroCore(nn.Module):
    """In the place of ``nn.GRU``/``nn.LSTM``: ``([R, B, F], states) -> ([R, B, rnn_size] zeros, states)``, the
    states (a tensor, or an LSTM's pair) returned as they came."""

    def __init__(self, rnn_size: int):
        super().__init__()
        self.rnn_size = rnn_size

    def forward(self, seq: torch.Tensor, hx):
        return seq.new_zeros(seq.shape[0], seq.shape[1], self.rnn_size), hx


_real_core = actor_critic._core


def _core(cfg, in_size: int):
    if cfg.use_rnn and cfg.encoder_custom == SPEC:
        return ZeroCore(cfg.rnn_size)
    return _real_core(cfg, in_size)


actor_critic._core = _core
register_encoder("zero", lambda cfg, obs_shape: ZeroEncoder())
