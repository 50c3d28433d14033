"""The ``flow_noise`` reference (the spec) against hand computations, and the public op's
argument checks."""

import pytest
import torch

import wc_kernels


def test_flow_noise_row_order():
    x0 = torch.tensor([[1.0], [2.0]])
    sigmas = torch.tensor([[0.0, 0.5, 1.0], [0.25, 0.75, 1.0]])
    noise = torch.arange(6.0).reshape(6, 1) * 10
    x_t, v = wc_kernels.flow_noise(x0, sigmas, noise, backend="reference")
    want_xt = [1.0, 0.5 * 1 + 0.5 * 10, 20.0, 0.75 * 2 + 0.25 * 30, 0.25 * 2 + 0.75 * 40, 50.0]
    assert x_t[:, 0].tolist() == pytest.approx(want_xt)
    assert v[:, 0].tolist() == pytest.approx([-1.0, 9.0, 19.0, 28.0, 38.0, 48.0])


def test_flow_noise_generates_noise_from_a_generator():
    x0 = torch.randn(2, 3, 4)
    sigmas = torch.rand(2, 5)
    a = wc_kernels.flow_noise(x0, sigmas, generator=torch.Generator().manual_seed(1))
    b = wc_kernels.flow_noise(x0, sigmas, generator=torch.Generator().manual_seed(1))
    assert a[0].shape == (10, 3, 4)
    torch.testing.assert_close(a, b)
    eps = a[1] + x0.repeat_interleave(5, 0)
    torch.testing.assert_close(a[0], (1 - sigmas.reshape(10, 1, 1)) * x0.repeat_interleave(5, 0)
                               + sigmas.reshape(10, 1, 1) * eps)


def test_flow_noise_bad_inputs():
    x0 = torch.randn(2, 3)
    with pytest.raises(ValueError, match=r"sigmas must have shape \[S, K\]"):
        wc_kernels.flow_noise(x0, torch.rand(3, 2))
    with pytest.raises(ValueError, match="sigmas must lie"):
        wc_kernels.flow_noise(x0, torch.full((2, 2), 1.5))
    with pytest.raises(ValueError, match="noise must have shape"):
        wc_kernels.flow_noise(x0, torch.rand(2, 2), torch.randn(2, 3))
    with pytest.raises(TypeError, match="noise must have the dtype"):
        wc_kernels.flow_noise(x0, torch.rand(2, 2), torch.randn(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="non-empty"):
        wc_kernels.flow_noise(x0, torch.rand(2, 0))


def test_value_checks_can_be_skipped_by_validated_callers():
    x_t, _ = wc_kernels.flow_noise(torch.randn(2, 3), torch.full((2, 2), 1.5), check_values=False,
                                   backend="reference")
    assert x_t.shape == (4, 3)
