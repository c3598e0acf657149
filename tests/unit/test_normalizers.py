"""RunningMeanStd: batch-merged statistics equal those of the concatenated data; normalise, invert, clip."""

import pytest
import torch

from msf.model.normalizers import RunningMeanStd


@pytest.mark.parametrize("shape", [(), (3,)])
def test_merged_statistics_equal_concatenated(shape):
    g = torch.Generator().manual_seed(0)
    rms = RunningMeanStd(shape)
    batches = [
        torch.randn(n, *shape, generator=g) * s + m
        for n, s, m in [(1, 1.0, 0.0), (7, 3.0, 2.0), (100, 0.5, -1.0), (3, 10.0, 5.0), (50, 1.0, 0.0)]
    ]
    for x in batches:
        rms.update(x)
    rms.update(torch.zeros(0, *shape))  # an empty batch changes nothing
    data = torch.cat(batches).double()
    assert rms.count.item() == data.shape[0]
    torch.testing.assert_close(rms.mean, data.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(rms.var, data.var(0, unbiased=False), rtol=0, atol=1e-12)


def test_normalize_denormalize_round_trip():
    g = torch.Generator().manual_seed(1)
    rms = RunningMeanStd((3,))
    rms.update(torch.randn(200, 3, generator=g) * torch.tensor([1.0, 4.0, 0.1]) + torch.tensor([0.0, -3.0, 7.0]))
    x = torch.randn(20, 3, generator=g) * torch.tensor([1.0, 4.0, 0.1]) + torch.tensor([0.0, -3.0, 7.0])
    y = rms.normalize(x)
    assert y.dtype == torch.float32 and y.abs().max() < 5.0
    expected = (x.double() - rms.mean) / torch.sqrt(rms.var + 1e-5)
    torch.testing.assert_close(y.double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(rms.denormalize(y), x, rtol=0, atol=1e-5)


def test_clip_at_5():
    rms = RunningMeanStd(())
    rms.update(torch.tensor([-1.0, 1.0]))  # mean 0, var 1
    y = rms.normalize(torch.tensor([100.0, -100.0, 2.0]))
    torch.testing.assert_close(y, torch.tensor([5.0, -5.0, 2.0 / (1 + 1e-5) ** 0.5]))
    unclipped = RunningMeanStd((), clip=None)
    unclipped.update(torch.tensor([-1.0, 1.0]))
    assert unclipped.normalize(torch.tensor([100.0])).item() == pytest.approx(100.0 / (1 + 1e-5) ** 0.5)
