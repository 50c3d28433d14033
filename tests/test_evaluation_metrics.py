"""Distance-to-truth metrics against hand-computed values on tiny inputs."""

import math

import numpy as np
import pytest
import torch

from wc_fast.measures import (
    frame_frechet,
    frechet_distance,
    pooled_features,
    psnr,
    psnr_clamped,
    ssim,
)
from wc_fast.measures.psnr_ssim import mse


def _frames(seed: int, shape=(2, 3, 3, 16, 16)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_psnr_of_identical_frames_is_infinite_and_clamped_when_averaged():
    a = _frames(0)
    assert torch.isinf(psnr(a, a)).all()
    assert torch.equal(psnr_clamped(a, a), torch.full((2, 3), 100.0, dtype=torch.float64))


def test_psnr_of_a_constant_offset():
    """Every pixel off by 0.1 on a range of 2: MSE 0.01, PSNR 10 log10(4 / 0.01) dB."""
    a = _frames(1)
    assert mse(a, a + 0.1) == pytest.approx(torch.full((2, 3), 0.01, dtype=torch.float64))
    assert psnr(a, a + 0.1) == pytest.approx(torch.full((2, 3), 10 * math.log10(400.0)))


def test_ssim_of_identical_frames_is_one():
    a = _frames(2)
    assert ssim(a, a) == pytest.approx(torch.ones(2, 3, dtype=torch.float64))


def test_ssim_of_two_constant_frames_is_the_luminance_term():
    """No variance: SSIM = (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1), C1 = (0.01 * 2)^2."""
    a = torch.full((1, 3, 12, 12), 0.5)
    b = torch.full((1, 3, 12, 12), -0.5)
    c1 = (0.01 * 2) ** 2
    assert ssim(a, b).item() == pytest.approx((-0.5 + c1) / (0.5 + c1))


def test_ssim_of_a_known_shift_of_white_noise_is_near_zero():
    """Independent pixels against themselves shifted by one pixel share no structure: the
    covariance term, and so SSIM, is near 0 (PSNR that of two independent draws)."""
    a = torch.randn(1, 1, 64, 64, generator=torch.Generator().manual_seed(3)) * 0.3
    shifted = torch.roll(a, 1, dims=-1)
    assert abs(ssim(a, shifted).item()) < 0.1
    assert psnr(a, shifted).item() == pytest.approx(10 * math.log10(4 / (2 * 0.09)), abs=0.3)


def test_metrics_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        psnr(torch.zeros(1, 3, 8, 8), torch.zeros(1, 3, 8, 4))
    with pytest.raises(ValueError, match="one shape"):
        ssim(torch.zeros(1, 3, 8, 8), torch.zeros(3, 8, 8, 1))


def test_pooled_features_average_each_block():
    frame = torch.arange(16.0).reshape(1, 1, 4, 4).expand(1, 3, 4, 4)
    feats = pooled_features(frame, pool=2)
    assert feats.shape == (1, 12)
    assert feats[0, :4].tolist() == [2.5, 4.5, 10.5, 12.5]


def test_frechet_distance_closed_forms():
    """Same set: 0. Shifted by m: |m|^2 (equal covariances). Scaled by 2 about its mean:
    tr(S + 4S - 2 * 2S) = tr(S)."""
    x = torch.randn(400, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-6)
    m = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    assert frechet_distance(x, x + m) == pytest.approx(float(m @ m), rel=1e-6)
    centred = x - x.mean(0)
    trace = float(np.trace(np.cov(centred.numpy(), rowvar=False)))
    assert frechet_distance(centred, 2 * centred) == pytest.approx(trace, rel=1e-6)


def test_frame_frechet_is_zero_for_one_set_and_grows_with_noise():
    frames = _frames(5, (40, 3, 16, 16))
    noisy = frames + 0.5 * _frames(6, (40, 3, 16, 16))
    assert frame_frechet(frames, frames) == pytest.approx(0.0, abs=1e-6)
    assert frame_frechet(frames, noisy) > 0.1
    with pytest.raises(ValueError, match="M >= 2"):
        frechet_distance(torch.zeros(1, 4), torch.zeros(3, 4))
