"""Distance of generated frames to the ground truth: PSNR and SSIM per frame.

Frames ``[..., C, H, W]`` in [-1, 1] (data range 2). SSIM is Wang et al. (2004) with its usual
constants (``K1 = 0.01``, ``K2 = 0.03``) and Gaussian window (sigma 1.5, 11 taps, over the
valid region, population moments), computed per channel and averaged, as ``torchmetrics``'
``structural_similarity_index_measure`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

DATA_RANGE = 2.0
SSIM_SIGMA = 1.5
SSIM_TAPS = 11
_K1, _K2 = 0.01, 0.03


def _check_pair(a: Tensor, b: Tensor) -> None:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("frames must be tensors")
    if a.shape != b.shape or a.dim() < 3:
        raise ValueError(f"generated and reference frames must be [..., C, H, W] of one shape, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")


def mse(a: Tensor, b: Tensor) -> Tensor:
    """Mean squared error per frame ``[...]`` of frames ``[..., C, H, W]``."""
    _check_pair(a, b)
    return ((a.double() - b.double()) ** 2).mean((-3, -2, -1))


def psnr(a: Tensor, b: Tensor, data_range: float = DATA_RANGE) -> Tensor:
    """PSNR in dB per frame ``[...]``; ``inf`` for identical frames (callers that average
    should clamp, see :func:`psnr_clamped`)."""
    return 10 * torch.log10(data_range**2 / mse(a, b))


def psnr_clamped(a: Tensor, b: Tensor, data_range: float = DATA_RANGE,
                 max_db: float = 100.0) -> Tensor:
    """:func:`psnr` capped at ``max_db``, so that a mean over frames stays finite."""
    return psnr(a, b, data_range).clamp(max=max_db)


def _gaussian_window(taps: int, sigma: float) -> Tensor:
    x = torch.arange(taps, dtype=torch.float64) - (taps - 1) / 2
    g = torch.exp(-x**2 / (2 * sigma**2))
    return g / g.sum()


def ssim(a: Tensor, b: Tensor, data_range: float = DATA_RANGE) -> Tensor:
    """Mean SSIM per frame ``[...]`` of frames ``[..., C, H, W]`` (H, W >= the window)."""
    _check_pair(a, b)
    *lead, c, h, w = a.shape
    taps = min(SSIM_TAPS, h, w)
    g = _gaussian_window(taps, SSIM_SIGMA)
    x = a.double().reshape(-1, 1, h, w)
    y = b.double().reshape(-1, 1, h, w)

    def smooth(t: Tensor) -> Tensor:
        return F.conv2d(F.conv2d(t, g.view(1, 1, 1, -1)), g.view(1, 1, -1, 1))

    mu_x, mu_y = smooth(x), smooth(y)
    var_x = smooth(x * x) - mu_x**2
    var_y = smooth(y * y) - mu_y**2
    cov = smooth(x * y) - mu_x * mu_y
    c1, c2 = (_K1 * data_range) ** 2, (_K2 * data_range) ** 2
    value = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)
             / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)))
    return value.mean((-3, -2, -1)).reshape(*lead, c).mean(-1)
