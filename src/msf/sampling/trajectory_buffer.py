"""The trajectory buffer: shared-memory tensors that rollout workers write trajectories into.

Layout: ``S`` slots, each one trajectory of ``T = rollout`` steps. Rollout worker ``w`` owns
slots ``[w * slots_per_worker, (w + 1) * slots_per_worker)``; each of its envs writes into one
slot at a time, and the spare slots hold finished trajectories until the learner has
copied them out. With sampler nodes (``--sampler_port``), ``remote_slots`` more slots after the workers' hold the
trajectories they send (:class:`~msf.sampling.sampler_endpoint.SamplerEndpoint` writes them). Observations have
``T + 1`` rows per slot: the last row is the observation after the last step (the bootstrap), and is also row 0 of
the env's next slot.

The rollout worker writes ``obs``, ``rewards``, ``dones`` and ``time_outs``; the inference
worker reads ``obs`` and writes ``actions``, ``log_probs``, ``values`` and ``policy_versions`` (and, with
``--kl_loss_coeff``, ``action_params``) at the same positions, which it finds in ``cursors`` (per env: slot
and step). Only indices travel through pipes and queues; no trajectory is pickled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from msf.cfg.config import Config, Derived
from msf.envs.registry import EnvSpaces


def _shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).share_memory_()


@dataclass
class TrajectoryBuffer:
    """Shared tensors of one device group (see module docstring for the layout).

    Attributes:
        obs: ``[S, T + 1, *obs_shape]`` float32, or uint8 for uint8 observations (images).
        actions: ``[S, T]`` int64 (discrete) or ``[S, T, A]`` float32.
        log_probs: ``[S, T]`` float32, behaviour-policy log-probability of the action.
        action_params: ``[S, T, P]`` float32, the behaviour policy's action distribution (for the fixed KL
            loss): logits ``P = num_actions`` (masked ones at -1e9), or Gaussian means then log standard
            deviations ``P = 2 x num_actions``; ``P = 0`` (nothing stored) when ``kl_loss_coeff`` is 0.
        values: ``[S, T]`` float32, behaviour-policy value (value-head units) of the observation.
        rewards: ``[S, T]`` float32, raw env rewards.
        dones: ``[S, T]`` uint8, 1 when the episode ended (terminated or truncated) at that step.
        time_outs: ``[S, T]`` uint8, 1 when it was truncated and not terminated.
        policy_versions: ``[S, T]`` int64, version of the weights that chose the action.
        rnn_states: ``[S, T + 1, rnn_state_size]`` float32, the recurrent core's state before each step
            (zeros after an episode end; ``rnn_state_size`` 0 without a core). Like ``obs``, row ``T``
            is row 0 of the env's next slot.
        cursors: ``[W, E, 2]`` int64, per rollout worker and env: (slot, step) being written.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    action_params: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    time_outs: torch.Tensor
    policy_versions: torch.Tensor
    rnn_states: torch.Tensor
    cursors: torch.Tensor
    slot_policy: torch.Tensor  # [S] int64: the policy whose trajectory the slot holds
    slot_key: torch.Tensor  # [S] int64: job-wide row x 2**32 + that row's trajectory count (--deterministic's order)

    @staticmethod
    def action_params_size(cfg: Config, spaces: EnvSpaces) -> int:
        """``P`` of ``action_params``: 0 without the fixed KL loss (``kl_loss_coeff`` 0), else the logits
        (``num_actions``) or the Gaussian's means and log standard deviations (``2 x num_actions``)."""
        if cfg.kl_loss_coeff <= 0:
            return 0
        return spaces.num_actions * (1 if spaces.discrete else 2)

    @staticmethod
    def layout(cfg: Config, derived: Derived, spaces: EnvSpaces) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Each tensor's shape and dtype (what :meth:`allocate` allocates), by field name."""
        S = cfg.num_workers * derived.slots_per_worker + derived.remote_slots
        T = cfg.rollout
        act_dtype = torch.int64 if spaces.discrete else torch.float32
        return {
            "obs": ((S, T + 1, *spaces.obs_shape), torch.uint8 if spaces.obs_dtype == np.uint8 else torch.float32),
            "actions": ((S, T, *spaces.action_shape), act_dtype),
            "log_probs": ((S, T), torch.float32),
            "action_params": ((S, T, TrajectoryBuffer.action_params_size(cfg, spaces)), torch.float32),
            "values": ((S, T), torch.float32),
            "rewards": ((S, T), torch.float32),
            "dones": ((S, T), torch.uint8),
            "time_outs": ((S, T), torch.uint8),
            "policy_versions": ((S, T), torch.int64),
            "rnn_states": ((S, T + 1, derived.rnn_state_size), torch.float32),
            "cursors": ((cfg.num_workers, cfg.num_envs_per_worker * derived.num_agents, 2), torch.int64),
            "slot_policy": ((S,), torch.int64),
            "slot_key": ((S,), torch.int64),
        }

    @staticmethod
    def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return math.prod(shape) * dtype.itemsize

    @classmethod
    def nbytes(cls, cfg: Config, derived: Derived, spaces: EnvSpaces) -> int:
        """The bytes :meth:`allocate` takes in shared memory, computed without allocating anything."""
        return sum(cls.tensor_bytes(shape, dtype) for shape, dtype in cls.layout(cfg, derived, spaces).values())

    @classmethod
    def allocate(
        cls, cfg: Config, derived: Derived, spaces: EnvSpaces, device: str | None = None
    ) -> "TrajectoryBuffer":
        """The buffer in shared memory (``device`` None), or its trajectory fields on ``device`` and its indices
        (``cursors``, ``slot_policy``, ``slot_key``) in ordinary CPU memory: a device-side env's buffer, written
        and read in its device group's process only (:class:`~msf.sampling.device_sampler.DeviceSampler`)."""
        layout = cls.layout(cfg, derived, spaces)
        if device is None:
            return cls(**{k: _shared(shape, dtype) for k, (shape, dtype) in layout.items()})
        cpu = ("cursors", "slot_policy", "slot_key")
        return cls(**{k: torch.zeros(s, dtype=d, device="cpu" if k in cpu else device) for k, (s, d) in layout.items()})

    @property
    def rollout(self) -> int:
        return self.rewards.shape[1]

    def numpy_views(self) -> dict[str, np.ndarray]:
        """Numpy arrays over the same shared memory (cheaper than torch for small indexed writes)."""
        return {k: getattr(self, k).numpy() for k in self.__dataclass_fields__}

    def gather(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copy the trajectories in ``slots`` (``[B]`` int64) out of the buffer.

        Returns:
            a dict of ``[B, ...]`` tensors (``obs`` ``[B, T + 1, ...]``, the rest ``[B, T, ...]``),
            after which the slots may be reused.
        """
        names = ["obs", "actions", "log_probs", "values", "rewards", "dones", "time_outs", "policy_versions"]
        if self.rnn_states.shape[-1]:
            names += ("rnn_states",)
        if self.action_params.shape[-1]:
            names += ("action_params",)
        slots = slots.to(self.obs.device)
        return {k: getattr(self, k).index_select(0, slots) for k in names}
