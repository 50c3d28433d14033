"""The camera motion of a generated clip as part of its initial noise.

In the embedded world one key press moves the camera at a speed, turn rate and onset drawn
per press (:mod:`wc_fast.world.motion`): one command has many futures. A small flow model
trained with independent noise averages them and generates nearly the same motion from every
noise, so the G candidates of a group move alike and RL has nothing to select from.

Flow matching stays exact under any coupling of noise and data whose marginals are the standard
normal and the data (rectified flow, minibatch-OT flow matching). This one ties three noise
elements to the three motion factors of the clip: element ``c`` of the first pixel of the
clip's first frame (colour channel ``c``) is set to ``Phi^-1`` of factor ``c``'s position in
its range (uniform there, so the element is still a standard normal, independent of the rest,
and the whole noise still is one). Single elements, not a spread-out direction: near pure
noise their value is read directly by one token, where a per-channel mean of the noise
(1/64 of an element's scale per latent at 32x32x4) drowns in the clean frame's own mean as
soon as sigma drops a little. The model learns that these elements say how fast to move; at
sampling time every candidate's own noise draws its own speed, turn rate and onset, like a
new take of the same command.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_fast.world.motion import ONSET_RANGE, SPEED_RANGE

LATENTS = 3  # speed, turn rate, onset: one colour channel each
FACTOR_RANGES = (SPEED_RANGE, SPEED_RANGE, ONSET_RANGE)


def noise_latents(noise: Tensor) -> Tensor:
    """The three latent elements ``[..., 3]`` of clip noises ``[..., F, C, H, W]``: the first
    pixel of the first frame, channels 0..2."""
    if noise.dim() < 4 or noise.shape[-3] < LATENTS:
        raise ValueError(f"noise must be [..., F, C, H, W] with C >= {LATENTS}, got "
                         f"{tuple(noise.shape)}")
    return noise[..., 0, :LATENTS, 0, 0]


def with_latents(noise: Tensor, latents: Tensor) -> Tensor:
    """``noise`` ``[..., F, C, H, W]`` with its latent elements set to ``latents``
    ``[..., 3]`` (every other element unchanged)."""
    noise_latents(noise)  # shape check
    out = noise.clone()
    out[..., 0, :LATENTS, 0, 0] = latents.to(noise.dtype)
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
