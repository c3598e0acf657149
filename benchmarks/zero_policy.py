"""An encoder that costs nothing, for measuring msf's own pipeline (``benchmarks/pipeline_overhead.py``).

``--encoder_custom=zero_policy:zero`` (with this folder on the path of every process) gives the policy an
encoder that ignores its ``[N, *obs_shape]`` observations and returns ``[N, 1]`` zeros: what is left of the
inference pass is the observations' copy out of the trajectory buffer, the heads' one-feature linear layers and
the action sampling; everything else a rollout is (env steps, shared-memory writes, requests, replies) is the
real thing.
"""

from __future__ import annotations

import torch
from torch import nn

from msf.model import register_encoder


class ZeroEncoder(nn.Module):
    """``[N, *obs_shape]`` -> ``[N, 1]`` zeros (float32, on the observations' device)."""

    out_size = 1

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], 1, device=obs.device)


register_encoder("zero", lambda cfg, obs_shape: ZeroEncoder())
