"""Fast backends of ``nft_loss`` against ``backend="reference"``.

Every fast backend available here runs: ``triton`` (under ``TRITON_INTERPRET=1`` on CPU, set by
conftest) and ``native`` when ``wc_kernels._native`` is built. Outputs are NaN-poisoned before the
kernels run, so an element a kernel forgets to write fails the comparison. Sizes are odd
(1, 3, 1000, 65537 elements per row; 65537 also crosses the chunk split of the row) and small,
since every interpreted Triton program costs milliseconds.
"""

import pytest
import torch
from triton_cases import CASES, DTYPES, GPU, assert_matches

from wc_kernels import nft_loss

pytestmark = pytest.mark.usefixtures("poison_outputs")
SHAPES = [(1, 1), (7, 3), (5, 1000), (1, 65537), (2, 4, 5, 7)]  # [B, ...]


def _nft_inputs(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = shape[0]
    vt, vo, vs = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(3))
    r = torch.rand(b, generator=g)
    if b >= 3:
        r[:2] = torch.tensor([0.0, 1.0])
    sigma = torch.rand(b, generator=g) * 0.9 + 0.05
    return vt, vo, vs, r.to(device), sigma.to(device)


def _nft_run(backend, vt, vo, vs, r, sigma, *, beta, space, reduction, grad_out=None):
    leaf = vt.detach().clone().requires_grad_()
    loss = nft_loss(leaf, vo, vs, r, beta=beta, sigma=sigma, space=space, reduction=reduction,
                    backend=backend)
    loss.backward(torch.ones_like(loss) if grad_out is None else grad_out)
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("backend,device", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("space", ["velocity", "x0"])
@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_nft_loss_matches_reference(backend, device, dtype, shape, space, beta):
    """Per-sample loss (fp32 rel 1e-5) and dL_i/dv_theta (1 ulp of the input dtype)."""
    inputs = _nft_inputs(shape, dtype, device)
    kw = dict(beta=beta, space=space, reduction="none")
    loss, grad = _nft_run(backend, *inputs, **kw)
    ref_loss, ref_grad = _nft_run("reference", *inputs, **kw)
    assert loss.dtype == torch.float32 and loss.shape == (shape[0],)
    assert_matches(loss, ref_loss)
    assert_matches(grad, ref_grad)


@pytest.mark.parametrize("backend,device", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("space", ["velocity", "x0"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nft_loss_reductions(backend, device, dtype, space, reduction):
    """The reduced loss and its gradient; with "none", a different weight per sample (the
    backward scales the stored gradient: one more rounding, so 2 ulp)."""
    inputs = _nft_inputs((6, 37), dtype, device, seed=1)
    grad_out = torch.rand(6, device=device) if reduction == "none" else None
    kw = dict(beta=1.0, space=space, reduction=reduction, grad_out=grad_out)
    loss, grad = _nft_run(backend, *inputs, **kw)
    ref_loss, ref_grad = _nft_run("reference", *inputs, **kw)
    assert_matches(loss, ref_loss)
    assert_matches(grad, ref_grad, ulps=2)


@pytest.mark.parametrize("backend,device", CASES)
def test_nft_loss_float64(backend, device):
    vt, vo, vs, r, sigma = _nft_inputs((3, 11), torch.float64, device, seed=2)
    for space in ("velocity", "x0"):
        loss, grad = _nft_run(backend, vt, vo, vs, r, sigma, beta=0.5, space=space,
                              reduction="sum")
        ref_loss, ref_grad = _nft_run("reference", vt, vo, vs, r, sigma, beta=0.5, space=space,
                                      reduction="sum")
        assert loss.dtype == torch.float64
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("backend,device", CASES)
def test_nft_loss_zero_sigma_and_identical_predictions(backend, device):
    """Degenerate rows: sigma = 0 (x0 weight floor) and v+ = v- = v* (zero loss and gradient)."""
    vt, vo, vs, r, sigma = _nft_inputs((3, 50), torch.float32, device, seed=3)
    sigma[0] = 0.0
    vo[1] = vt[1]
    vs[1] = vt[1]
    loss, grad = _nft_run(backend, vt, vo, vs, r, sigma, beta=1.0, space="x0", reduction="none")
    ref_loss, ref_grad = _nft_run("reference", vt, vo, vs, r, sigma, beta=1.0, space="x0",
                                  reduction="none")
    assert loss[0] == 0 and loss[1] == 0 and not grad[:2].any()
    assert_matches(loss, ref_loss)
    assert_matches(grad, ref_grad)


@pytest.mark.parametrize("backend,device", CASES)
def test_nft_loss_non_contiguous(backend, device):
    g = torch.Generator().manual_seed(4)
    vt, vo, vs = (torch.randn(9, 6, 4, generator=g).to(device).transpose(1, 2)
                  for _ in range(3))
    r = torch.rand(18, generator=g).to(device)[::2]
    sigma = torch.rand(9, 2, generator=g).to(device)[:, 1]
    assert not any(t.is_contiguous() for t in (vt, vo, vs, r, sigma))
    for space in ("velocity", "x0"):
        loss, grad = _nft_run(backend, vt, vo, vs, r, sigma, beta=0.5, space=space,
                              reduction="none")
        ref_loss, ref_grad = _nft_run("reference", vt, vo, vs, r, sigma, beta=0.5, space=space,
                                      reduction="none")
        assert_matches(loss, ref_loss)
        assert_matches(grad, ref_grad)


def _bad_nft_calls(device):
    vt, vo, vs, r, sigma = _nft_inputs((2, 3), torch.float32, device)
    return [
        (ValueError, "v_old must have the shape", (vt, vo[:, :2], vs, r), {}),
        (TypeError, "v_target must have the dtype", (vt, vo, vs.half(), r), {}),
        (ValueError, "v_old is on", (vt, vo.to("meta"), vs, r), {}),
        (ValueError, "r must have shape", (vt, vo, vs, r[:1]), {}),
        (ValueError, "sigma .* is required", (vt, vo, vs, r), {"space": "x0"}),
        (ValueError, "sigma is on", (vt, vo, vs, r), {"space": "x0",
                                                      "sigma": sigma.to("meta")}),
        (ValueError, "r must lie in", (vt, vo, vs, r + 2), {}),
        (TypeError, "dtype in", (vt.long(), vo, vs, r), {}),
    ]


@pytest.mark.parametrize("backend,device", CASES)
def test_nft_loss_bad_inputs_rejected(backend, device):
    for exc, match, args, kw in _bad_nft_calls(device):
        with pytest.raises(exc, match=match):
            nft_loss(*args, backend=backend, **kw)


def test_launcher_rejects_bad_operands():
    """The Triton launcher checks shapes, dtypes and devices itself (for direct op users)."""
    from wc_kernels.ops.nft_loss.triton import nft_loss_fwd

    vt, vo, vs, r, sigma = _nft_inputs((2, 3), torch.float32, "cpu")
    with pytest.raises(ValueError, match="v_theta must be"):
        nft_loss_fwd(vt[0], vo, vs, r, sigma, 1.0, False)
    with pytest.raises(TypeError, match="v_old must have the dtype"):
        nft_loss_fwd(vt, vo.half(), vs, r, sigma, 1.0, False)
    with pytest.raises(ValueError, match="sigma .* is required"):
        nft_loss_fwd(vt, vo, vs, r, None, 1.0, True)


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("space", ["velocity", "x0"])
def test_nft_loss_long_rows_cuda(dtype, space):
    """Rows far longer than one program's chunk, few rows: the split path on a real GPU."""
    inputs = _nft_inputs((3, 3_000_001), dtype, "cuda", seed=8)
    loss, grad = _nft_run("triton", *inputs, beta=1.0, space=space, reduction="none")
    ref_loss, ref_grad = _nft_run("reference", *inputs, beta=1.0, space=space, reduction="none")
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    assert_matches(grad, ref_grad)
