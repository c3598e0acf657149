"""The CUDA code paths, run only where a GPU is visible (skipped on CPU-only machines, so in CI).

What they check, each against a value computed on the CPU:

* a learner on ``cuda:0`` takes the same SGD steps as one on the CPU (GAE, V-trace, GRU);
* two DDP replicas whose learners both live on ``cuda:0`` (gloo carries the CUDA tensors; NCCL refuses
  two ranks on one GPU) stay bit-identical and match one CPU learner on the whole batch;
* ``msf-train --device=gpu`` (inference workers and learner on the GPU, pinned host memory) solves
  CartPole-v1 as the CPU run of the default suite does, its checkpoint resumes with ``--device=cpu``
  and ``msf-enjoy`` (CPU) plays it.

Run with ``pytest tests/gpu`` on a machine with a GPU (``benchmarks/gpu_check.sh`` does, with the
GPU benchmarks).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from distributed.test_ddp_learner import ITERATIONS, SPACES, T, _cfg, _full_batch, check_two_replicas_match_one_learner
from integration.conftest import SMALL_ENV_FLAGS, msf_env, read_summary, run_msf

from msf.cfg.config import Derived
from msf.learning.learner import Learner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def _learner(device: str, vtrace: bool, rnn: bool) -> Learner:
    torch.manual_seed(0)
    cfg = _cfg(batch_size=4 * T, vtrace=vtrace, rnn=rnn)
    return Learner(cfg, Derived.of(cfg), SPACES, device)


@pytest.mark.parametrize("vtrace, rnn", [(False, False), (True, False), (False, True)], ids=["gae", "vtrace", "gru"])
def test_learner_on_cuda_matches_the_cpu(vtrace, rnn):
    cpu, gpu = _learner("cpu", vtrace, rnn), _learner("cuda:0", vtrace, rnn)
    assert next(gpu.model.parameters()).is_cuda
    B = cpu.derived.trajectories_per_iteration
    for it in range(ITERATIONS):
        batch = _full_batch(it, B, rnn=rnn)
        s_cpu, s_gpu = cpu.train(batch), gpu.train({k: v.clone() for k, v in batch.items()})
        for k in ("policy_loss", "value_loss", "grad_norm", "kl"):
            assert s_gpu[k] == pytest.approx(s_cpu[k], rel=1e-3, abs=1e-6), (it, k, s_cpu, s_gpu)
    for (name, a), b in zip(cpu.model.state_dict().items(), gpu.model.state_dict().values()):
        torch.testing.assert_close(b.cpu().double(), a.double(), rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("vtrace, rnn", [(False, False), (True, True)], ids=["gae", "vtrace-gru"])
def test_two_replicas_on_one_gpu_match_one_cpu_learner(vtrace, rnn):
    check_two_replicas_match_one_learner(vtrace, masked=False, rnn=rnn, device="cuda:0")


def test_train_on_gpu_solves_cartpole_resumes_on_cpu_and_plays(tmp_path):
    train_dir = tmp_path / "train_dir"
    common = ["--env=CartPole-v1", "--experiment=gpu", f"--train_dir={train_dir}", "--seed=0", *SMALL_ENV_FLAGS]
    r = run_msf([*common, "--device=gpu", "--train_for_env_steps=300000"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (train_dir / "gpu" / "log.txt").read_text()
    assert "device cuda:0" in log, log[:2000]
    s = read_summary(train_dir, "gpu")
    assert s["status"] == "done" and s["episode_return_mean"] >= 450, s
    # the GPU checkpoint (cuda tensors, Adam state on the GPU) resumes on the CPU
    r = run_msf([*common, "--device=cpu", "--train_for_env_steps=310000"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in (train_dir / "gpu" / "log.txt").read_text()
    s2 = read_summary(train_dir, "gpu")
    assert s2["train_steps"] > s["train_steps"] and s2["env_steps"] >= 310_000
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            "--experiment=gpu",
            f"--train_dir={train_dir}",
            "--max_num_episodes=5",
            "--no_render=True",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "gpu" / "eval.json").read_text())
    assert ev["num_episodes"] == 5 and ev["return_mean"] >= 400, ev
