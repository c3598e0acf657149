"""``msf-plot``: draw the training curves of one experiment into a PNG.

Usage: ``msf-plot --experiment=NAME [--train_dir=DIR] [--output=PATH]`` (also ``python -m msf.plot``; exit codes:
:data:`DESCRIPTION`). ``--env`` is accepted and ignored, so the start of a training command line can be reused.

The curves are the TensorBoard scalars that ``msf-train`` writes (:func:`read_curves`), against env frames. The
figure has four panels: episode return against env frames and against wall time (minutes since the first event of
the experiment), FPS (with the per-rank FPS as thin lines on several ranks), and the policy lag (mean and max, in
policy versions); a panel whose scalars were never written says "no data". The PNG goes to
``TRAIN_DIR/EXPERIMENT/curves.png`` unless ``--output`` says otherwise, and is written atomically, so it can be
refreshed while training runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

FIGSIZE = (12.0, 8.0)  # inches
DPI = 100  # so the PNG is 1200 x 800 pixels

DESCRIPTION = """Draw the training curves of TRAIN_DIR/EXPERIMENT (its TensorBoard scalars) into a PNG:
episode return vs env frames and vs wall time, FPS (total and per rank), policy lag. Exit codes:
0 written, 2 invalid flags, no experiment folder or no TensorBoard scalars."""


@dataclass(eq=False)
class Curve:
    """One scalar tag, in the order the run wrote it (after purging).

    Attributes:
        steps: int64 array of shape (n,), env frames (the ``global_step`` of the events).
        wall_time: float64 array of shape (n,), seconds since the first event of the experiment.
        values: float64 array of shape (n,).
    """

    steps: np.ndarray
    wall_time: np.ndarray
    values: np.ndarray


def _event_files(tb_dir: str) -> list[str]:
    return [f for f in os.listdir(tb_dir) if "tfevents" in f and os.path.isfile(os.path.join(tb_dir, f))]


def read_curves(exp_dir: str) -> dict[str, Curve]:
    """Read every TensorBoard scalar of the experiment in ``exp_dir`` (from ``exp_dir/tensorboard``).

    All event files of the folder are read in order with TensorBoard's ``EventAccumulator``, keeping
    every scalar; when a resumed run opened its writer with a purge step, the events of the earlier
    files at or after that step are dropped.

    Args:
        exp_dir: the experiment folder (``TRAIN_DIR/EXPERIMENT``).

    Returns:
        tag -> Curve (steps in env frames, wall_time in seconds since the experiment's first event).

    Raises:
        FileNotFoundError: ``exp_dir`` or ``exp_dir/tensorboard`` does not exist, holds no event
            files, or the event files hold no scalars; the message names the folder.
    """
    from tensorboard.backend.event_processing import event_accumulator

    if not os.path.isdir(exp_dir):
        raise FileNotFoundError(f"experiment folder {exp_dir} does not exist")
    tb_dir = os.path.join(exp_dir, "tensorboard")
    if not os.path.isdir(tb_dir) or not _event_files(tb_dir):
        raise FileNotFoundError(f"no TensorBoard event files in {tb_dir}")
    acc = event_accumulator.EventAccumulator(
        tb_dir, size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=True
    )
    acc.Reload()
    tags = acc.Tags().get(event_accumulator.SCALARS, [])
    if not tags:
        raise FileNotFoundError(f"no TensorBoard scalars in {tb_dir} (has the run written its first summary?)")
    t0 = acc.FirstEventTimestamp()
    curves = {}
    for tag in tags:
        events = acc.Scalars(tag)
        curves[tag] = Curve(
            steps=np.array([e.step for e in events], dtype=np.int64),
            wall_time=np.array([e.wall_time - t0 for e in events], dtype=np.float64),
            values=np.array([e.value for e in events], dtype=np.float64),
        )
    return curves


def _rank_fps_tags(curves: dict[str, Curve]) -> list[tuple[int, str]]:
    found = []
    for tag in curves:
        m = re.fullmatch(r"perf/fps_rank(\d+)", tag)
        if m:
            found.append((int(m.group(1)), tag))
    return sorted(found)


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no data\n({what})", transform=ax.transAxes, ha="center", va="center", color="gray")


def plot_curves(curves: dict[str, Curve], out_path: str, title: str) -> None:
    """Draw the 2x2 figure of ``curves`` (as returned by ``read_curves``) into the PNG ``out_path``.

    Panels: ``episode/return_mean`` vs env frames; the same vs wall time in minutes; ``perf/fps`` vs
    env frames, with the ``perf/fps_rank{r}`` curves as thin lines when present; ``policy_lag/mean``
    and ``policy_lag/max`` vs env frames. A panel whose tags are missing says "no data". The image is
    ``FIGSIZE`` x ``DPI`` pixels (1200 x 800). It is written to a temporary file in the same folder
    (created if needed) and moved over ``out_path`` with ``os.replace``.

    Raises:
        OSError: the folder of ``out_path`` cannot be created or written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    (ax_ret, ax_ret_t), (ax_fps, ax_lag) = fig.subplots(2, 2)

    ret = curves.get("episode/return_mean")
    ax_ret.set(title="Episode return", xlabel="env frames", ylabel="return (mean)")
    ax_ret_t.set(title="Episode return vs wall time", xlabel="wall time (minutes)", ylabel="return (mean)")
    if ret is not None and len(ret.steps):
        ax_ret.plot(ret.steps, ret.values)
        ax_ret_t.plot(ret.wall_time / 60.0, ret.values)
    else:
        _no_data(ax_ret, "episode/return_mean")
        _no_data(ax_ret_t, "episode/return_mean")

    ax_fps.set(title="Throughput", xlabel="env frames", ylabel="frames per second")
    fps = curves.get("perf/fps")
    ranks = _rank_fps_tags(curves)
    if (fps is not None and len(fps.steps)) or ranks:
        for r, tag in ranks:
            ax_fps.plot(curves[tag].steps, curves[tag].values, linewidth=0.7, alpha=0.7, label=f"rank {r}")
        if fps is not None and len(fps.steps):
            ax_fps.plot(fps.steps, fps.values, color="black", linewidth=1.5, label="total")
        if ranks:
            ax_fps.legend(fontsize="small")
    else:
        _no_data(ax_fps, "perf/fps")

    ax_lag.set(title="Policy lag", xlabel="env frames", ylabel="policy versions")
    drawn = False
    for tag, label in (("policy_lag/mean", "mean"), ("policy_lag/max", "max")):
        c = curves.get(tag)
        if c is not None and len(c.steps):
            ax_lag.plot(c.steps, c.values, label=label)
            drawn = True
    if drawn:
        ax_lag.legend(fontsize="small")
    else:
        _no_data(ax_lag, "policy_lag/mean, policy_lag/max")

    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{os.path.basename(out_path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            fig.savefig(f, format="png", dpi=DPI)
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, read the experiment's scalars, write the PNG; return the exit code.

    0: written (``msf-plot: wrote PATH`` on stdout). 2: no experiment folder or no TensorBoard
    scalars (one ``msf-plot: error: ...`` line on stderr naming the folder); invalid flags exit with
    status 2 through argparse.
    """
    parser = argparse.ArgumentParser(prog="msf-plot", description=DESCRIPTION)
    parser.add_argument("--experiment", required=True, help="experiment name (folder under --train_dir)")
    parser.add_argument("--train_dir", default="./train_dir", help="root folder of experiments (default: %(default)s)")
    parser.add_argument("--output", default=None, help="PNG to write (default: TRAIN_DIR/EXPERIMENT/curves.png)")
    parser.add_argument("--env", default=None, help="ignored (accepted so a training command line can be reused)")
    args = parser.parse_args(argv)

    exp_dir = os.path.join(args.train_dir, args.experiment)
    out_path = args.output or os.path.join(exp_dir, "curves.png")
    # a resume's purge is expected; TensorBoard would log it as a "TensorFlow restart" warning
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    try:
        curves = read_curves(exp_dir)
    except FileNotFoundError as e:
        print(f"msf-plot: error: {e}", file=sys.stderr)
        return 2
    plot_curves(curves, out_path, title=args.experiment)
    print(f"msf-plot: wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
