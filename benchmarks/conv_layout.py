"""The convolutional encoders' forward + backward in torch's two memory layouts, on this machine's CPU.

For each pixel workload of ``families.py`` (its flags, so the same network): the conv stack of msf's encoder
on a minibatch of random frames, forward and backward, in the default NCHW layout and in channels_last
(NHWC, which oneDNN's CPU convolutions prefer). The frames are made NCHW here; msf's own Doom frames
arrive HWC and so are NHWC in memory already, and since 2026-11-30 its learner hands the stack a
channels_last copy on CPU (``ConvEncoder.forward``). Prints milliseconds per pass and the ratio, measured
in this run.

Usage: python benchmarks/conv_layout.py [--threads 2] [--reps 8]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from families import PIXEL, WORKLOADS


def conv_stack(flags: list[str]) -> tuple[torch.nn.Module, tuple[int, ...]]:
    """The first ``nn.Sequential`` of the policy that holds a ``Conv2d`` (the encoder's conv stack), and the
    shape of one frame as that stack takes it (channels first)."""
    from msf.cfg.arguments import parse_args
    from msf.envs.families import apply_family_defaults
    from msf.envs.registry import env_config_of, env_spaces
    from msf.model.actor_critic import ActorCritic

    cfg, given = parse_args([*flags, "--device=cpu"])
    cfg = apply_family_defaults(cfg, given)
    spaces = env_spaces(cfg.env, env_config_of(cfg))
    model = ActorCritic(cfg, spaces)
    seq = next(
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Sequential) and any(isinstance(c, torch.nn.Conv2d) for c in m.children())
    )
    first = next(c for c in seq.modules() if isinstance(c, torch.nn.Conv2d))
    shape = spaces.obs_shape
    chw = shape if shape[0] == first.in_channels else (shape[-1], *shape[:-1])
    return seq, chw


def ms_per_pass(seq: torch.nn.Module, x: torch.Tensor, reps: int) -> float:
    for _ in range(2):
        seq(x).sum().backward()
    t0 = time.perf_counter()
    for _ in range(reps):
        seq(x).sum().backward()
    return 1000 * (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--reps", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads\n")
    print("| workload | minibatch | NCHW ms | channels_last ms | NCHW / channels_last |\n|---|---|---|---|---|")
    for name in PIXEL:  # the conv workloads (the MuJoCo ones are MLPs)
        flags = WORKLOADS[name]
        batch = int(next(f for f in flags if f.startswith("--batch_size=")).split("=")[1])
        seq, chw = conv_stack(flags)
        x = torch.rand(batch, *chw, generator=torch.Generator().manual_seed(0))
        nchw = ms_per_pass(seq, x, a.reps)
        nhwc = ms_per_pass(
            seq.to(memory_format=torch.channels_last),  # type: ignore[call-overload]  # Module.to takes it
            x.contiguous(memory_format=torch.channels_last),
            a.reps,
        )
        print(
            f"| {name} | {batch} x {'x'.join(map(str, chw))} | {nchw:.0f} | {nhwc:.0f} | {nchw / nhwc:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
