"""The learner: one PPO-clip training iteration on a batch of whole trajectories.

No processes here: :meth:`Learner.train` takes tensors and returns statistics, so it is
tested on hand-built batches. The device-group runner feeds it from the trajectory
buffer and publishes the weights after each SGD step through ``on_sgd_step``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from msf.cfg.config import Config, Derived
from msf.distributed.collectives import Collectives
from msf.envs.registry import EnvSpaces
from msf.learning.advantages import apply_value_bootstrap, gae, vtrace
from msf.learning.losses import (
    approx_kl,
    categorical_kl,
    clipped_value_loss,
    fixed_kl_loss,
    gaussian_kl,
    ppo_policy_loss,
    symmetric_kl_to_uniform,
)
from msf.learning.lr_schedule import KlAdaptiveLR
from msf.learning.optimizers import make_optimizer
from msf.model.actor_critic import ActorCritic
from msf.model.normalizers import moment_sums, moments_of_sums

Batch = dict[str, torch.Tensor]
log = logging.getLogger("msf")


def _no_forward_buffer_sync() -> dict[str, Any]:
    """DDP's argument that stops it copying rank 0's buffers at every forward: ``forward_sync_buffers=False``
    where torch has it (2.13 deprecates ``broadcast_buffers``), else ``broadcast_buffers=False``. Buffers are
    still broadcast once at construction either way."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class Learner:
    """Model, optimiser and schedule of one policy on one device.

    Args:
        cfg, derived: the run's configuration. spaces: the env's spaces.
        device: torch device to train on.
        collectives: the policy's process group over all replicas (DDP averages gradients on it, and the
            learner's global statistics are reduced on it); default: one replica, nothing communicated.

    Attributes:
        train_step: SGD steps taken. policy_version: equal to ``train_step`` (the version
            that inference workers record per sample, to measure policy lag).
    """

    def __init__(
        self,
        cfg: Config,
        derived: Derived,
        spaces: EnvSpaces,
        device: torch.device | str = "cpu",
        collectives: Collectives | None = None,
    ):
        self.cfg, self.derived = cfg, derived
        self.device = torch.device(device)
        self.collectives = collectives or Collectives()
        self.model = ActorCritic(cfg, spaces).to(self.device)
        # With several replicas: DDP averages gradients. Its constructor broadcasts rank 0's parameters
        # and buffers once. broadcast_buffers=False: the normalisers are updated from all-reduced
        # moments instead, and a per-forward copy of rank 0's buffers would hide drift.
        self.ddp = (
            DDP(
                self.model,
                process_group=self.collectives.group,
                **_no_forward_buffer_sync(),
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
            )
            if self.collectives.distributed
            else None
        )
        # --optimizer: Adam or LAMB, over the model's parameters (DDP averages their gradients before the step)
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.lr_schedule = (
            None
            if cfg.lr_schedule in ("constant", "linear_decay")
            else KlAdaptiveLR(cfg.learning_rate, cfg.lr_schedule_kl_threshold, cfg.lr_adaptive_min, cfg.lr_adaptive_max)
        )
        self.train_step = 0

    @property
    def world_size(self) -> int:
        return self.collectives.world_size

    @property
    def policy_version(self) -> int:
        return self.train_step

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def set_progress(self, fraction: float) -> None:
        """The share of the step budget spent so far, in ``[0, 1]``: with ``linear_decay`` the lr becomes
        ``learning_rate x (1 - fraction)``. The training loop calls it before each iteration with the global
        count, so every replica sets the same lr."""
        if self.cfg.lr_schedule == "linear_decay":
            self._set_lr(self.cfg.learning_rate * max(0.0, 1.0 - fraction))

    def set_lr(self, lr: float) -> None:
        """Set the lr now (and the adaptive schedule's current value)."""
        self._set_lr(lr)
        if self.lr_schedule is not None:
            self.lr_schedule.lr = lr

    def _set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def _prepare(self, batch: Batch) -> Batch:
        """Move to the device, scale and clip rewards, update the normalisers, compute GAE targets."""
        cfg = self.cfg
        if self.device.type == "cuda":
            # pinned pages let the host-to-device copy run asynchronously
            batch = {k: v.pin_memory() for k, v in batch.items()}
        b = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        B, T = b["rewards"].shape
        b["rewards"] = (b["rewards"] * cfg.reward_scale).clamp(-cfg.reward_clip, cfg.reward_clip)
        b["dones"] = b["dones"].float()
        b["time_outs"] = b["time_outs"].float()
        b["valids"] = b["valids"].float() if "valids" in b else torch.ones_like(b["rewards"])
        valid = b["valids"].bool()
        model = self.model
        # statistics from the valid observations acted on (not the bootstrap rows, seen again next time)
        model.update_obs_statistics(b["obs"][:, :T][valid], self.collectives.all_reduce_sum_)
        # The behaviour policy's values (recorded by the inference workers) serve for GAE and as the
        # old values of the clipped value loss, as in Sample Factory; only the bootstrap row is
        # evaluated here. That saves a forward pass over the whole batch.
        with torch.no_grad():
            last = model(b["obs"][:, T], self._states_at(b, T))[1]
        b["old_values"] = b["values"]  # value-head units
        values = model.denormalize_values(torch.cat([b["values"], last[:, None]], 1))
        if cfg.value_bootstrap:
            b["rewards"] = apply_value_bootstrap(b["rewards"], values, b["time_outs"], cfg.gamma)
        if not cfg.with_vtrace:
            b["advantages"], b["targets"] = gae(b["rewards"], values, b["dones"], cfg.gamma, cfg.gae_lambda)
            if model.returns_normalizer is not None:
                model.returns_normalizer.update(b["targets"][valid], self.collectives.all_reduce_sum_)
        return b

    @staticmethod
    def _states_at(b: Batch, t: int) -> torch.Tensor | None:
        """``[B, rnn_state_size]`` stored core states before step ``t`` (None without a core)."""
        return b["rnn_states"][:, t] if "rnn_states" in b else None

    def _minibatch_loss(self, mb: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg, model = self.cfg, self.model
        b, T = mb["rewards"].shape
        obs = mb["obs"]
        flat_obs = obs[:, :T].reshape(b * T, *obs.shape[2:])
        if "rnn_states" in mb:
            # backpropagation through time over sequences of `recurrence` steps, each starting from the state
            # the behaviour policy had there (Sample Factory's choice), reset after episode ends
            R = self.derived.recurrence
            h0 = mb["rnn_states"][:, 0:T:R].reshape(b * (T // R), -1)
            action_params, values = (self.ddp or model)(flat_obs, h0, mb["dones"].reshape(b * (T // R), R))
        else:
            action_params, values = (self.ddp or model)(flat_obs)
        dist = model.distribution(action_params)
        log_probs = model.log_prob(dist, mb["actions"].reshape(b * T, *mb["actions"].shape[2:]))
        old_log_probs = mb["log_probs"].reshape(-1)
        if cfg.with_vtrace:
            with torch.no_grad():
                last = model(obs[:, T], self._states_at(mb, T))[1]
                v = model.denormalize_values(torch.cat([values.detach().view(b, T), last[:, None]], 1))
                log_rhos = (log_probs.detach() - old_log_probs).view(b, T)
                targets, adv = vtrace(mb["rewards"], v, mb["dones"], log_rhos, cfg.gamma, cfg.vtrace_rho, cfg.vtrace_c)
                if model.returns_normalizer is not None:
                    model.returns_normalizer.update(targets[mb["valids"].bool()], self.collectives.all_reduce_sum_)
        else:
            targets, adv = mb["targets"], mb["advantages"]
        valid = mb["valids"].reshape(-1)
        vb = valid.bool()
        kl = approx_kl(log_probs.detach()[vb], old_log_probs[vb]) if bool(vb.any()) else torch.zeros(())
        adv, weights, global_kl = global_minibatch(adv.reshape(-1), valid, kl, self.collectives)
        targets = model.normalize_values(targets.reshape(-1))
        policy_loss = ppo_policy_loss(log_probs, old_log_probs, adv, cfg.ppo_clip_ratio, weights)
        value_loss = clipped_value_loss(values, mb["old_values"].reshape(-1), targets, cfg.ppo_clip_value, weights)
        entropy = (model.entropy(dist) * weights).sum()
        if cfg.exploration_loss == "symmetric_kl":
            # Sample Factory clips the minibatch's mean divergence at 30
            sym_kl = (symmetric_kl_to_uniform(action_params, model.nvec) * weights).sum().clamp(max=30.0)
            exploration = cfg.exploration_loss_coeff * sym_kl
        else:
            exploration = -cfg.exploration_loss_coeff * entropy
        loss = policy_loss + cfg.value_loss_coeff * value_loss + exploration
        if cfg.kl_loss_coeff > 0:
            behaviour = mb["action_params"].reshape(b * T, -1)
            kl_loss = fixed_kl_loss(kl_to_behaviour(model, action_params, behaviour), cfg.kl_loss_coeff, weights)
            loss = loss + kl_loss
        else:
            kl_loss = torch.zeros((), device=loss.device)
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
            "kl": global_kl,
            "kl_loss": kl_loss.detach(),
            "loss": loss.detach(),
        }
        return loss, stats

    def train(self, batch: Batch, on_sgd_step: Callable[[nn.Module, int], None] | None = None) -> dict[str, float]:
        """One training iteration: ``num_epochs`` passes of ``num_batches_per_epoch`` minibatches.

        Args:
            batch: ``obs`` ``[B, T + 1, *obs_shape]``; ``actions`` ``[B, T(, A)]``; ``log_probs``,
                ``values``, ``rewards``, ``dones``, ``time_outs`` ``[B, T]`` (behaviour log-probs and
                values in value-head units, raw rewards, episode ends, time-outs); optionally ``valids``
                ``[B, T]`` (0: the sample is masked out of the losses and statistics), with ``B`` a multiple
                of ``num_batches_per_epoch``; with ``kl_loss_coeff > 0`` also ``action_params`` ``[B, T, P]``,
                the behaviour policy's action-distribution parameters (see :meth:`ActorCritic.forward`).
            on_sgd_step: called after each SGD step with the model and the new policy version.

        Returns:
            mean losses (``kl_loss``: the fixed KL penalty, 0 when off), entropy, KL, gradient norm and learning
            rate over the iteration.
        """
        cfg = self.cfg
        b = self._prepare(batch)
        B = b["rewards"].shape[0]
        per_mb = B // cfg.num_batches_per_epoch
        totals: dict[str, float] = {}
        n = 0
        for _ in range(cfg.num_epochs):
            order = (
                torch.randperm(B, device=self.device)
                if cfg.shuffle_minibatches
                else torch.arange(B, device=self.device)
            )
            epoch_kl = 0.0
            for i in range(cfg.num_batches_per_epoch):
                idx = order[i * per_mb : (i + 1) * per_mb]
                mb = {k: v.index_select(0, idx) for k, v in b.items()}
                loss, stats = self._minibatch_loss(mb)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
                stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
                self.optimizer.step()
                self.train_step += 1
                kl = float(stats["kl"])  # the global minibatch's (see global_minibatch)
                epoch_kl += kl
                if cfg.lr_schedule == "kl_adaptive_minibatch" and self.lr_schedule is not None:
                    self._set_lr(self.lr_schedule.update(kl))
                if on_sgd_step is not None:
                    on_sgd_step(self.model, self.policy_version)
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + float(v)
                n += 1
            if cfg.lr_schedule == "kl_adaptive_epoch" and self.lr_schedule is not None:
                self._set_lr(self.lr_schedule.update(epoch_kl / cfg.num_batches_per_epoch))
        out = {k: v / n for k, v in totals.items()}
        out["lr"] = self.lr
        return out

    def hyperparameters(self) -> dict[str, float]:
        """This policy's values of the hyperparameters PBT perturbs (:func:`msf.learning.pbt.pbt_hyperparameters`:
        :data:`~msf.learning.pbt.PBT_HYPERPARAMETERS`, and ``gamma`` with ``--pbt_optimize_gamma``);
        ``learning_rate`` is the base of the lr schedule."""
        from msf.learning.pbt import pbt_hyperparameters

        return {k: float(getattr(self.cfg, k)) for k in pbt_hyperparameters(self.cfg.pbt_optimize_gamma)}

    def set_hyperparameters(self, hyper: dict[str, float]) -> None:
        """Adopt ``hyper`` (see :meth:`hyperparameters`): the lr now, and as the base of its schedule; the others
        (``gamma`` among them) through ``self.cfg``, which the losses and advantages read at every iteration."""
        self.cfg = dataclasses.replace(self.cfg, **hyper)  # type: ignore[arg-type]  # hyper's keys: float fields
        self.set_lr(hyper["learning_rate"])

    def copy_from(self, donor: "Learner") -> None:
        """PBT's exploit step: take ``donor``'s weights, normalisers and optimiser state (not its step count).
        The policy version moves on by one, so that the inference workers load the new weights."""
        self.model.load_state_dict(donor.model.state_dict())
        lr = self.lr
        self.optimizer.load_state_dict(copy.deepcopy(donor.optimizer.state_dict()))
        self._set_lr(lr)
        self.train_step += 1

    def state_dict(self) -> dict:
        """Everything needed to resume: model (with normalisers), optimiser (and which: ``--optimizer``), step, lr,
        PBT's hyperparameters."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_name": self.cfg.optimizer,
            "train_step": self.train_step,
            "lr": self.lr,
            "hyperparameters": self.hyperparameters(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from a checkpoint's state (see :meth:`state_dict`). The optimiser's state is taken only when the
        checkpoint's optimiser is this run's ``--optimizer`` (one without ``optimizer_name`` was Adam's); after a
        change the new optimiser starts from fresh moments, with a warning.

        Raises:
            RuntimeError: the checkpoint does not fit the model (torch's message).
        """
        self.model.load_state_dict(state["model"])
        saved = state.get("optimizer_name", "adam")
        if saved == self.cfg.optimizer:
            names = [n for n, _ in self.model.named_parameters()]
            self.optimizer.load_state_dict(optimizer_state_for(names, state["optimizer"], state["model"]))
        else:
            log.warning(
                "the checkpoint's optimiser is %s, this run's --optimizer is %s: its state starts afresh",
                saved,
                self.cfg.optimizer,
            )
        self.train_step = int(state["train_step"])
        if self.cfg.with_pbt and state.get("hyperparameters"):  # a policy's own, after PBT changed them
            # only those PBT perturbs in this run (a gamma saved by a run with --pbt_optimize_gamma stays unused)
            ours = self.hyperparameters()
            self.set_hyperparameters({k: float(v) for k, v in state["hyperparameters"].items() if k in ours})
        self._set_lr(float(state["lr"]))
        if self.lr_schedule is not None:
            self.lr_schedule.lr = self.lr


def global_minibatch(
    adv: torch.Tensor, valid: torch.Tensor, kl: torch.Tensor, collectives: Collectives
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The statistics of a minibatch that span all replicas, in one blocking collective: the count, sum and sum of
    squares of the valid samples' advantages and the sum of their KL terms, reduced together.

    Args:
        adv: ``[N]`` this replica's advantages. valid: ``[N]`` 1 for a valid sample, else 0. kl: this replica's
            mean KL over its valid samples (a scalar).

    Returns:
        ``(advantages, weights, kl)``: ``[N]`` advantages normalised by the global valid samples' mean and standard
        deviation; ``[N]`` sample weights, ``world_size / (valid samples of all replicas)`` for a valid one, so
        that DDP's average of the replicas' gradients is the gradient of the global mean loss whatever each
        replica's share (none: zero-weighted gradients, the same SGD step); the global mean KL, which the lr
        schedule reads.
    """
    vb = valid.bool()
    kl_sum = (kl.double() * vb.sum().double()).reshape(1).to(adv.device)
    packed = collectives.all_reduce_sum_(torch.cat([moment_sums(adv[vb]), kl_sum]))
    n, mean, var = moments_of_sums(packed[:3], torch.Size())
    weights = valid * (collectives.world_size / n.clamp(min=1.0)).to(valid.dtype)
    adv = (adv - mean.to(adv.dtype)) / (torch.sqrt(var * n / (n - 1).clamp(min=1)).to(adv.dtype) + 1e-8)
    return adv, weights, packed[3] / n.clamp(min=1.0)


def kl_to_behaviour(model: ActorCritic, action_params: torch.Tensor, behaviour: torch.Tensor) -> torch.Tensor:
    """``[N]`` ``KL(pi || pi_behaviour)`` per sample, the direction of Sample Factory's fixed KL loss, between the
    distributions of the model's ``[N, P]`` action parameters and the behaviour policy's, recorded by the
    inference workers (``action_params``: logits, or Gaussian means and log standard deviations, whose
    standard deviations both go through :meth:`ActorCritic.gaussian`'s clamp, as the policy's do)."""
    if model.spaces.discrete:
        return categorical_kl(action_params, behaviour, model.nvec)
    means, std = model.gaussian(action_params)
    old_means, old_std = model.gaussian(behaviour)
    return gaussian_kl(means, std.log(), old_means, old_std.log())


def optimizer_state_for(names: list[str], saved: dict, saved_model: dict) -> dict:
    """``saved`` (an optimiser state dict) as it fits a model whose parameters are ``names``, in order: itself, or
    where the checkpoint ``saved_model`` lacks some of them (the critic's own decoder, which the actor-critic fills
    from the shared one), its moments moved to their parameters' new positions, the new parameters' moments
    fresh."""
    had = [n for n in names if n in saved_model]
    groups = saved.get("param_groups", [])
    if had == names or len(groups) != 1 or list(groups[0]["params"]) != list(range(len(had))):
        return saved
    log.warning(
        "the checkpoint predates %s: their optimiser moments start afresh",
        ", ".join(sorted({n.rsplit(".", 2)[0] for n in names if n not in saved_model})),
    )
    position = {n: i for i, n in enumerate(names)}
    return {
        "state": {position[had[i]]: v for i, v in saved["state"].items()},
        "param_groups": [{**groups[0], "params": list(range(len(names)))}],
    }
