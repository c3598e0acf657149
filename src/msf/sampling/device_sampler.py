"""A device-side env's sampler (``--env_gpu_actions=True --env_gpu_observations=True``): the env, the policy's
forward pass and the trajectory buffer on the device group's device, in the group's process.

::

    device env (N instances) --obs [N, ...]--> learner's model.act (same process, same device) --actions [N]--+
         ^                                                                                                   |
         +---------------------------------------------------------------------------------------------------+
         | each step's obs, actions, log-probs, values, rewards, dones written at [slots, t] of the buffer (device)
         v
    FullTrajectories(0, N slots) on full_queue --> batcher (index_select on the device) --> learner --SlotsReturned

No process is spawned, nothing goes through shared memory or the host but slot indices, the episode statistics (one
copy per rollout) and one flag per step (the finite check). :meth:`DeviceSampler.advance`, which the training loop
calls at the start of each pass, runs one rollout of ``--rollout`` steps of all ``N`` instances when ``N`` slots are
free: each instance writes one trajectory into its slot. The loop, the batcher and the learner are those of every
run.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from msf.cfg.config import Config, Derived
from msf.envs.device_env import make_device_env
from msf.envs.registry import EnvSpaces, env_config_of
from msf.sampling.messages import EpisodeStats, FullTrajectories, InferenceCounters, RolloutCounters, SlotsReturned
from msf.sampling.plan import DeviceGroup
from msf.sampling.protocol import ComponentFailed, Inbox, Outbox, OwnSamples

log = logging.getLogger("msf")


class Acting(Protocol):
    """What the sampler acts with: the learner's own model (``act``, see :class:`~msf.model.actor_critic.ActorCritic`)
    and its policy version (SGD steps taken)."""

    @property
    def model(self) -> Any: ...

    @property
    def policy_version(self) -> int: ...


class DeviceSampler(OwnSamples):
    """A :class:`~msf.sampling.protocol.Sampler`: one device env of ``cfg.num_envs_per_worker`` instances on
    ``group.device``, acted on by ``policies[0]``'s model in this process; ``group.buffer`` must live on that device
    (:meth:`TrajectoryBuffer.allocate` with ``device``). The env is made here, now; the group's torch random
    generator (actions, minibatch order) is seeded by ``cfg.seed`` and the group's first env, so groups explore
    apart and a ``--deterministic`` run repeats.

    Raises:
        whatever making the env raises.
    """

    receive_timeout_s = 0.0  # trajectories are announced in advance() only

    def __init__(
        self, cfg: Config, derived: Derived, spaces: EnvSpaces, group: DeviceGroup, policies: Sequence[Acting]
    ):
        self.device, self.buffer, self.policy = torch.device(group.device), group.buffer, policies[0]
        self.N, self.T, self.env_name, self.rank = cfg.num_envs_per_worker, cfg.rollout, cfg.env, group.rank.rank
        self.first_env = group.first_worker * self.N
        self.spaces, self.logs_tracebacks = spaces, True
        self.announced: queue.Queue[FullTrajectories] = queue.Queue()
        self.episodes: queue.Queue[EpisodeStats] = queue.Queue()
        self.returned: queue.Queue[SlotsReturned] = queue.Queue()
        # the loop's ends (Sampler's attributes)
        self.full_queue: Inbox[FullTrajectories] = self.announced
        self.stats_queue: Inbox[EpisodeStats] = self.episodes
        self.free_queues: Sequence[Outbox[SlotsReturned]] = [self.returned]
        self.inference_stats: Sequence[InferenceCounters] = [InferenceCounters()]
        self.rollout_wait: Sequence[RolloutCounters] = [RolloutCounters()]
        self.free = list(range(self.buffer.rewards.shape[0]))
        self.quota, self.since_release = derived.sync_rollouts, 0  # --async_rl=False: rollouts per iteration
        assert cfg.seed is not None, "launch.resolve() sets it"
        seed = cfg.seed * 1_000_003 + self.first_env
        torch.manual_seed(seed)
        config = env_config_of(cfg, group.first_worker, self.first_env, seed, self.rank)
        self.env = make_device_env(cfg, self.N, self.device, seed, config)
        self.rollout_wait[0].add_env("made", self.N)
        space = self.env.action_space  # a Box's actions are clipped to its bounds before the env sees them
        self.bounds = (
            (torch.as_tensor(space.low, device=self.device), torch.as_tensor(space.high, device=self.device))
            if isinstance(space, gym.spaces.Box)
            else None
        )
        self.keys = (torch.arange(self.N, dtype=torch.int64) + self.first_env) << 32  # slot_key's row part
        self.trajectories = 0  # each instance's trajectories so far (they move in lockstep)
        self.obs: torch.Tensor | None = None
        size = self.buffer.rnn_states.shape[-1]
        self.core = torch.zeros(self.N, size, device=self.device) if size else None
        self.ret = torch.zeros(self.N, dtype=torch.float64, device=self.device)
        self.len = torch.zeros(self.N, dtype=torch.int64, device=self.device)
        self.steps = 0  # vector steps so far (the step a failure names)

    def advance(self) -> bool:
        """Take the slots the learner returned; reset the env on the first call; then run one rollout when ``N``
        slots are free (and, with ``--async_rl=False``, this iteration's rollouts are not all written).

        Returns:
            True when a rollout ran.

        Raises:
            ComponentFailed: the env broke its contract (a tensor on another device, of another shape, a NaN or
                infinite observation or reward), in one line naming the env, the device group and the step.
        """
        while True:
            try:
                self.free.extend(self.returned.get_nowait().slots)
            except queue.Empty:
                break
        if self.quota and len(self.free) == self.buffer.rewards.shape[0]:
            self.since_release = 0  # the learner trained on the iteration and gave every slot back
        if self.obs is None:
            self.obs = self._checked(self.env.reset(), None, None, None)
            self.rollout_wait[0].add_env("started", self.N)
        if len(self.free) < self.N or (self.quota and self.since_release >= self.quota):
            return False
        self._rollout()
        self.since_release += 1
        return True

    @torch.no_grad()
    def _rollout(self) -> None:
        """``T`` steps of every instance into ``N`` free slots, announced as one :class:`FullTrajectories`; the
        episodes that ended go on ``stats_queue`` (one copy to the host)."""
        taken, self.free = self.free[: self.N], self.free[self.N :]
        lo = taken[0]
        # a run of consecutive slots (the usual case) is written through a slice, which costs less than an index
        rows: slice | torch.Tensor = (
            slice(lo, lo + self.N) if taken == list(range(lo, lo + self.N)) else torch.tensor(taken, device=self.device)
        )
        cpu_slots = torch.tensor(taken)
        self.buffer.slot_policy[cpu_slots] = 0
        self.buffer.slot_key[cpu_slots] = self.keys + self.trajectories
        b, model, version = self.buffer, self.policy.model, self.policy.policy_version
        ended = torch.zeros(self.T, self.N, dtype=torch.bool, device=self.device)
        returns = torch.zeros(self.T, self.N, dtype=torch.float64, device=self.device)
        lengths = torch.zeros(self.T, self.N, dtype=torch.int64, device=self.device)
        assert self.obs is not None, "advance() resets the env first"
        for t in range(self.T):
            b.obs[rows, t] = self.obs
            if self.core is not None:
                b.rnn_states[rows, t] = self.core
            actions, b.log_probs[rows, t], b.values[rows, t], core = model.act(self.obs, self.core)
            b.actions[rows, t] = actions
            if self.bounds is not None:
                actions = torch.maximum(torch.minimum(actions, self.bounds[1]), self.bounds[0])
            obs, rew, term, trunc = self.env.step(actions)
            self.steps += 1
            self.rollout_wait[0].add_step()
            obs = self._checked(obs, rew, term, trunc)
            done = term | trunc
            b.rewards[rows, t], b.dones[rows, t] = rew.float(), done.to(torch.uint8)
            b.time_outs[rows, t] = (trunc & ~term).to(torch.uint8)
            self.ret += rew
            self.len += 1
            ended[t], returns[t], lengths[t] = done, self.ret, self.len
            self.ret.masked_fill_(done, 0.0)
            self.len.masked_fill_(done, 0)
            if core is not None:
                self.core = core.masked_fill(done[:, None], 0.0)  # a new episode starts from a zero state
            self.obs = obs
        b.policy_versions[rows] = version
        b.obs[rows, self.T] = self.obs
        if self.core is not None:
            b.rnn_states[rows, self.T] = self.core
        self.inference_stats[0].add_batch(self.N * self.T)
        self.trajectories += 1
        self.announced.put(FullTrajectories(0, taken))
        if n := int(ended.sum()):
            self.episodes.put(EpisodeStats(0, returns[ended].tolist(), lengths[ended].tolist(), [0] * n))

    def _fail(self, what: str) -> None:
        self.logs_tracebacks = False  # the line says all
        raise ComponentFailed(f"{self.env_name} {what}, on device group {self.rank}, at vector step {self.steps}")

    def _checked(self, obs: Any, rew: Any, term: Any, trunc: Any) -> torch.Tensor:
        """``obs`` after checking what the env returned against its contract (:meth:`_fail`'s line otherwise):
        torch tensors on the group's device, of the declared shapes, boolean flags, with finite observations and
        rewards (``rew`` None: the first reset's observations only)."""
        N, shape = self.N, self.spaces.obs_shape
        fields = {"observation": (obs, (N, *shape)), "reward": (rew, (N,))}
        fields |= {"terminated": (term, (N,)), "truncated": (trunc, (N,))}
        for name, (x, want) in fields.items():
            if x is None:
                continue
            if not isinstance(x, torch.Tensor):
                self._fail(f"returned its {name}s as {type(x).__name__}, not a torch tensor")
            if x.device != self.device:
                self._fail(f"returned its {name}s on {x.device}, not on its device group's {self.device}")
            if tuple(x.shape) != want:
                self._fail(f"returned {name}s of shape {tuple(x.shape)}, not of the declared shape {want}")
            if name in ("terminated", "truncated") and x.dtype != torch.bool:
                self._fail(f"returned its {name} flags as {x.dtype}, not torch.bool")
        float_obs = obs.dtype.is_floating_point
        finite = torch.isfinite(obs).all() if float_obs else torch.ones((), dtype=torch.bool, device=self.device)
        if rew is not None:
            finite &= torch.isfinite(rew).all()
        if not bool(finite):  # one flag to the host per step: the policy must never see a NaN
            for name, x in (("observation", obs), ("reward", rew)):
                if x is not None and x.dtype.is_floating_point and not bool(torch.isfinite(x).all()):
                    flat = x.reshape(N, -1)
                    i = int(torch.nonzero(~torch.isfinite(flat).all(1))[0])
                    value = flat[i][~torch.isfinite(flat[i])][0].item()
                    step = "its first reset" if rew is None else f"episode step {int(self.len[i]) + 1}"
                    self._fail(f"returned a non-finite {name} ({value}) for env {self.first_env + i} at {step}")
        return obs.to(torch.uint8 if self.spaces.obs_dtype == np.uint8 else torch.float32)

    def stop(self) -> None:
        pass  # nothing runs between two calls of advance()

    def close(self) -> None:
        self.env.close()
