"""The camera motion of a generated clip as part of its initial noise.

In the embedded world one key press moves the camera at a speed, turn rate and onset drawn
per press (:mod:`wc_fast.world.motion`): one command has many futures. A small flow model
trained with independent noise averages them and generates nearly the same motion from every
noise, so the G candidates of a group move alike and RL has nothing to select from.

Flow matching stays exact under any coupling of noise and data whose marginals are the standard
normal and the data (rectified flow, minibatch-OT flow matching). This one ties three fixed
directions of the noise to the three motion factors of the clip: the projection of a clip's
noise ``[F, C, H, W]`` on ``d_c`` (constant over channel ``c``, unit norm) is set to
``Phi^-1`` of factor ``c``'s position in its range (uniform there, so the projection is still
a standard normal and the whole noise still is one). The model learns that these projections
say how fast to move; at sampling time every candidate's own noise draws its own speed, turn
rate and onset, like a new take of the same command.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_fast.world.motion import ONSET_RANGE, SPEED_RANGE

LATENTS = 3  # speed, turn rate, onset: one per colour channel's direction
FACTOR_RANGES = (SPEED_RANGE, SPEED_RANGE, ONSET_RANGE)


def noise_latents(noise: Tensor) -> Tensor:
    """Projections ``[..., 3]`` of clip noises ``[..., F, C, H, W]`` on the first three
    channel directions (standard normal for standard-normal noise)."""
    if noise.dim() < 4 or noise.shape[-3] < LATENTS:
        raise ValueError(f"noise must be [..., F, C, H, W] with C >= {LATENTS}, got "
                         f"{tuple(noise.shape)}")
    per_channel = noise.shape[-4] * noise.shape[-2] * noise.shape[-1]
    sums = noise[..., :LATENTS, :, :].sum(dim=(-4, -2, -1))
    return sums / math.sqrt(per_channel)


def with_latents(noise: Tensor, latents: Tensor) -> Tensor:
    """``noise`` ``[..., F, C, H, W]`` with its projections set to ``latents`` ``[..., 3]``
    (the orthogonal rest unchanged)."""
    per_channel = noise.shape[-4] * noise.shape[-2] * noise.shape[-1]
    shift = (latents.to(noise.dtype) - noise_latents(noise)) / math.sqrt(per_channel)
    out = noise.clone()
    out[..., :LATENTS, :, :] += shift[..., None, :, None, None]
    return out


def factor_latents(factors: Tensor) -> Tensor:
    """Motion factors ``[..., 3]`` (speed, turn rate, onset, each uniform in its range of
    :data:`FACTOR_RANGES`) -> standard-normal latents ``[..., 3]``."""
    lo = factors.new_tensor([r[0] for r in FACTOR_RANGES])
    hi = factors.new_tensor([r[1] for r in FACTOR_RANGES])
    if bool((hi <= lo).any()):
        raise ValueError(f"motion latents need factor ranges of positive width, got "
                         f"{FACTOR_RANGES}")
    u = ((factors - lo) / (hi - lo)).clamp(1e-4, 1 - 1e-4)
    return math.sqrt(2.0) * torch.erfinv(2 * u - 1)
