"""The seqlock of the published weights: a reader never keeps a torn copy, whether the writer is stalled
mid-copy, publishes again during the read, or died mid-copy."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from msf.sampling.published_weights import PublishedWeights


def _model(value: float) -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m


def _values(tensors) -> set[float]:
    return {float(v) for t in tensors for v in t.flatten()}


class StallingWriterModel:
    """Publishes ``value`` everywhere, but stops after the first tensor until ``go`` is set (``stalled`` tells
    that it got there): a learner caught mid-publication."""

    def __init__(self, value: float):
        self.tensors = list(_model(value).state_dict().values())
        self.stalled, self.go = threading.Event(), threading.Event()

    def state_dict(self):
        return self

    def values(self):
        yield self.tensors[0]
        self.stalled.set()
        assert self.go.wait(10.0)
        yield from self.tensors[1:]


def test_a_reader_waits_out_a_stalled_writer_and_returns_only_the_whole_new_version():
    weights = PublishedWeights(_model(1.0))
    weights.publish(_model(1.0), 1)
    writer_model = StallingWriterModel(2.0)
    writer = threading.Thread(target=weights.publish, args=(writer_model, 2))
    writer.start()
    assert writer_model.stalled.wait(10.0)
    assert int(weights.header[0]) % 2 == 1 and _values(weights.tensors) == {1.0, 2.0}  # really mid-copy
    reader_model = _model(0.0)
    with pytest.raises(TimeoutError):
        weights.load_into(reader_model, timeout_s=0.2)
    assert _values(reader_model.state_dict().values()) == {0.0}  # nothing torn was taken
    result = {}
    reader = threading.Thread(target=lambda: result.update(version=weights.load_into(reader_model, timeout_s=10.0)))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive() and not result  # still waiting: the counter is odd
    writer_model.go.set()
    writer.join(10.0)
    reader.join(10.0)
    assert result == {"version": 2}
    assert _values(reader_model.state_dict().values()) == {2.0}


class Dst:
    """A reader's destination tensor that runs ``hook`` once, right after its first copy: another
    publication lands between the reader's counter reads."""

    def __init__(self, t: torch.Tensor, hook=None):
        self.t, self.hook = t, hook

    def copy_(self, src: torch.Tensor) -> None:
        self.t.copy_(src)
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()


class ReaderModel:
    def __init__(self, dsts: list[Dst]):
        self.dsts = dsts

    def state_dict(self):
        return {str(i): d for i, d in enumerate(self.dsts)}


def test_a_publication_during_the_read_makes_the_reader_copy_again():
    weights = PublishedWeights(_model(0.0))
    weights.publish(_model(2.0), 2)
    targets = [torch.zeros_like(t) for t in weights.tensors]
    # after the reader took version 2's first tensor, version 3 is published whole
    dsts = [Dst(targets[0], hook=lambda: weights.publish(_model(3.0), 3))] + [Dst(t) for t in targets[1:]]
    version = weights.load_into(ReaderModel(dsts), timeout_s=2.0)
    assert version == 3 and _values(targets) == {3.0}


def test_a_writer_that_died_mid_copy_makes_the_reader_time_out():
    weights = PublishedWeights(_model(0.0))
    weights.publish(_model(1.0), 1)
    # the learner's last publication, by hand: counter odd, half the tensors copied, then nothing
    weights.header[0] += 1
    weights.tensors[0].fill_(5.0)
    reader_model = _model(0.0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="mid-publication"):
        weights.load_into(reader_model, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5.0
    assert _values(reader_model.state_dict().values()) == {0.0}


class _Mixed(nn.Module):
    """Parameters and buffers of several dtypes and shapes, a scalar and an empty one among them."""

    def __init__(self, n_layers: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(n_layers))
        self.register_buffer("count", torch.tensor(7, dtype=torch.int64))
        self.register_buffer("mean", torch.arange(5, dtype=torch.float64))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("empty", torch.zeros(0, 4))


def test_the_weights_share_one_block_of_memory_and_keep_every_dtype_and_value():
    """Every published tensor is a view into one shared block (one file descriptor for a process it is handed
    to, whatever the model's size), aligned to 64 bytes, with the model's dtypes, shapes and values."""
    model = _Mixed(n_layers=150)  # 304 tensors
    weights = PublishedWeights(model)
    state = model.state_dict()
    assert len(weights.tensors) == len(state) == 304
    assert len({t.untyped_storage().data_ptr() for t in [weights.header, *weights.tensors]}) == 1
    assert weights.tensors[0].untyped_storage().is_shared()
    base = weights.header.data_ptr()
    assert all((t.data_ptr() - base) % 64 == 0 for t in weights.tensors if t.numel())
    for (name, src), dst in zip(state.items(), weights.tensors):
        assert (dst.dtype, dst.shape) == (src.dtype, src.shape) and torch.equal(dst, src), name
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        model.count.fill_(9)
    weights.publish(model, 3)
    fresh = _Mixed(n_layers=150)
    assert weights.load_into(fresh) == 3
    for (name, a), b in zip(fresh.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert PublishedWeights.tensor_bytes(model) == [weights.header.untyped_storage().nbytes()]
