"""msf-plot: TensorBoard scalars read back exactly, resume purge, the PNG, errors."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from msf.plot import DPI, FIGSIZE, main, read_curves


def _writer(exp_dir, **kw):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(os.path.join(str(exp_dir), "tensorboard"), **kw)


def test_read_curves_returns_the_written_steps_and_values(tmp_path):
    exp = tmp_path / "exp"
    w = _writer(exp)
    steps = [0, 128, 256, 1024, 5000]
    for i, s in enumerate(steps):
        w.add_scalar("episode/return_mean", 0.5 * i - 1.0, s)  # exact in float32
        w.add_scalar("perf/fps", 1000.0 + 250 * i, s)
    w.close()

    curves = read_curves(str(exp))
    assert set(curves) == {"episode/return_mean", "perf/fps"}
    ret = curves["episode/return_mean"]
    assert ret.steps.dtype == np.int64 and ret.values.dtype == np.float64 and ret.wall_time.dtype == np.float64
    assert ret.steps.tolist() == steps
    assert ret.values.tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert curves["perf/fps"].values.tolist() == [1000.0, 1250.0, 1500.0, 1750.0, 2000.0]
    # seconds since the experiment's first event: small, non-negative, in writing order
    assert np.all(ret.wall_time >= 0) and np.all(np.diff(ret.wall_time) >= 0) and ret.wall_time[-1] < 60


def test_resumed_run_replaces_events_at_and_after_the_purge_step(tmp_path):
    exp = tmp_path / "exp"
    w = _writer(exp)
    for s in range(0, 1001, 100):
        w.add_scalar("episode/return_mean", float(s), s)
    w.close()
    time.sleep(1.1)  # event file names start with the second they were created: keep them in order
    w = _writer(exp, purge_step=500)
    for s in range(500, 1501, 100):
        w.add_scalar("episode/return_mean", -float(s), s)
    w.close()
    assert len(os.listdir(exp / "tensorboard")) == 2

    c = read_curves(str(exp))["episode/return_mean"]
    assert c.steps.tolist() == list(range(0, 1501, 100))  # strictly increasing, no duplicates
    assert c.values.tolist() == [float(s) for s in range(0, 500, 100)] + [-float(s) for s in range(500, 1501, 100)]
    # the second file's events are at least the sleep later than the first file's
    assert c.wall_time[5] - c.wall_time[4] >= 1.0


def test_main_writes_a_png_with_the_curves(tmp_path, capsys):
    exp = tmp_path / "runs" / "exp"
    w = _writer(exp)
    for i in range(20):
        s = 1000 * i
        w.add_scalar("episode/return_mean", float(i * i), s)
        w.add_scalar("perf/fps", 500.0 + i, s)
        w.add_scalar("perf/fps_rank0", 250.0 + i, s)
        w.add_scalar("perf/fps_rank1", 250.0, s)
        w.add_scalar("policy_lag/mean", 1.5, s)
        w.add_scalar("policy_lag/max", 4.0 + i % 3, s)
    w.close()

    rc = main(["--env=CartPole-v1", "--experiment=exp", f"--train_dir={tmp_path / 'runs'}"])
    assert rc == 0
    out = exp / "curves.png"
    assert capsys.readouterr().out.strip() == f"msf-plot: wrote {out}"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert [f for f in os.listdir(exp) if f.endswith(".tmp")] == []

    from PIL import Image

    with Image.open(out) as im:
        assert im.size == (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI)) == (1200, 800)
        colours = dict((c, n) for n, c in im.convert("RGB").getcolors(maxcolors=1 << 20))
    assert len(colours) > 10  # not a blank canvas
    assert colours.get((31, 119, 180), 0) > 500  # matplotlib's first line colour (C0): the curves are drawn


def test_main_writes_to_output_even_when_panels_have_no_data(tmp_path, capsys):
    exp = tmp_path / "exp"
    w = _writer(exp)
    w.add_scalar("train/loss", 0.25, 0)  # none of the plotted tags
    w.close()
    out = tmp_path / "plots" / "x.png"
    assert main(["--experiment=exp", f"--train_dir={tmp_path}", f"--output={out}"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (exp / "curves.png").exists()


@pytest.mark.parametrize("make_tb_dir", [False, True])
def test_main_on_a_missing_experiment_or_no_events_returns_2(tmp_path, capsys, make_tb_dir):
    if make_tb_dir:
        (tmp_path / "exp" / "tensorboard").mkdir(parents=True)  # folder there, no event files
        missing = os.path.join(str(tmp_path), "exp", "tensorboard")
    else:
        missing = os.path.join(str(tmp_path), "exp")
    assert main(["--experiment=exp", f"--train_dir={tmp_path}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("msf-plot: error: ") and missing in lines[0]
    with pytest.raises(FileNotFoundError, match="exp"):
        read_curves(os.path.join(str(tmp_path), "exp"))
