"""Resolving the topology before anything is spawned: device, nproc_per_node, seed, port."""

from __future__ import annotations

import socket

import pytest
import torch

from msf.cfg.config import Config
from msf.cfg.validation import ConfigError
from msf.distributed.topology import RankInfo, split_evenly
from msf.runner.device_group import rank_config
from msf.runner.launch import resolve


def _no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_default_gpu_falls_back_to_one_cpu_group(monkeypatch):
    _no_gpu(monkeypatch)
    cfg = resolve(Config(num_workers=2), given=set())
    assert (cfg.device, cfg.nproc_per_node) == ("cpu", 1)
    assert cfg.seed is not None  # one seed, chosen before the ranks exist


def test_explicit_gpu_without_cuda_is_an_error(monkeypatch):
    _no_gpu(monkeypatch)
    with pytest.raises(ConfigError, match="^--device: gpu was asked for"):
        resolve(Config(), given={"device"})


def test_one_group_per_visible_gpu_and_no_more(monkeypatch):
    _gpus(monkeypatch, 4)
    assert resolve(Config(num_workers=8), given=set()).nproc_per_node == 4
    _gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match="^--nproc_per_node: 2 device groups but only 1 visible GPU"):
        resolve(Config(num_workers=8, nproc_per_node=2), given={"nproc_per_node"})


def test_cpu_groups_get_a_free_port_or_refuse_a_busy_one(monkeypatch):
    _no_gpu(monkeypatch)
    cfg = resolve(Config(device="cpu", nproc_per_node=2, num_workers=2), given={"device"})
    assert cfg.master_port > 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="^--master_port"):
            resolve(Config(device="cpu", nproc_per_node=2, num_workers=2, master_port=s.getsockname()[1]), set())


def test_rollout_workers_are_split_evenly():
    assert [split_evenly(5, 2, i) for i in range(2)] == [3, 2]
    assert sum(split_evenly(7, 3, i) for i in range(3)) == 7
    cfg = Config(num_workers=5, nproc_per_node=2)
    assert [rank_config(cfg, RankInfo(rank=r, local_rank=r, nproc_per_node=2)).num_workers for r in (0, 1)] == [3, 2]
    assert RankInfo(rank=3, local_rank=1, nproc_per_node=2, node_rank=1, nnodes=2).world_size == 4
