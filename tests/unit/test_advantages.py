"""GAE, V-trace and value bootstrap against float64 references written from the papers' explicit sums."""

import numpy as np
import pytest
import torch

from msf.learning.advantages import apply_value_bootstrap, gae, vtrace

B, T = 5, 17


def _inputs(seed: int):
    """Random rewards, values ``[B, T + 1]`` and dones with ends mid-trajectory, twice in a row and at the last step."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(B, T))
    values = rng.normal(size=(B, T + 1))
    dones = (rng.random((B, T)) < 0.15).astype(np.float64)
    dones[0, 5] = dones[0, 6] = 1.0  # two episode ends in a row
    dones[1, T - 1] = 1.0  # an episode end at the last step
    dones[2, :] = 0.0  # no episode end at all
    dones[3, 0] = 1.0  # an episode end at the first step
    dones[4, 8] = 1.0  # one in the middle
    return rewards, values, dones


def _gae_reference(r, v, d, gamma, lam):
    """Schulman et al. 2016 eq. 16: A_t = sum_k (gamma lambda)^k delta_{t+k}, stopping at the first end at or
    after t."""
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        delta = [r[b, t] + gamma * (1.0 - d[b, t]) * v[b, t + 1] - v[b, t] for t in range(T)]
        for t in range(T):
            ends = [k for k in range(t, T) if d[b, k]]
            last = ends[0] if ends else T - 1
            adv[b, t] = sum((gamma * lam) ** k * delta[t + k] for k in range(last - t + 1))
    return adv


def _vtrace_reference(r, v, d, log_rhos, gamma, rho_bar, c_bar):
    """IMPALA eq. 1 in explicit-sum form with per-step discounts gamma_t = gamma (1 - d_t)."""
    ratio = np.exp(log_rhos)
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    g = gamma * (1.0 - d)
    vs = np.zeros((r.shape[0], T + 1))
    for b in range(r.shape[0]):
        for s in range(T + 1):
            total = v[b, s]
            for t in range(s, T):
                weight = np.prod([g[b, i] * c[b, i] for i in range(s, t)])  # empty product = 1
                total += weight * rho[b, t] * (r[b, t] + g[b, t] * v[b, t + 1] - v[b, t])
            vs[b, s] = total  # vs[:, T] = V(x_T)
    pg_adv = rho * (r + g * vs[:, 1:] - v[:, :T])
    return vs[:, :T], pg_adv


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.5)])
def test_gae_matches_explicit_sum(seed, dtype, atol, gamma, lam):
    r, v, d = _inputs(seed)
    expected = _gae_reference(r, v, d, gamma, lam)
    rt, vt, dt = (torch.tensor(x, dtype=dtype) for x in (r, v, d))
    adv, targets = gae(rt, vt, dt.to(torch.uint8), gamma, lam)
    assert adv.dtype == dtype and adv.shape == (B, T)
    np.testing.assert_allclose(adv.double().numpy(), expected, rtol=0, atol=atol)
    torch.testing.assert_close(targets, adv + vt[:, :T], rtol=0, atol=atol)


def test_gae_episode_end_cuts_the_sum():
    # one trajectory, T=3, episode ends at step 0: A_0 = r_0 - V_0 exactly, nothing from later steps
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 10.0, 20.0, 30.0]], dtype=torch.float64)
    d = torch.tensor([[1, 0, 0]])
    adv, _ = gae(r, v, d, 0.5, 0.5)
    # A_2 = 3 + 0.5*30 - 20 = -2; A_1 = 2 + 0.5*20 - 10 + 0.25*(-2) = 1.5; A_0 = 1 - 0.5 = 0.5
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.5, -2.0]], dtype=torch.float64))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.8, 2.0), (2.0, 0.8)])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_vtrace_matches_explicit_sum(seed, rho_bar, c_bar, dtype, atol):
    r, v, d = _inputs(seed)
    log_rhos = np.random.default_rng(100 + seed).normal(scale=0.5, size=(B, T))
    assert (log_rhos > 0.3).any() and (log_rhos < -0.3).any()  # ratios above and below 1
    exp_vs, exp_adv = _vtrace_reference(r, v, d, log_rhos, 0.95, rho_bar, c_bar)
    rt, vt, dt, lt = (torch.tensor(x, dtype=dtype) for x in (r, v, d, log_rhos))
    vs, adv = vtrace(rt, vt, dt.to(torch.uint8), lt, 0.95, rho_bar, c_bar)
    assert vs.shape == adv.shape == (B, T) and vs.dtype == dtype
    np.testing.assert_allclose(vs.double().numpy(), exp_vs, rtol=0, atol=atol)
    np.testing.assert_allclose(adv.double().numpy(), exp_adv, rtol=0, atol=atol)


@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_on_policy_equals_n_step_return(seed):
    r, v, d = (torch.tensor(x) for x in _inputs(seed))
    vs, adv = vtrace(r, v, d, torch.zeros_like(r), 0.97, 1.0, 1.0)
    gae_adv, gae_targets = gae(r, v, d, 0.97, 1.0)
    torch.testing.assert_close(vs, gae_targets, rtol=0, atol=1e-10)
    # on-policy pg advantage r_t + gamma_t v_{t+1} - V_t is the one-step form of the same return
    g = 0.97 * (1.0 - d)
    nxt = torch.cat([vs[:, 1:], v[:, T:]], 1)
    torch.testing.assert_close(adv, r + g * nxt - v[:, :T], rtol=0, atol=1e-10)


def test_apply_value_bootstrap_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]])
    values = torch.tensor([[10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0]])
    time_outs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out = apply_value_bootstrap(rewards, values, time_outs, 0.5)
    # only (0, 1): 2 + 0.5 * 20 = 12 and (1, 2): 0.5 + 0.5 * 3 = 2
    torch.testing.assert_close(out, torch.tensor([[1.0, 12.0, 3.0], [0.0, -1.0, 2.0]]))
    # values given as [B, T] work the same
    torch.testing.assert_close(apply_value_bootstrap(rewards, values[:, :3], time_outs, 0.5), out)
