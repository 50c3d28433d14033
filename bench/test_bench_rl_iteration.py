"""One RL iteration at the Wan2.1-1.3B shape: our trainer against a competent batched eager loop.

Run::

    python -m pytest --benchmark-only bench/test_bench_rl_iteration.py \\
        --benchmark-group-by=group

Both contenders train the same randomly initialised Wan2.1-T2V-1.3B-shaped world model and VAE
(:mod:`studies.wan_iteration`'s ``full`` variant: the ``wan`` preset, every weight training,
the NFT update) from the same weights, at clip N (the longest shared history):

- ``ours``: :class:`wc_fast.rl.trainer.Trainer` as the preset configures it;
- ``batched_eager``: :mod:`studies.batched_eager`, what a careful PyTorch user writes without
  this project's kernels: the same loop with all G candidates batched and the old model on the
  device, SDPA over the history copied per candidate, the loss and noising as plain PyTorch,
  no CUDA graph, no compile.

One warm-up iteration each (not timed), then ``ROUNDS`` rounds of one iteration each; the
ratio that counts is ``batched_eager``'s median over ``ours`` (``studies.gpu_targets``).
``extra_info``: each phase's mean seconds and the sizes. On CUDA the full shape (30 blocks)
at ``studies.wan_iteration``'s defaults: 256 px, 4 latent frames per clip, G = 12, 10 sampler
steps, 2 clips. On CPU a reduced size, :data:`CPU_ARGS`: the same block (width 1536, 12
heads, FFN 8960) but 1 of them, 64 px, 2 latent frames per clip, G = 4, 2 sampler steps.
Only one trainer lives at a time (at the full shape each holds tens of GiB).
"""

from __future__ import annotations

import argparse
import contextlib
import gc

import pytest
import torch

from studies.batched_eager import batched_eager_trainer, plain_pytorch_ops
from wc_fast.rl.trainer import Trainer

# the study builds the Wan model from diffusers (not on the GPU image unless its wheel travels)
wan_iteration = pytest.importorskip(
    "studies.wan_iteration", reason="the Wan model needs diffusers (pip install 'wc_fast[wan]')")

ROUNDS = 10  # each round is a whole iteration: seconds on a GPU, tens of seconds on a CPU
CPU_ARGS = ["--layers", "1", "--resolution", "64", "--clip-frames", "2", "--group-size", "4",
            "--steps", "2", "--micro-batch", "4", "--device", "cpu"]
CONTENDERS = ("ours", "batched_eager")


def _args() -> argparse.Namespace:
    """The sizes: the full shape at the study's defaults on CUDA, :data:`CPU_ARGS` on CPU."""
    return wan_iteration.parse_args([] if torch.cuda.is_available() else CPU_ARGS)


def _layers(args: argparse.Namespace) -> int:
    return args.layers or wan_iteration.SHAPES[args.shape]["transformer"]["num_layers"]


@pytest.mark.parametrize("contender", CONTENDERS)
def test_wan_rl_iteration(benchmark, contender):
    args = _args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = wan_iteration.run_config(args, *wan_iteration.VARIANTS["full"])
    model, codec = wan_iteration.build(wan_iteration.with_layers(
        wan_iteration.SHAPES[args.shape], args.layers), cfg, device)
    baseline = contender == "batched_eager"
    # held in a dict so that the finally block can drop the trainer the closure reaches
    held = {"trainer": batched_eager_trainer(cfg, model, device, codec=codec) if baseline
            else Trainer(cfg, model, device, codec=codec)}
    del model, codec
    step, times = cfg.rollout.num_clips - 1, []

    def iteration() -> None:
        clip_n = step + len(times) * cfg.rollout.num_clips
        with plain_pytorch_ops() if baseline else contextlib.nullcontext():
            times.append(held["trainer"].iteration(clip_n).times)

    try:
        iteration()  # warm-up
        benchmark.group = (f"rl-iteration {args.shape} layers={_layers(args)} {device.type} "
                           f"{args.resolution}px F={args.clip_frames} G={args.group_size} "
                           f"steps={args.steps}")
        benchmark.pedantic(iteration, rounds=ROUNDS, iterations=1, warmup_rounds=0)
        timed = times[1:]
        benchmark.extra_info.update(
            phases_s={k: sum(t[k] for t in timed) / len(timed) for k in timed[0]},
            layers=_layers(args), resolution=args.resolution, clip_frames=args.clip_frames,
            group_size=args.group_size, steps=args.steps, num_clips=args.num_clips)
    finally:
        held.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
