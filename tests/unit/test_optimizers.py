"""LAMB (msf.learning.optimizers.Lamb) against an independent recomputation of You et al. 2020, Algorithm 2 with
Sample Factory's details; its trust ratio at zero and extreme norms; state_dict round trips; make_optimizer."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from msf.cfg.config import Config
from msf.distributed.collectives import learner_state_tensors
from msf.learning.optimizers import LAMB_MAX_WEIGHT_NORM, LAMB_MIN_TRUST, LAMB_WEIGHT_DECAY, Lamb, make_optimizer

from .conftest import make_learner, tiny_config


class _Reference:
    """Algorithm 2 of You et al. 2020 in float64 with plain tensor ops, one parameter tensor at a time:
    m, v moments; bias-corrected m / (sqrt(v_hat) + eps) + lambda w; ratio phi(||w||) / ||u|| with
    phi(z) = min(z, 10), clamped to [0.01, 100], 1 if either norm is 0 (Sample Factory's Lamb)."""

    def __init__(self, params, betas, eps, decay):
        self.w = [p.detach().clone().double() for p in params]
        self.m = [torch.zeros_like(w) for w in self.w]
        self.v = [torch.zeros_like(w) for w in self.w]
        self.t = 0
        self.b1, self.b2 = betas
        self.eps, self.decay = eps, decay
        self.ratios: list[float] = []

    def step(self, grads, lr):
        self.t += 1
        self.ratios = []
        for i, g in enumerate(grads):
            g = g.double()
            self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g
            self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g * g
            m_hat = self.m[i] / (1 - self.b1**self.t)
            v_hat = self.v[i] / (1 - self.b2**self.t)
            u = m_hat / (torch.sqrt(v_hat) + self.eps) + self.decay * self.w[i]
            w_norm = math.sqrt(float((self.w[i] ** 2).sum()))
            u_norm = math.sqrt(float((u**2).sum()))
            if w_norm == 0.0 or u_norm == 0.0:
                ratio = 1.0
            else:
                ratio = min(max(min(w_norm, 10.0) / u_norm, 0.01), 100.0)
            self.ratios.append(ratio)
            self.w[i] = self.w[i] - lr * ratio * u


def _model(dtype) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).to(dtype)
    with torch.no_grad():
        model[0].bias.zero_()  # zero norm at the first step: ratio 1
        model[2].weight.mul_(100.0)  # ||w|| > 10: the cap phi(z) = min(z, 10)
        model[2].bias.fill_(1e-5)  # tiny norm: the ratio clamps at min_trust
    return model


def _loss(model, step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(16, 5, generator=g).to(next(model.parameters()).dtype)
    y = torch.randn(16, 3, generator=g).to(x.dtype)
    return ((model(x) - y) ** 2).mean()


def _run_against_reference(dtype, steps=8):
    model = _model(dtype)
    params = list(model.parameters())
    assert float(params[2].detach().norm()) > 10 and float(params[1].detach().norm()) == 0.0
    betas, eps = (0.9, 0.999), 1e-6
    opt = Lamb(params, lr=1e-2, betas=betas, eps=eps, weight_decay=LAMB_WEIGHT_DECAY)
    ref = _Reference(params, betas, eps, LAMB_WEIGHT_DECAY)
    worst, seen_ratios = 0.0, []
    for step in range(steps):
        lr = 1e-2 * (0.7 if step % 2 else 1.3)  # as the lr schedules do: the group's lr, changed between steps
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        _loss(model, step).backward()
        ref.step([p.grad for p in params], lr)
        opt.step()
        seen_ratios.extend(ref.ratios)
        for p, w in zip(params, ref.w):
            worst = max(worst, float(((p.detach().double() - w).abs() / w.abs().clamp(min=1e-3)).max()))
    return worst, seen_ratios


def test_lamb_float64_matches_algorithm_2_to_1e12():
    worst, ratios = _run_against_reference(torch.float64)
    assert worst < 1e-12, worst
    # the run went through the special cases: ratio 1 (zero-norm bias), the min_trust clamp, unclamped ratios
    assert 1.0 in ratios and 0.01 in ratios and any(0.01 < r < 100 and r != 1.0 for r in ratios)


def test_lamb_float32_matches_the_float64_reference():
    worst, _ = _run_against_reference(torch.float32)
    assert worst < 3e-6, worst


def test_trust_ratio_sets_the_step_norm():
    # first step, no decay: u = g / (|g| + eps) ~ sign(g), so ||u|| = 2 for 4 entries and the step's norm is
    # lr x ratio x ||u|| = lr x min(||w||, 10) while the ratio is inside [0.01, 100]
    lr = 0.1
    w_small = nn.Parameter(torch.full((4,), 0.25, dtype=torch.float64))  # ||w|| = 0.5: ratio 0.25
    w_big = nn.Parameter(torch.full((4,), 25.0, dtype=torch.float64))  # ||w|| = 50: capped at 10, ratio 5
    w_tiny = nn.Parameter(torch.full((4,), 5e-5, dtype=torch.float64))  # ||w|| = 1e-4: ratio 5e-5 -> 0.01
    w_zero = nn.Parameter(torch.zeros(4, dtype=torch.float64))  # ||w|| = 0: ratio 1, a plain Adam step
    w_still = nn.Parameter(torch.full((4,), 3.0, dtype=torch.float64))  # zero gradient: ||u|| = 0, ratio 1
    ps = [w_small, w_big, w_tiny, w_zero, w_still]
    before = [p.detach().clone() for p in ps]
    opt = Lamb(ps, lr=lr, eps=1e-12, weight_decay=0.0)
    g = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    for p in ps[:-1]:
        p.grad = g.clone()
    w_still.grad = torch.zeros(4, dtype=torch.float64)
    opt.step()
    step_norm = [float((p.detach() - b).norm()) for p, b in zip(ps, before)]
    u_norm = 2.0  # ||sign(g)||
    assert step_norm[0] == pytest.approx(lr * 0.5, rel=1e-9)
    assert step_norm[1] == pytest.approx(lr * LAMB_MAX_WEIGHT_NORM, rel=1e-9)
    assert step_norm[2] == pytest.approx(lr * LAMB_MIN_TRUST * u_norm, rel=1e-9)
    assert step_norm[3] == pytest.approx(lr * u_norm, rel=1e-9)
    torch.testing.assert_close(w_zero.detach(), -lr * torch.sign(g), rtol=1e-9, atol=0)
    assert torch.equal(w_still.detach(), before[4])  # no NaN from 0 / 0, and no move
    assert all(torch.isfinite(p).all() for p in ps)


def test_min_trust_one_is_adam_with_the_decay_in_the_update():
    torch.manual_seed(1)
    p = nn.Parameter(torch.randn(6, dtype=torch.float64))
    q = nn.Parameter(p.detach().clone())
    lamb = Lamb([p], lr=0.01, min_trust=1.0, weight_decay=0.0, eps=1e-8)
    adam = torch.optim.Adam([q], lr=0.01, eps=1e-8)
    for k in range(5):
        g = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
        p.grad, q.grad = g.clone(), g.clone()
        lamb.step()
        adam.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-14)


def test_state_dict_round_trip_gives_identical_next_steps():
    model = _model(torch.float32)
    opt = Lamb(model.parameters(), lr=3e-3)
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        _loss(model, step).backward()
        opt.step()
    # through bytes, as a checkpoint (torch.load with weights_only=True)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert all(int(s["step"]) == 3 for s in saved["optimizer"]["state"].values())
    twin = _model(torch.float32)
    twin.load_state_dict(saved["model"])
    twin_opt = Lamb(twin.parameters(), lr=1.0)  # the lr comes back with the param groups
    twin_opt.load_state_dict(saved["optimizer"])
    assert twin_opt.param_groups[0]["lr"] == 3e-3
    for step in range(3, 6):
        for m, o in ((model, opt), (twin, twin_opt)):
            o.zero_grad(set_to_none=True)
            _loss(m, step).backward()
            o.step()
        for a, b in zip(model.parameters(), twin.parameters()):
            assert torch.equal(a, b)


def test_make_optimizer_reads_the_config():
    cfg = Config(learning_rate=5e-4, adam_beta1=0.8, adam_beta2=0.99, adam_eps=1e-7)
    p = [nn.Parameter(torch.ones(3))]
    adam = make_optimizer(cfg, p)
    assert type(adam) is torch.optim.Adam
    lamb = make_optimizer(Config(**{**cfg.__dict__, "optimizer": "lamb"}), p)
    assert type(lamb) is Lamb
    for opt in (adam, lamb):
        g = opt.param_groups[0]
        assert (g["lr"], tuple(g["betas"]), g["eps"]) == (5e-4, (0.8, 0.99), 1e-7)
    assert lamb.param_groups[0]["weight_decay"] == LAMB_WEIGHT_DECAY


def test_learner_with_lamb_trains_checkpoints_and_its_state_is_checksummed():
    cfg = tiny_config(optimizer="lamb", lr_schedule="kl_adaptive_minibatch")
    learner = make_learner(cfg, seed=0)
    assert isinstance(learner.optimizer, Lamb)
    B, T = learner.derived.trajectories_per_iteration, cfg.rollout
    g = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randn(B, T + 1, 3, generator=g),
        "actions": torch.randint(0, 2, (B, T), generator=g),
        "log_probs": torch.full((B, T), math.log(0.5)),
        "values": torch.zeros(B, T),
        "rewards": torch.randn(B, T, generator=g),
        "dones": torch.zeros(B, T, dtype=torch.uint8),
        "time_outs": torch.zeros(B, T, dtype=torch.uint8),
        "policy_versions": torch.zeros(B, T, dtype=torch.int64),
    }
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.train({k: v.clone() for k, v in batch.items()})
    assert all(math.isfinite(v) for v in stats.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    # the replica checksum sees LAMB's moments and step counts
    named = learner_state_tensors(learner.model, learner.optimizer)
    assert any(k.endswith(".exp_avg_sq") for k in named) and any(k.endswith(".step") for k in named)
    # resume from a checkpoint's bytes (an in-process state_dict would share the moment tensors): the same next
    # iteration
    buf = io.BytesIO()
    torch.save(learner.state_dict(), buf)
    buf.seek(0)
    twin = make_learner(cfg)
    twin.load_state_dict(torch.load(buf, weights_only=True))
    torch.manual_seed(5)
    learner.train({k: v.clone() for k, v in batch.items()})
    torch.manual_seed(5)
    twin.train({k: v.clone() for k, v in batch.items()})
    for a, b in zip(learner.model.parameters(), twin.model.parameters()):
        assert torch.equal(a, b)


def test_a_resume_with_another_optimizer_starts_its_state_afresh(caplog):
    adam_cfg, lamb_cfg = tiny_config(encoder_mlp_layers=[8]), tiny_config(encoder_mlp_layers=[8], optimizer="lamb")
    adam = make_learner(adam_cfg)
    for p in adam.model.parameters():  # some Adam state to carry
        p.grad = torch.ones_like(p)
    adam.optimizer.step()
    state = adam.state_dict()
    assert state["optimizer_name"] == "adam"
    lamb = make_learner(lamb_cfg)
    with caplog.at_level("WARNING", logger="msf"):
        lamb.load_state_dict(state)
    assert "starts afresh" in caplog.text
    assert isinstance(lamb.optimizer, Lamb) and not lamb.optimizer.state  # fresh moments
    assert lamb.optimizer.param_groups[0]["min_trust"] == LAMB_MIN_TRUST  # Lamb's groups, not Adam's
    for a, b in zip(lamb.model.parameters(), adam.model.parameters()):
        assert torch.equal(a, b)  # the weights are taken
    # a checkpoint from before --optimizer (no optimizer_name) is Adam's, and loads into Adam
    del state["optimizer_name"]
    again = make_learner(adam_cfg)
    again.load_state_dict(state)
    assert torch.equal(again.optimizer.state_dict()["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
