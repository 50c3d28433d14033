"""Shared-prefix attention backends against the reference: forward and all five gradients."""

import pytest
import torch

import wc_kernels
from wc_kernels import reference

CASES = [  # (B, H, P, Lq, Lk, D)
    (1, 1, 1, 1, 1, 1),
    (3, 2, 0, 5, 5, 8),
    (2, 3, 7, 3, 0, 5),
    (4, 2, 37, 9, 9, 17),
    (1, 4, 130, 16, 16, 32),
    (5, 1, 3, 2, 11, 3),
]
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}


def _inputs(case, dtype, seed=0, device="cpu"):
    b, h, p, lq, lk, d = case
    g = torch.Generator().manual_seed(seed + sum(case))
    make = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    tensors = (make(b, h, lq, d), make(b, h, lk, d), make(b, h, lk, d), make(1, h, p, d),
               make(1, h, p, d))
    return [t.requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["split", "replicated"])
def test_cpu_backend_matches_reference(backend, case, dtype):
    """The split path and the replicated-prefix SDPA baseline against the reference."""
    ins = _inputs(case, dtype)
    out = wc_kernels.prefix_attention(*ins, backend=backend)
    want = reference.prefix_attention(*ins)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, ins, grad_out)
    want_grads = torch.autograd.grad(want, ins, grad_out)
    for name, got, exp in zip(("q", "k", "v", "prefix_k", "prefix_v"), grads, want_grads,
                              strict=True):
        assert got.shape == exp.shape, name
        torch.testing.assert_close(got, exp, rtol=rtol * 4, atol=atol * 4, msg=name)


def test_split_gradcheck():
    ins = [t.detach().requires_grad_(True) for t in _inputs((2, 2, 3, 2, 2, 4), torch.float64)]
    assert torch.autograd.gradcheck(
        lambda *a: wc_kernels.prefix_attention(*a, backend="split"), tuple(ins))


def test_split_custom_scale():
    ins = _inputs((2, 2, 5, 3, 3, 8), torch.float64)
    torch.testing.assert_close(wc_kernels.prefix_attention(*ins, scale=0.1, backend="split"),
                               reference.prefix_attention(*ins, scale=0.1))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("case", CASES[1:5])
def test_flex_forward_matches_reference(case):
    """On CPU FlexAttention runs unfused and has no backward: forward only here."""
    ins = [t.detach() for t in _inputs(case, torch.float32)]
    out = wc_kernels.prefix_attention(*ins, backend="flex")
    torch.testing.assert_close(out, reference.prefix_attention(*ins), rtol=1e-5, atol=1e-5)


def test_auto_on_cpu_uses_the_split_path():
    from wc_kernels._backend import resolve
    from wc_kernels.ops.prefix_attention import IMPLEMENTED

    assert resolve("prefix_attention", "auto", torch.device("cpu"), IMPLEMENTED) == "split"


def test_flex_on_cuda_needs_head_dim_16():
    """FlexAttention's CUDA kernels take D >= 16: naming ``flex`` raises a ValueError that says
    so, ``auto`` passes over it; on CPU every head dim stays allowed. Checked on a stand-in
    for a CUDA tensor (only dtype, shape and device are read)."""
    from types import SimpleNamespace

    from wc_kernels.ops.prefix_attention import FLEX_CUDA_MIN_HEAD_DIM, _candidates

    def like(d, device):
        return SimpleNamespace(dtype=torch.float32, shape=(1, 1, 1, d), device=torch.device(device))

    assert FLEX_CUDA_MIN_HEAD_DIM == 16
    with pytest.raises(ValueError, match=r"backend='flex' on cuda needs head dim D >= 16 "
                                         r"\(q.shape\[-1\]\), got D=8"):
        _candidates(like(8, "cuda"), "flex")
    assert "flex" not in _candidates(like(8, "cuda"), "auto")
    assert "flex" in _candidates(like(16, "cuda"), "flex")
    assert "flex" in _candidates(like(8, "cpu"), "flex")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["flex", "auto"])
def test_cuda_backends_match_reference(backend, dtype):
    """Every case; ``flex`` at the next power of two >= 16, the head dims its CUDA kernels
    take (``auto`` passes over it for smaller ones)."""
    for case in CASES[1:]:
        b, h, p, lq, lk, d = case
        if backend == "flex":
            d = max(16, 1 << (d - 1).bit_length())
        ins = [t.detach().cuda().requires_grad_(True)
               for t in _inputs((b, h, p, lq, lk, d), dtype)]
        out = wc_kernels.prefix_attention(*ins, backend=backend)
        want = reference.prefix_attention(*ins)
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
        grad_out = torch.randn_like(out)
        for got, exp in zip(torch.autograd.grad(out, ins, grad_out),
                            torch.autograd.grad(want, ins, grad_out), strict=True):
            torch.testing.assert_close(got, exp, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
def test_cuda_flex_rejects_small_head_dims():
    ins = [t.detach().cuda() for t in _inputs((3, 2, 0, 5, 5, 8), torch.float32)]
    with pytest.raises(ValueError, match="D >= 16"):
        wc_kernels.prefix_attention(*ins, backend="flex")
    torch.testing.assert_close(wc_kernels.prefix_attention(*ins, backend="auto"),
                               reference.prefix_attention(*ins), rtol=2e-2, atol=2e-2)
