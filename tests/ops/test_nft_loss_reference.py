"""The ``nft_loss`` reference (the spec) against hand computations and an independent closed
form, and the public op's argument checks."""

import numpy as np
import pytest
import torch

import wc_kernels


def _hand_example():
    v_theta = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    v_old = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    v_target = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    r = torch.tensor([0.75], dtype=torch.float64)
    return v_theta, v_old, v_target, r


def test_velocity_loss_hand_computed():
    # v+ = [1, 2], v- = [-1, 0]; L = .75 * mean([0, 1]) + .25 * mean([4, 1]) = 1.0
    v_theta, v_old, v_target, r = _hand_example()
    loss = wc_kernels.nft_loss(v_theta, v_old, v_target, r, backend="reference")
    loss.backward()
    assert loss.item() == pytest.approx(1.0, abs=1e-15)
    torch.testing.assert_close(v_theta.grad, torch.tensor([[0.5, 1.0]], dtype=torch.float64))


def test_x0_loss_hand_computed():
    # sigma .5: e+ = [0, -.5], w+ = .25, L+ = .5; e- = [1, .5], w- = .75, L- = 5/6
    v_theta, v_old, v_target, r = _hand_example()
    sigma = torch.tensor([0.5], dtype=torch.float64)
    loss = wc_kernels.nft_loss(v_theta, v_old, v_target, r, sigma=sigma, space="x0",
                            backend="reference")
    loss.backward()
    assert loss.item() == pytest.approx(0.75 * 0.5 + 0.25 * 5 / 6, abs=1e-15)
    torch.testing.assert_close(v_theta.grad, torch.tensor([[1 / 6, 0.75 + 1 / 12]],
                                                          dtype=torch.float64))


def _closed_form(vt, vo, vs, r, beta, sigma, space):
    """Per-sample loss and dL_i/dv_theta in float64 numpy, derived by hand."""
    d = vt.shape[1]
    vp = (1 - beta) * vo + beta * vt
    vn = (1 + beta) * vo - beta * vt
    r = r[:, None]
    if space == "velocity":
        loss = r[:, 0] * ((vp - vs) ** 2).mean(1) + (1 - r[:, 0]) * ((vn - vs) ** 2).mean(1)
        grad = 2 * beta / d * (r * (vp - vs) - (1 - r) * (vn - vs))
        return loss, grad
    s = sigma[:, None]
    ep, en = -s * (vp - vs), -s * (vn - vs)
    wp = np.maximum(np.abs(ep).mean(1, keepdims=True), 1e-5)
    wn = np.maximum(np.abs(en).mean(1, keepdims=True), 1e-5)
    loss = r[:, 0] * (ep**2).mean(1) / wp[:, 0] + (1 - r[:, 0]) * (en**2).mean(1) / wn[:, 0]
    grad = 2 / d * (r * ep * (-s * beta) / wp + (1 - r) * en * (s * beta) / wn)
    return loss, grad


@pytest.mark.parametrize("space", ["velocity", "x0"])
@pytest.mark.parametrize("beta", [1.0, 0.5])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 2, 3, 4)])
def test_reference_matches_closed_form(space, beta, shape):
    g = torch.Generator().manual_seed(sum(shape))
    vt, vo, vs = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    r = torch.rand(shape[0], generator=g, dtype=torch.float64)
    r[0] = 0.0 if shape[0] == 1 else r[0]
    sigma = torch.rand(shape[0], generator=g, dtype=torch.float64)
    vt.requires_grad_(True)
    loss = wc_kernels.nft_loss(vt, vo, vs, r, beta=beta, sigma=sigma, space=space,
                            reduction="none", backend="reference")
    weights = torch.rand(shape[0], generator=g, dtype=torch.float64)
    (loss * weights).sum().backward()
    flat = [t.detach().reshape(shape[0], -1).numpy() for t in (vt, vo, vs)]
    want_loss, want_grad = _closed_form(*flat, r.numpy(), beta, sigma.numpy(), space)
    np.testing.assert_allclose(loss.detach().numpy(), want_loss, rtol=1e-12)
    np.testing.assert_allclose(vt.grad.reshape(shape[0], -1).numpy(),
                               want_grad * weights.numpy()[:, None], rtol=1e-10, atol=1e-14)


def test_reductions_and_dtypes():
    vt, vo, vs = (torch.randn(4, 10, dtype=torch.float16) for _ in range(3))
    r = torch.rand(4)
    per = wc_kernels.nft_loss(vt, vo, vs, r, reduction="none", backend="reference")
    assert per.shape == (4,) and per.dtype == torch.float32
    mean = wc_kernels.nft_loss(vt, vo, vs, r, backend="reference")
    total = wc_kernels.nft_loss(vt, vo, vs, r, reduction="sum", backend="reference")
    torch.testing.assert_close(mean, per.mean())
    torch.testing.assert_close(total, per.sum())


def test_only_v_theta_gets_a_gradient():
    vt, vo, vs = (torch.randn(2, 5, requires_grad=True) for _ in range(3))
    r = torch.rand(2, requires_grad=True)
    sigma = torch.rand(2, requires_grad=True)
    wc_kernels.nft_loss(vt, vo, vs, r, sigma=sigma, space="x0", backend="reference").backward()
    assert vt.grad is not None
    assert vo.grad is None and vs.grad is None and r.grad is None and sigma.grad is None


def test_nft_loss_gradcheck_velocity():
    """Finite differences apply in velocity space only: x0 space stops the gradient of w."""
    vt = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    vo, vs = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    r = torch.tensor([0.0, 0.4, 1.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda v: wc_kernels.nft_loss(v, vo, vs, r, beta=0.5, backend="reference"), (vt,))


def _nft_args(**over):
    args = {"v_theta": torch.randn(2, 3), "v_old": torch.randn(2, 3),
            "v_target": torch.randn(2, 3), "r": torch.rand(2)}
    args.update(over)
    return args


@pytest.mark.parametrize("over,err,match", [
    ({"v_old": torch.randn(2, 4)}, ValueError, "v_old must have the shape"),
    ({"v_target": torch.randn(2, 3, dtype=torch.float64)}, TypeError, "v_target must have the"),
    ({"v_old": torch.randn(2, 3, device="meta")}, ValueError, "v_old is on meta"),
    ({"v_theta": torch.ones(2, 3, dtype=torch.long)}, TypeError, "v_theta must have dtype"),
    ({"r": torch.rand(3)}, ValueError, r"r must have shape \(2,\)"),
    ({"r": torch.tensor([0.5, 1.5])}, ValueError, r"r must lie in \[0.0, 1.0\]"),
    ({"r": torch.tensor([0.5, float("nan")])}, ValueError, "r must be finite"),
    ({"r": torch.tensor([0.5, float("inf")])}, ValueError, "r must be finite"),
    ({"v_theta": [1.0, 2.0]}, TypeError, "v_theta must be a torch.Tensor"),
])
def test_nft_loss_bad_inputs(over, err, match):
    with pytest.raises(err, match=match):
        wc_kernels.nft_loss(**_nft_args(**over), backend="reference")


def test_nft_loss_bad_options():
    with pytest.raises(ValueError, match="sigma"):
        wc_kernels.nft_loss(**_nft_args(), space="x0")
    with pytest.raises(ValueError, match="space"):
        wc_kernels.nft_loss(**_nft_args(), space="eps")
    with pytest.raises(ValueError, match="reduction"):
        wc_kernels.nft_loss(**_nft_args(), reduction="max")
    with pytest.raises(TypeError, match="beta"):
        wc_kernels.nft_loss(**_nft_args(), beta=float("nan"))
    with pytest.raises(ValueError, match="backend must be one of"):
        wc_kernels.nft_loss(**_nft_args(), backend="cuda")
    with pytest.raises(ValueError, match="sigma must have shape"):
        wc_kernels.nft_loss(**_nft_args(), space="x0", sigma=torch.rand(3))
    with pytest.raises(ValueError, match="non-empty"):
        wc_kernels.nft_loss(torch.empty(0, 3), torch.empty(0, 3), torch.empty(0, 3), torch.rand(0))


def test_value_checks_can_be_skipped_by_validated_callers():
    args = _nft_args(r=torch.tensor([0.5, 1.5]))
    loss = wc_kernels.nft_loss(**args, backend="reference", check_values=False)
    assert torch.isfinite(loss)
