"""Fréchet distance between two sets of frames on features no evaluated model was tuned against.

The features are the frame's pixels average-pooled to :data:`POOL` x :data:`POOL` per channel
(48 numbers at 4x4): no network, so no compared model, reward or critic was fitted to them. The
distance is the usual one between Gaussians fitted to the two feature sets,
``|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))``. A distance between two finite samples
is positive even for one distribution; the evaluation reports it beside the same distance
between two independent samples of true renders (the floor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

POOL = 4


def pooled_features(frames: Tensor, pool: int = POOL) -> Tensor:
    """Frames ``[..., C, H, W]`` -> features ``[M, C * pool * pool]`` float64 (one row per
    frame; H and W divisible by ``pool``)."""
    if frames.dim() < 3 or frames.shape[-1] % pool or frames.shape[-2] % pool:
        raise ValueError(f"frames must be [..., C, H, W] with H and W divisible by {pool}, got "
                         f"{tuple(frames.shape)}")
    flat = frames.reshape(-1, *frames.shape[-3:]).double()
    return F.adaptive_avg_pool2d(flat, pool).flatten(1)


def frechet_distance(a: Tensor, b: Tensor) -> float:
    """Fréchet distance between Gaussians fitted to features ``a`` ``[Ma, D]`` and ``b``
    ``[Mb, D]`` (each at least 2 rows)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(f"features must be [M, D] with M >= 2 and one D, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    x, y = a.double(), b.double()
    mu = x.mean(0) - y.mean(0)
    cov_x = torch.cov(x.T).reshape(x.shape[1], -1)  # [D, D] also for D = 1
    cov_y = torch.cov(y.T).reshape(y.shape[1], -1)
    # tr((S_x S_y)^(1/2)) = sum of the square roots of the eigenvalues of the symmetric
    # S_x^(1/2) S_y S_x^(1/2), which has the same spectrum
    values, vectors = torch.linalg.eigh(cov_x)
    root_x = vectors @ torch.diag(values.clamp_min(0).sqrt()) @ vectors.T
    cross = torch.linalg.eigvalsh(root_x @ cov_y @ root_x).clamp_min(0).sqrt().sum()
    value = mu @ mu + cov_x.trace() + cov_y.trace() - 2 * cross
    return float(value.clamp_min(0.0))


def frame_frechet(generated: Tensor, reference: Tensor, pool: int = POOL) -> float:
    """:func:`frechet_distance` of two frame sets ``[..., C, H, W]`` on pooled pixels."""
    return frechet_distance(pooled_features(generated, pool), pooled_features(reference, pool))
