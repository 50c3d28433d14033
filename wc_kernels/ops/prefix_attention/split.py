"""Shared-prefix attention as two fused partial attentions merged by log-sum-exp (Hydragen).

All ``B`` query rows are folded into one sequence ``[1, H, B*L, D]`` that attends to the single
prefix copy ``[1, H, P, D]``; each row also attends to its own keys ``[B, H, Lk, D]``. The two
partial outputs are merged in fp32 with their natural-log LSEs. Backward runs each partial's
ordinary attention backward with the MERGED output and LSE, which gives exactly the gradient
of softmax attention over the union of keys (the xformers ``merge_training`` construction).

The partial attentions come from a :class:`PartialKernels` pair: PyTorch's fused CPU
flash-attention kernels here (they return the LSE and take it back in the backward), the
``flash-attn`` library's CUDA kernels in :mod:`wc_kernels.ops.prefix_attention.flash_attn`. No
library exposes "attention over a shared prefix plus per-row keys with gradients" on CPU, hence
this small autograd function.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from wc_kernels._dtypes import compute_dtype


class PartialKernels(Protocol):
    """A fused attention forward that returns its LSE and a backward that takes one.

    Layout ``[B, H, L, D]``; LSE ``[B, H, L]`` in natural log. ``backward`` must use the
    ``out`` and ``lse`` it is given (not recompute its own): that is what makes the merged
    gradient exact.
    """

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        ...

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        ...


class CPUFlashKernels:
    """PyTorch's fused CPU flash-attention forward/backward (``aten`` ops)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, scale=scale)


CPU_FLASH = CPUFlashKernels()


def fold_rows(x: Tensor) -> Tensor:
    """``[B, H, L, ...]`` -> ``[1, H, B*L, ...]``: all rows as one query sequence."""
    b, h, length = x.shape[:3]
    return x.transpose(0, 1).reshape(1, h, b * length, *x.shape[3:])


def unfold_rows(x: Tensor, b: int) -> Tensor:
    """Inverse of :func:`fold_rows`."""
    h, bl = x.shape[1:3]
    return x.reshape(h, b, bl // b, *x.shape[3:]).transpose(0, 1)


def merge_partials(o1: Tensor, lse1: Tensor, o2: Tensor, lse2: Tensor, out_dtype: torch.dtype
                   ) -> tuple[Tensor, Tensor]:
    """Merge two partial attentions over disjoint key sets: ``(out [.., D], lse [..])``.

    Arithmetic in fp32 (fp64 for fp64 outputs); an empty side must come with LSE = -inf.
    """
    acc = compute_dtype(out_dtype)
    lse1, lse2 = lse1.to(acc), lse2.to(acc)
    m = torch.maximum(lse1, lse2)
    w1 = torch.exp(lse1 - m).unsqueeze(-1)
    w2 = torch.exp(lse2 - m).unsqueeze(-1)
    total = w1 + w2
    out = (o1.to(acc) * w1 + o2.to(acc) * w2) / total
    return out.to(out_dtype), m + torch.log(total.squeeze(-1))


def _lse_dtype(q: Tensor) -> torch.dtype:
    return compute_dtype(q.dtype)


class SplitPrefixAttention(torch.autograd.Function):
    """Autograd of shared-prefix attention; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, prefix_k, prefix_v, scale, kernels):
        b, p, lk = q.shape[0], prefix_k.shape[2], k.shape[2]
        parts = []
        if p > 0:
            o1, lse1 = kernels.forward(fold_rows(q), prefix_k, prefix_v, scale)
            parts.append((unfold_rows(o1, b), unfold_rows(lse1, b)))
        if lk > 0:
            parts.append(kernels.forward(q, k, v, scale))
        if len(parts) == 2:
            out, lse = merge_partials(*parts[0], *parts[1], q.dtype)
        else:
            out, lse = parts[0][0].contiguous(), parts[0][1].to(_lse_dtype(q))
        ctx.save_for_backward(q, k, v, prefix_k, prefix_v, out, lse)
        ctx.scale, ctx.kernels = scale, kernels
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, prefix_k, prefix_v, out, lse = ctx.saved_tensors
        b, p, lk = q.shape[0], prefix_k.shape[2], k.shape[2]
        grad_out = grad_out.contiguous()
        dq = None  # the inputs' check guarantees P + Lk > 0: at least one side runs
        if p > 0:
            dq1, dpk, dpv = ctx.kernels.backward(fold_rows(grad_out), fold_rows(q), prefix_k,
                                                 prefix_v, fold_rows(out), fold_rows(lse),
                                                 ctx.scale)
            dq = unfold_rows(dq1, b)
        else:
            dpk, dpv = torch.zeros_like(prefix_k), torch.zeros_like(prefix_v)
        if lk > 0:
            dq2, dk, dv = ctx.kernels.backward(grad_out, q, k, v, out, lse, ctx.scale)
            dq = dq2 if dq is None else dq + dq2
        else:
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        return dq, dk, dv, dpk, dpv, None, None


def split_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                           scale: float, kernels: PartialKernels = CPU_FLASH) -> Tensor:
    """``[B, H, L, D]`` attention over ``cat(prefix, own keys)`` without replicating the prefix."""
    return SplitPrefixAttention.apply(q, k, v, prefix_k, prefix_v, scale, kernels)
