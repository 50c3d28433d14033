"""The floor of a distance to the truth: true renders of another valid future.

The world draws each key press's speed, turn rate and onset (:mod:`wc_fast.world.motion`), so
one command from one prompt has many true futures. A model that followed every command
perfectly, but at other speeds than the ones drawn, would still differ from the true render;
rendering the same scenes and commands with freshly drawn speeds measures that difference, the
floor beside each PSNR, SSIM and Fréchet distance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wc_fast.infra.runtime import uniform
from wc_fast.world import render, sequence_scenes
from wc_fast.world.motion import (
    ONSET_RANGE,
    ROTATION_STEP_DEG,
    SPEED_RANGE,
    TRANSLATION_STEP,
    action_deltas,
    chain,
)


def draw_motion_factors(n: int, segments: int, seed: int) -> Tensor:
    """``[n, S, 3]`` float64 (speed, turn rate, onset) of every key press, drawn uniformly in
    the world's ranges from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    ranges = (SPEED_RANGE, SPEED_RANGE, ONSET_RANGE)
    return torch.stack([uniform(gen, (n, segments), *r, dtype=torch.float64) for r in ranges], -1)


def render_sequences(data_seed: int, actions: Tensor, motion_factors: Tensor, *,
                     segment_frames: int, resolution: int) -> Tensor:
    """Frames ``[n, 1 + K, 3, R, R]`` of the scenes and start poses that
    :func:`wc_fast.world.sample_sequences` draws from ``data_seed`` (it draws them first, in
    that order), moved by ``actions`` ``[n, K]`` with per-press ``motion_factors``
    ``[n, K / segment_frames, 3]``."""
    n, frames = actions.shape
    if motion_factors.shape != (n, frames // segment_frames, 3) or frames % segment_frames:
        raise ValueError(f"motion_factors must be [n, K / segment_frames, 3] = "
                         f"[{n}, {frames // segment_frames}, 3], got "
                         f"{tuple(motion_factors.shape)}")
    scenes, start = sequence_scenes(data_seed, n)
    per_frame = motion_factors.double().repeat_interleave(segment_frames, 1)  # [n, K, 3]
    first = (torch.arange(frames) % segment_frames == 0).double()
    ramp = 1 + first * (per_frame[..., 2] - 1)
    deltas = action_deltas(actions, translation_step=TRANSLATION_STEP * per_frame[..., 0] * ramp,
                           rotation_step_deg=ROTATION_STEP_DEG * per_frame[..., 1] * ramp)
    return render(scenes, chain(start, deltas), resolution=resolution)
