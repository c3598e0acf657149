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
