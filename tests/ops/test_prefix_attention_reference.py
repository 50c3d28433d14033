"""The ``prefix_attention`` reference (the spec) against SDPA over a replicated prefix, and
the public op's argument checks."""

import pytest
import torch
import torch.nn.functional as F

import wc_kernels
from wc_kernels import reference


@pytest.mark.parametrize("p,lq,lk", [(0, 3, 3), (5, 4, 2), (7, 1, 6), (3, 5, 0)])
def test_prefix_attention_matches_sdpa_with_replicated_prefix(p, lq, lk):
    g = torch.Generator().manual_seed(p * 100 + lq * 10 + lk)
    b, h, d = 3, 2, 8
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, h, lk, d, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    pk, pv = (torch.randn(1, h, p, d, generator=g, dtype=torch.float64, requires_grad=True)
              for _ in range(2))
    out = wc_kernels.prefix_attention(q, k, v, pk, pv, backend="reference")
    inputs = (q, k, v, pk, pv)
    grads = torch.autograd.grad(out.sum() * 1.0 + (out**2).sum(), inputs)
    keys = torch.cat([pk.expand(b, -1, -1, -1), k], 2)
    values = torch.cat([pv.expand(b, -1, -1, -1), v], 2)
    want = F.scaled_dot_product_attention(q, keys, values)
    want_grads = torch.autograd.grad(want.sum() * 1.0 + (want**2).sum(), inputs)
    torch.testing.assert_close(out, want)
    for got, exp in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, exp)


def test_prefix_attention_low_precision_output_dtype():
    q, k, v = (torch.randn(2, 2, 3, 4, dtype=torch.bfloat16) for _ in range(3))
    pk, pv = (torch.randn(1, 2, 5, 4, dtype=torch.bfloat16) for _ in range(2))
    out = wc_kernels.prefix_attention(q, k, v, pk, pv, backend="reference")
    assert out.dtype == torch.bfloat16
    want = reference.prefix_attention(*(t.double() for t in (q, k, v, pk, pv)))
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_prefix_attention_bad_inputs():
    q = torch.randn(2, 2, 3, 4)
    pk = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"prefix_k must have shape \[1, H=2, P, D=4\]"):
        wc_kernels.prefix_attention(q, q, q, pk.expand(2, -1, -1, -1), pk)
    with pytest.raises(ValueError, match="k must have shape"):
        wc_kernels.prefix_attention(q, torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4), pk, pk)
    with pytest.raises(TypeError, match="prefix_v must have the dtype"):
        wc_kernels.prefix_attention(q, q, q, pk, pk.double())
    with pytest.raises(ValueError, match=r"q must have shape \[B, H, L, D\]"):
        wc_kernels.prefix_attention(q[0], q, q, pk, pk)
    empty = torch.randn(1, 2, 0, 4)
    with pytest.raises(ValueError, match="hold no key at all"):
        wc_kernels.prefix_attention(q, q[:, :, :0], q[:, :, :0], empty, empty)
