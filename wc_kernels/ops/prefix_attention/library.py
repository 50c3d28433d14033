"""``torch.library`` registration of the fused Triton shared-prefix attention (Triton on every
device; registered when triton is installed), with fake kernels and autograd. The kernels are
in :mod:`wc_kernels.ops.prefix_attention.triton`; :mod:`wc_kernels._registry` has the machinery.

``wc_fast::prefix_attention_fwd(q [B, H, L, D], k, v [B, H, Lk, D], prefix_k, prefix_v
[1, H, P, D], scale) -> (out [B, H, L, D], lse [B, H, L] fp32)``. Backward:
``wc_fast::prefix_attention_bwd(grad_out, q, k, v, prefix_k, prefix_v, out, lse, scale)
-> (dq, dk, dv, dprefix_k, dprefix_v)``; ``lse`` gets no gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from wc_kernels import _registry

PREFIX_ATTENTION = "wc_fast::prefix_attention_fwd"
PREFIX_ATTENTION_BWD = "wc_fast::prefix_attention_bwd"


def _fake(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
          scale: float) -> tuple[Tensor, Tensor]:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


def _bwd_fake(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
              prefix_v: Tensor, out: Tensor, lse: Tensor, scale: float
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (q, k, v, prefix_k, prefix_v))


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    *tensors, scale = inputs
    ctx.save_for_backward(*tensors, *output)
    ctx.scale = scale
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: Any, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple:
    backward = OPS[PREFIX_ATTENTION_BWD]
    return (*backward(grad_out, *ctx.saved_tensors, ctx.scale), None)


def define_ops() -> dict[str, Any]:
    """The forward op, with autograd through the backward op."""
    from wc_kernels.ops.prefix_attention.triton import prefix_attention_bwd, prefix_attention_fwd

    backward = _registry.define(PREFIX_ATTENTION_BWD, prefix_attention_bwd, None, native=False)
    backward.register_fake(_bwd_fake)
    forward = _registry.define(PREFIX_ATTENTION, prefix_attention_fwd, None, native=False)
    forward.register_fake(_fake)
    forward.register_autograd(_backward, setup_context=_setup_context)
    return {PREFIX_ATTENTION_BWD: backward, PREFIX_ATTENTION: forward}


OPS = define_ops() if _registry.HAVE_TRITON else {}
