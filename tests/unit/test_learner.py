"""Learner.train on hand-built batches: step counting, callbacks, parameter updates, normaliser and first-step
losses."""

import copy
import math

import numpy as np
import pytest
import torch

from msf.distributed.collectives import Collectives
from msf.envs.registry import EnvSpaces
from msf.learning.advantages import gae
from msf.learning.learner import Learner
from msf.model.normalizers import RunningMeanStd

from .conftest import make_learner, tiny_config


def _learner(**changes) -> Learner:
    return make_learner(tiny_config(**changes), seed=0)


def _batch(learner: Learner, seed: int = 0) -> dict[str, torch.Tensor]:
    B, T = learner.derived.trajectories_per_iteration, learner.cfg.rollout
    g = torch.Generator().manual_seed(seed)
    dones = torch.zeros(B, T, dtype=torch.uint8)
    dones[0, 1] = dones[-1, T - 1] = 1
    time_outs = torch.zeros(B, T, dtype=torch.uint8)
    time_outs[-1, T - 1] = 1
    return {
        "obs": torch.randn(B, T + 1, 3, generator=g) * 2.0 + 1.0,
        "actions": torch.randint(0, 2, (B, T), generator=g),
        "log_probs": torch.full((B, T), math.log(0.5)),
        "values": 0.1 * torch.randn(B, T, generator=g),
        "rewards": torch.randn(B, T, generator=g),
        "dones": dones,
        "time_outs": time_outs,
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
    }


def _params(learner):
    return [p.detach().clone() for p in learner.model.parameters()]


def test_train_counts_steps_and_calls_back():
    learner = _learner(num_epochs=2, num_batches_per_epoch=2)
    batch = _batch(learner)
    B, T = batch["rewards"].shape
    assert B == learner.derived.trajectories_per_iteration == 4
    calls = []
    before = _params(learner)
    stats = learner.train(batch, on_sgd_step=lambda model, version: calls.append((model, version)))
    n = 2 * 2
    assert learner.train_step == learner.policy_version == n
    assert [v for _, v in calls] == list(range(1, n + 1))
    assert all(m is learner.model for m, _ in calls)
    assert set(stats) >= {"policy_loss", "value_loss", "entropy", "kl", "loss", "grad_norm", "lr"}
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["lr"] == learner.cfg.learning_rate
    assert learner.model.obs_normalizer.count.item() == B * T
    changes = [(a - p).abs().max().item() for a, p in zip(_params(learner), before)]
    assert all(c > 0 for c in changes) and max(c for c in changes) > 1e-5


def test_tiny_learning_rate_changes_little():
    learner = _learner(learning_rate=1e-10)
    before = _params(learner)
    learner.train(_batch(learner))
    changes = [(a - p).abs().max().item() for a, p in zip(_params(learner), before)]
    assert max(changes) < 1e-8


def _own_outputs(learner, batch):
    """The model's log-probs, and its values (value-head units and denormalised) as Learner._prepare sees
    them (after the obs update). Tests put the value-head values in the batch as the behaviour values."""
    model = copy.deepcopy(learner.model)
    B, T = batch["rewards"].shape
    model.obs_normalizer.update(batch["obs"][:, :T])
    with torch.no_grad():
        out = model.evaluate(batch["obs"][:, :T].reshape(B * T, 3))
        log_probs = model.log_prob(out.dist, batch["actions"].reshape(-1)).view(B, T)
        values = model.evaluate(batch["obs"].reshape(B * (T + 1), 3)).values.view(B, T + 1)
    batch["values"] = values[:, :T].clone()
    return log_probs, model.denormalize_values(values)


def _normalised_advantages(learner, batch, values):
    cfg = learner.cfg
    adv, targets = gae(batch["rewards"], values, batch["dones"].float(), cfg.gamma, cfg.gae_lambda)
    adv = adv.reshape(-1).double()
    return (adv - adv.mean()) / (adv.std() + 1e-8), targets


def test_first_step_policy_loss_at_ratio_one():
    learner = _learner()  # one epoch, one minibatch: the stats are those of the first step
    batch = _batch(learner)
    log_probs, values = _own_outputs(learner, batch)
    batch["log_probs"] = log_probs
    adv_n, _ = _normalised_advantages(learner, batch, values)
    stats = learner.train(batch)
    assert stats["policy_loss"] == pytest.approx(-adv_n.mean().item(), abs=1e-5)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)


def test_first_step_losses_off_policy():
    # behaviour log-probs shifted so that ratios fall inside and outside [1/1.1, 1.1]: the loss depends on each
    # advantage
    learner = _learner()
    batch = _batch(learner)
    log_probs, values = _own_outputs(learner, batch)
    shift = torch.linspace(-0.3, 0.3, log_probs.numel()).view_as(log_probs)
    batch["log_probs"] = log_probs - shift
    adv_n, targets = _normalised_advantages(learner, batch, values)
    ratio = shift.reshape(-1).double().exp()
    eps = learner.cfg.ppo_clip_ratio
    expected = -torch.min(ratio * adv_n, ratio.clamp(1 / (1 + eps), 1 + eps) * adv_n).mean().item()
    rets = RunningMeanStd((), clip=None)
    rets.load_state_dict(learner.model.returns_normalizer.state_dict())
    rets.update(targets)
    with torch.no_grad():
        v_head = learner.model.normalize_values(values[:, :-1])  # value-head units before any update
    expected_v = (v_head.reshape(-1).double() - rets.normalize(targets.reshape(-1).double())).square().mean().item()
    kl = (ratio - 1 - shift.reshape(-1).double()).mean().item()
    stats = learner.train(batch)
    assert stats["policy_loss"] == pytest.approx(expected, abs=1e-5)
    assert stats["value_loss"] == pytest.approx(expected_v, abs=1e-4)
    assert stats["kl"] == pytest.approx(kl, abs=1e-6)


def test_the_learner_updates_the_image_normaliser_from_valid_samples():
    spaces = EnvSpaces(obs_shape=(2, 36, 36), obs_dtype=np.uint8, discrete=True, num_actions=3)
    cfg = tiny_config(encoder_conv_architecture="resnet_impala", encoder_conv_mlp_layers=[16])
    learner = make_learner(cfg, spaces, seed=0)
    B, T = learner.derived.trajectories_per_iteration, cfg.rollout
    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256, (B, T + 1, 2, 36, 36), dtype=torch.uint8, generator=g)
    valids = torch.ones(B, T)
    valids[0] = 0  # a masked trajectory does not count
    batch = {
        "obs": obs,
        "actions": torch.randint(0, 3, (B, T), generator=g),
        "log_probs": torch.full((B, T), -math.log(3)),
        "values": torch.zeros(B, T),
        "rewards": torch.randn(B, T, generator=g),
        "dones": torch.zeros(B, T, dtype=torch.uint8),
        "time_outs": torch.zeros(B, T, dtype=torch.uint8),
        "valids": valids,
    }
    learner.train(batch)
    norm = learner.model.actor_encoder.normalizer
    seen = obs[1:, :T].reshape(-1, 2, 36, 36).double()  # the acted-on observations of valid samples only
    assert norm.count.item() == (B - 1) * T
    torch.testing.assert_close(norm.mean, seen.mean(0))
    torch.testing.assert_close(norm.var, seen.var(0, unbiased=False))


def test_symmetric_kl_exploration_loss_enters_the_loss():
    """loss = policy loss + value_loss_coeff x value loss + exploration_loss_coeff x mean symmetric KL to the
    uniform policy (Sample Factory's symmetric_kl), with the divergence computed here by torch.distributions."""
    from torch.distributions import Categorical, kl_divergence

    learner = _learner(exploration_loss="symmetric_kl", exploration_loss_coeff=0.3)
    with torch.no_grad():
        learner.model.action_head.bias.copy_(torch.tensor([1.5, -1.0]))  # a skewed policy
    b = learner._prepare(_batch(learner))
    loss, stats = learner._minibatch_loss(b)
    B, T = b["rewards"].shape
    logits = learner.model(b["obs"][:, :T].reshape(B * T, 3))[0].detach().double()
    p, u = Categorical(logits=logits), Categorical(probs=torch.full_like(logits, 0.5))
    sym = (0.5 * (kl_divergence(p, u) + kl_divergence(u, p))).mean().item()
    rest = stats["policy_loss"].item() + learner.cfg.value_loss_coeff * stats["value_loss"].item()
    assert loss.item() - rest == pytest.approx(0.3 * sym, rel=1e-4)
    assert sym > 0.05


class _CountingCollectives(Collectives):
    """The one-rank collectives, counting the blocking reductions a minibatch makes."""

    def __init__(self):
        self.reductions = 0

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        self.reductions += 1
        return t


def test_one_blocking_collective_per_minibatch_and_the_global_kl():
    """Without normalisers that update within the epoch loop (GAE, no returns normaliser), each SGD step reduces
    once: the advantages' count, sum and sum of squares with the KL sum (it used to reduce three times). The KL
    the iteration reports is the mean over the epoch's minibatches of approx_kl over each minibatch's samples,
    recomputed here from the model before each step."""
    cfg = tiny_config(
        num_epochs=2,
        num_batches_per_epoch=2,
        with_vtrace=False,
        normalize_input=False,
        normalize_returns=False,
        shuffle_minibatches=False,
    )
    counting = _CountingCollectives()
    learner = make_learner(cfg, seed=0, collectives=counting)
    batch = _batch(learner)
    # behaviour log-probs far from the model's (~log 0.5): a KL of ~0.1, where float32 loses nothing to cancellation
    batch["log_probs"] = torch.full_like(batch["log_probs"], math.log(0.2))
    B, T = batch["rewards"].shape
    expected, per_mb = [], B // cfg.num_batches_per_epoch

    # the KL of each minibatch, under the parameters the learner has just before that minibatch's step
    snapshots = []
    learner_copy = copy.deepcopy(learner)
    learner_copy.train(batch, on_sgd_step=lambda model, v: snapshots.append(copy.deepcopy(model.state_dict())))
    states = [learner.model.state_dict()] + snapshots[:-1]
    model = copy.deepcopy(learner.model)
    for step, state in enumerate(states):
        model.load_state_dict(state)
        i = step % cfg.num_batches_per_epoch
        mb = slice(i * per_mb, (i + 1) * per_mb)
        with torch.no_grad():
            params, _ = model(batch["obs"][mb, :T].reshape(per_mb * T, 3))
            log_p = torch.log_softmax(params.double(), -1).gather(1, batch["actions"][mb].reshape(-1, 1)).squeeze(1)
        log_r = log_p - batch["log_probs"][mb].reshape(-1).double()
        expected.append(float((log_r.exp() - 1 - log_r).mean()))
    counting.reductions = 0
    stats = learner.train(batch)
    assert counting.reductions == cfg.num_epochs * cfg.num_batches_per_epoch
    assert stats["kl"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert np.mean(expected) > 0.05
