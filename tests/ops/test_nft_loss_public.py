"""The public ``nft_loss``: every reduction and ``scale`` against a float64 reference, and the
backward that skips its pass when the forward already applied the upstream gradient."""

import pytest
import torch

from wc_kernels import _backend, nft_loss, reference

BACKENDS = ["reference", "triton"] + (["native"] if _backend.native_built() else [])
FUSED = [b for b in BACKENDS if b != "reference"]


def _inputs(b=3, d=37, space="velocity"):
    g = torch.Generator().manual_seed(7)
    vt, vo, vs = (torch.randn(b, d, 2, generator=g) for _ in range(3))
    r, sigma = torch.rand(b, generator=g), torch.rand(b, generator=g)
    return vt, vo, vs, r, sigma if space == "x0" else None


def _expected(vt, vo, vs, r, sigma, space, reduction, scale, upstream):
    """Loss and d(upstream . loss)/d v_theta in float64 through the reference."""
    v = vt.double().requires_grad_()
    per_sample = reference.nft_loss(v, vo.double(), vs.double(), r.double(), beta=0.7,
                                    sigma=None if sigma is None else sigma.double(),
                                    space=space) * scale
    loss = {"mean": per_sample.mean(), "sum": per_sample.sum(), "none": per_sample}[reduction]
    (grad,) = torch.autograd.grad((loss * upstream).sum(), v)
    return loss.detach(), grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("space", ["velocity", "x0"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("scale", [1.0, 0.37, -2.0])
@pytest.mark.parametrize("upstream", ["one", "other"])
def test_reductions_and_scale_match_the_reference(backend, space, reduction, scale, upstream):
    vt, vo, vs, r, sigma = _inputs(space=space)
    weight = (torch.ones(()) if reduction != "none" else torch.ones(3)) if upstream == "one" \
        else (torch.tensor(3.0) if reduction != "none" else torch.tensor([0.5, -1.0, 2.0]))
    v = vt.clone().requires_grad_()
    loss = nft_loss(v, vo, vs, r, beta=0.7, sigma=sigma, space=space, reduction=reduction,
                    scale=scale, backend=backend)
    (loss * weight).sum().backward()
    want_loss, want_grad = _expected(vt, vo, vs, r, sigma, space, reduction, scale,
                                     weight.double())
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(v.grad.double(), want_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_backward_multiplies_the_saved_gradient_by_the_upstream_one(backend, reduction):
    """The op saves the gradient already scaled by the reduction and ``scale``; an upstream
    gradient other than 1 scales it (per row for ``none``)."""
    vt, vo, vs, r, _ = _inputs()
    grads = []
    for upstream in (1.0, 2.5):
        v = vt.clone().requires_grad_()
        loss = nft_loss(v, vo, vs, r, reduction=reduction, scale=0.5, backend=backend)
        weights = torch.full_like(loss, upstream)
        if reduction == "none":
            weights[0] = 0.0
        (loss * weights).sum().backward()
        grads.append(v.grad)
    want = grads[0] * 2.5
    if reduction == "none":
        want[0] = 0.0
    torch.testing.assert_close(grads[1], want, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("scale, error", [(0.0, ValueError), (float("nan"), TypeError),
                                          ("1", TypeError), (True, TypeError)])
def test_bad_scale_is_refused(scale, error):
    vt, vo, vs, r, _ = _inputs()
    with pytest.raises(error, match="scale"):
        nft_loss(vt, vo, vs, r, scale=scale)
