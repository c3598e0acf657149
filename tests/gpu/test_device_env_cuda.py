"""The device-side env path on CUDA (skipped without a GPU): the torch CartPole on ``cuda:0`` steps as on the CPU,
and ``msf-train --device=gpu`` trains it with its buffer and policy on the GPU."""

from __future__ import annotations

import pytest
import torch
from integration.conftest import read_summary, run_msf

from msf.envs.torch_cartpole import TorchCartPole

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def test_torch_cartpole_on_cuda_steps_as_on_the_cpu():
    cpu, gpu = TorchCartPole(256, "cpu", 0), TorchCartPole(256, "cuda:0", 0)
    cpu.reset()
    gpu.reset()
    gpu.state = cpu.state.to("cuda:0")
    g = torch.Generator().manual_seed(1)
    for _ in range(30):  # before any episode ends (the resets' draws differ between the devices' generators)
        a = torch.randint(0, 2, (256,), generator=g)
        oc, rc, tc, _ = cpu.step(a)
        og, rg, tg, _ = gpu.step(a.to("cuda:0"))
        assert og.device.type == "cuda" and torch.equal(tc, tg.cpu()) and torch.equal(rc, rg.cpu())
        torch.testing.assert_close(og.cpu(), oc, rtol=0, atol=1e-6)
        if tc.any():
            break


def test_msf_train_steps_a_device_env_on_the_gpu(tmp_path):
    r = run_msf(
        [
            "--device=gpu",
            "--env=torch_cartpole",
            "--env_gpu_actions=True",
            "--num_envs_per_worker=1024",
            "--rollout=16",
            "--batch_size=4096",
            "--num_batches_per_epoch=4",
            "--encoder_mlp_layers",
            "64",
            "64",
            "--train_for_env_steps=200000",
            f"--train_dir={tmp_path}",
            "--experiment=gpu",
        ],
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path, "gpu")
    assert s["status"] == "done" and s["env_steps"] >= 200000 and s["episodes"] > 1000
