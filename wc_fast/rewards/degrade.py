"""Frame degradations that the embedded critic learns to rank below clean renders.

Frames are ``[B, 3, H, W]`` in [-1, 1]. The kinds, with the strength ranges used for training
and for the acceptance check (:data:`STRENGTHS`):

- ``blur``: Gaussian blur, sigma in pixels;
- ``noise``: additive Gaussian noise, standard deviation in [-1, 1] units;
- ``color``: a global colour shift, per-channel gain and offset of the given magnitude;
- ``ghost``: a blend with another frame of the same moving clip, blend weight of the other;
- ``smear``: the average of several consecutive frames of a moving clip (frame count).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from wc_fast.infra.runtime import uniform

KINDS = ("blur", "noise", "color", "ghost", "smear")
STRENGTHS = {"blur": (0.6, 1.5), "noise": (0.03, 0.15), "color": (0.1, 0.25),
             "ghost": (0.3, 0.5), "smear": (3, 5)}


def gaussian_blur(x: Tensor, sigma: Tensor) -> Tensor:
    """Blur each frame of ``x`` ``[B, C, H, W]`` with its own ``sigma`` ``[B]`` (pixels)."""
    b, c, h, w = x.shape
    radius = max(1, int(torch.ceil(3 * sigma.max()).item()))
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (offsets / sigma[:, None].to(x.dtype)) ** 2)
    kernel = (kernel / kernel.sum(-1, keepdim=True)).repeat_interleave(c, 0)  # [B*C, K]
    flat = x.reshape(1, b * c, h, w)
    flat = F.conv2d(F.pad(flat, (radius, radius, 0, 0), mode="replicate"),
                    kernel[:, None, None, :], groups=b * c)
    flat = F.conv2d(F.pad(flat, (0, 0, radius, radius), mode="replicate"),
                    kernel[:, None, :, None], groups=b * c)
    return flat.reshape(b, c, h, w)


def add_noise(x: Tensor, std: Tensor, gen: torch.Generator) -> Tensor:
    """``x`` plus Gaussian noise of per-frame ``std`` ``[B]``, clipped to [-1, 1]."""
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    return (x + noise * std[:, None, None, None]).clamp(-1.0, 1.0)


def color_shift(x: Tensor, magnitude: Tensor, gen: torch.Generator) -> Tensor:
    """A random per-channel gain and offset of size ``magnitude`` ``[B]``, clipped to [-1, 1].

    Gain ``1 + m*g`` and offset ``m*o`` (in [0, 1] colour units) with ``(g, o)`` a random
    direction whose largest component is 1, so every shift has the stated size.
    """
    direction = torch.rand((x.shape[0], 6), generator=gen) * 2 - 1
    direction = direction / direction.abs().amax(-1, keepdim=True)
    m = magnitude[:, None]
    gain = (1 + m * direction[:, :3])[..., None, None]
    offset = (m * direction[:, 3:])[..., None, None]
    colour = (x + 1) / 2
    return ((colour * gain + offset) * 2 - 1).clamp(-1.0, 1.0)


def ghost(x: Tensor, other: Tensor, weight: Tensor) -> Tensor:
    """``(1 - weight) * x + weight * other`` with per-frame ``weight`` ``[B]``."""
    return torch.lerp(x, other, weight[:, None, None, None])


def degraded_pairs(frames: Tensor, kind: str, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Clean frames and their degraded versions from moving clips.

    ``frames`` ``[B, T, 3, H, W]`` with ``T >= 5`` (a new action every frame) -> (clean, degraded)
    ``[B, 3, H, W]`` each. For ``ghost`` and ``smear`` the other frames come from the same clip,
    at least two steps apart (ghost) or a window centred on the clean frame (smear).
    """
    b, t = frames.shape[:2]
    if t < 5:
        raise ValueError(f"degraded_pairs needs clips of at least 5 frames, got {t}")
    lo, hi = STRENGTHS[kind]
    rows = torch.arange(b)
    if kind == "smear":
        count = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        first = int(torch.randint(0, t - count + 1, (1,), generator=gen))
        window = frames[:, first:first + count]
        return window[:, count // 2], window.mean(1)
    index = torch.randint(0, t, (b,), generator=gen)
    clean = frames[rows, index]
    strength = uniform(gen, (b,), lo, hi)
    if kind == "blur":
        return clean, gaussian_blur(clean, strength)
    if kind == "noise":
        return clean, add_noise(clean, strength, gen)
    if kind == "color":
        return clean, color_shift(clean, strength, gen)
    if kind == "ghost":
        # Another frame 2..T-1 steps away (wrapping around the clip).
        step = torch.randint(2, t - 1, (b,), generator=gen)
        return clean, ghost(clean, frames[rows, (index + step) % t], strength)
    raise ValueError(f"unknown degradation {kind!r}; expected one of {KINDS}")
