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

    Layout ``[B, H, L, D]``; LSE ``[B, H, L]`` in natural log. ``forward`` also returns what
    its ``backward`` needs back from it (``aux``: random state, sequence offsets; ``()`` when
    nothing). ``backward`` must use the ``out`` and ``lse`` it is given (not recompute its
    own): that is what makes the merged gradient exact. ``prefix_groups`` says into how many
    groups (a divisor of ``b``) the folded rows of the prefix backward are split, each against
    its own copy of the prefix, so that the pass fills the device.
    """

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float
                ) -> tuple[Tensor, Tensor, tuple]:
        ...

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, aux: tuple, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        ...

    def prefix_groups(self, b: int, h: int, p: int, device: torch.device) -> int:
        ...


class CPUFlashKernels:
    """PyTorch's fused CPU flash-attention forward/backward (``aten`` ops)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float
                ) -> tuple[Tensor, Tensor, tuple]:
        return (*torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v,
                                                                           scale=scale), ())

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, aux: tuple, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, scale=scale)

    def prefix_groups(self, b: int, h: int, p: int, device: torch.device) -> int:
        return 1


CPU_FLASH = CPUFlashKernels()


def fold_rows(x: Tensor, groups: int = 1) -> Tensor:
    """``[B, H, L, ...]`` -> ``[groups, H, B/groups * L, ...]``: the rows as ``groups`` query
    sequences (``groups`` divides ``B``)."""
    b, h, length = x.shape[:3]
    x = x.reshape(groups, b // groups, h, length, *x.shape[3:]).transpose(1, 2)
    return x.reshape(groups, h, b // groups * length, *x.shape[4:])


def unfold_rows(x: Tensor, b: int) -> Tensor:
    """Inverse of :func:`fold_rows`."""
    groups, h, rows = x.shape[:3]
    x = x.reshape(groups, h, b // groups, rows * groups // b, *x.shape[3:]).transpose(1, 2)
    return x.reshape(b, h, rows * groups // b, *x.shape[4:])


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
        parts, ctx.aux = [], {}
        if p > 0:
            o1, lse1, ctx.aux["prefix"] = kernels.forward(fold_rows(q), prefix_k, prefix_v,
                                                          scale)
            parts.append((unfold_rows(o1, b), unfold_rows(lse1, b)))
        if lk > 0:
            o2, lse2, ctx.aux["own"] = kernels.forward(q, k, v, scale)
            parts.append((o2, lse2))
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
        (b, h), p, lk = q.shape[:2], prefix_k.shape[2], k.shape[2]
        grad_out = grad_out.contiguous()
        dq = None  # the inputs' check guarantees P + Lk > 0: at least one side runs
        if p > 0:
            groups = ctx.kernels.prefix_groups(b, h, p, q.device)
            keys, values = (t.expand(groups, -1, -1, -1).contiguous() if groups > 1 else t
                            for t in (prefix_k, prefix_v))
            dq1, dpk, dpv = ctx.kernels.backward(
                fold_rows(grad_out, groups), fold_rows(q, groups), keys, values,
                fold_rows(out, groups), fold_rows(lse, groups), ctx.aux["prefix"], ctx.scale)
            dq = unfold_rows(dq1, b)
            if groups > 1:
                dpk, dpv = dpk.sum(dim=0, keepdim=True), dpv.sum(dim=0, keepdim=True)
        else:
            dpk, dpv = torch.zeros_like(prefix_k), torch.zeros_like(prefix_v)
        if lk > 0:
            dq2, dk, dv = ctx.kernels.backward(grad_out, q, k, v, out, lse, ctx.aux["own"],
                                               ctx.scale)
            dq = dq2 if dq is None else dq + dq2
        else:
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        return dq, dk, dv, dpk, dpv, None, None


def split_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                           scale: float, kernels: PartialKernels = CPU_FLASH) -> Tensor:
    """``[B, H, L, D]`` attention over ``cat(prefix, own keys)`` without replicating the prefix."""
    return SplitPrefixAttention.apply(q, k, v, prefix_k, prefix_v, scale, kernels)
