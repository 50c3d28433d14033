"""Noise-warped initial noise: the commanded camera motion written into a clip's noise.

World-R1 conditions its video model on the camera by warping the initial noise along the
camera's optical flow, after Go-with-the-Flow (Burgert et al., 2025): each frame's noise is
the previous frame's noise moved the way the image moves, so the noise already carries the
motion the clip should show, while every element stays a standard normal (the sampler's
starting distribution is unchanged element by element).

The rule here (docs/design.md section 4.2), for strength ``a`` in [0, 1] and frames
``f = 2..F`` of a clip's noise ``n`` (frame 1 is left as drawn, with the motion latents of
:mod:`wc_fast.models.motion_latent` in it):

    out[f] = sqrt(1 - a^2) n[f] + a out[f-1][src(p)]   where src(p) lies in the image,
    out[f] = n[f]                                      elsewhere.

``src(p)`` is the nearest pixel of the previous frame that pixel ``p`` saw, through the
commanded camera motion of frame ``f`` (:func:`source_pixels`). A nearest-pixel gather copies
one element, so by induction on ``f`` each ``out[f-1][src(p)]`` is a standard normal; it depends
on frames ``1..f-1`` of ``n`` only, so it is independent of ``n[f]``, and the mix has variance
``(1 - a^2) + a^2 = 1`` and mean 0. A bilinear gather would average neighbours and shrink the
variance.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_fast.world.motion import (
    ROTATION_STEP_DEG,
    SPEED_RANGE,
    TRANSLATION_STEP,
    action_components,
    rot_x,
    rot_y,
)
from wc_fast.world.render import DEFAULT_FOV_DEG, focal_length

# the embedded world's speed and turn rate are drawn per key press in SPEED_RANGE; the flow
# uses the middle of that range
NOMINAL_SPEED = sum(SPEED_RANGE) / 2
# translation moves the image as a plane this far in front of the camera would (the rooms of
# wc_fast.world.scene are 9 to 13 units across)
NOMINAL_DEPTH = 5.0


def frame_motion(actions: Tensor) -> tuple[Tensor, Tensor]:
    """The camera motion each action id ``[...]`` commands for one frame at the nominal speed:
    rotation ``[..., 3, 3]`` and translation ``[..., 3]`` (float64, OpenCV camera frame; the
    new camera is ``c2w_prev @ [R | t]``, :mod:`wc_fast.world.motion`)."""
    t, angles = action_components(actions, translation_step=TRANSLATION_STEP * NOMINAL_SPEED,
                                  rotation_step_deg=ROTATION_STEP_DEG * NOMINAL_SPEED)
    return rot_y(angles[..., 0]) @ rot_x(angles[..., 1]), t


def source_pixels(actions: Tensor, resolution: int, *, fov_deg: float = DEFAULT_FOV_DEG,
                  depth: float = NOMINAL_DEPTH) -> Tensor:
    """Where each pixel of a frame was in the previous frame, for the camera motion of each
    action id ``[...]``: ``[..., H, W, 2]`` float64 (column, row; pixel centres are integers).

    Pixel ``p`` of the new frame sees the point at ``depth`` along its ray; in the previous
    camera that point is ``R P + t``, projected with the renderer's pinhole
    (:func:`wc_fast.world.render.camera_rays`). Yaw and pitch shift the image sideways and
    up or down (exactly, whatever the depth), forward and backward zoom it about the centre,
    sideways steps shift it by ``f t / depth``.
    """
    rot, t = frame_motion(actions)
    f = focal_length(resolution, fov_deg)
    coord = (torch.arange(resolution, dtype=torch.float64, device=actions.device) + 0.5
             - resolution / 2) / f
    y, x = torch.meshgrid(coord, coord, indexing="ij")
    point = depth * torch.stack([x, y, torch.ones_like(x)], -1)  # [H, W, 3]
    seen = torch.einsum("...ij,hwj->...hwi", rot, point) + t[..., None, None, :]
    return seen[..., :2] / seen[..., 2:] * f + resolution / 2 - 0.5


def gather_previous(previous: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
    """The previous frame's noise ``[G, C, H, W]`` read at the nearest pixel to ``src``
    ``[G, H, W, 2]``, and ``[G, 1, H, W]`` whether that pixel lies in the image (the gathered
    value is meaningless where it does not)."""
    g, c, h, w = previous.shape
    col, row = src.round().long().unbind(-1)
    inside = (col >= 0) & (col < w) & (row >= 0) & (row < h)
    index = (row.clamp(0, h - 1) * w + col.clamp(0, w - 1)).flatten(1)  # [G, H*W]
    gathered = previous.flatten(2).gather(2, index[:, None].expand(g, c, -1))
    return gathered.view(g, c, h, w), inside[:, None]


def warp_noise(noise: Tensor, actions: Tensor, strength: float) -> Tensor:
    """Noise-warped copy of clip noises ``[G, F, C, H, W]`` for the per-frame action ids
    ``actions`` ``[F]`` (shared) or ``[G, F]``; the rule of this module at strength ``a``.

    Frame 1 is returned exactly as given; no random number is drawn.
    """
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must lie in [0, 1], got {strength!r}")
    g, frames, _, h, w = noise.shape
    if h != w:
        raise ValueError(f"noise warping needs square frames, got {h}x{w}")
    src = source_pixels(actions, h).expand(g, frames, h, w, 2)
    keep = math.sqrt(1.0 - strength**2)
    out = [noise[:, 0]]
    for i in range(1, frames):
        warped, inside = gather_previous(out[-1], src[:, i])
        out.append(torch.where(inside, keep * noise[:, i] + strength * warped, noise[:, i]))
    return torch.stack(out, dim=1)
