"""Partial attentions from PyTorch's own fused CUDA kernels for the split path: SDPA's flash,
cuDNN and memory-efficient backends, called through their ``aten`` forward and backward ops.

Each forward returns its log-sum-exp (LSE) in its own layout: flash ``[B, H, L]``, cuDNN
``[B, H, L, 1]``, memory-efficient ``[B, H, ceil(L / 32) * 32]`` (padded); the adapters give
the split path the natural-log ``[B, H, L]`` fp32 LSE and hand the merged one back to each
backward in that backward's layout (the layouts are those of the ops' meta kernels, which the
tests run on the meta device). The backwards use the ``out`` and ``lse`` they are given, which
is what makes the merged gradient exact (:mod:`wc_kernels.ops.prefix_attention.split`); the
forward's random-state outputs (unused without dropout) are passed back unchanged, as
PyTorch's own context-parallel attention does. No library calls these backwards with a merged
LSE over a shared prefix, hence this module.

The folded prefix backward (all ``B * L`` query rows against one prefix) has one batch, so its
``dk, dv`` pass runs on few CTAs; :meth:`SdpaKernels.prefix_groups` splits the rows into groups
(each against its own copy of the prefix, at most :data:`MAX_PREFIX_GROUPS`) until the pass
covers the SMs. The memory-efficient backend keeps one group: given an expanded (stride-0) key
batch it has returned wrong results (pytorch#191937).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

aten = torch.ops.aten
MAX_PREFIX_GROUPS = 4
KEY_BLOCK = 128  # keys per CTA of the backward's dk/dv pass, for the group count only
EFFICIENT_LSE_ALIGN = 32


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _groups_for(b: int, h: int, p: int, sms: int, limit: int) -> int:
    """The largest divisor ``r`` of ``b`` (at most ``limit``) whose ``r * h * ceil(p / 128)``
    key blocks still fit in ``sms``; at least 1."""
    blocks = h * -(-p // KEY_BLOCK)
    best = 1
    for r in range(1, min(b, limit) + 1):
        if b % r == 0 and r * blocks <= sms:
            best = r
    return best


class SdpaKernels:
    """:class:`wc_kernels.ops.prefix_attention.split.PartialKernels` over one SDPA backend's
    ``aten`` ops (``flash``, ``cudnn`` or ``efficient``); layout ``[B, H, L, D]``."""

    def __init__(self, kind: str) -> None:
        if kind not in ("flash", "cudnn", "efficient"):
            raise ValueError(f"kind must be flash, cudnn or efficient, got {kind!r}")
        self.kind = kind

    def prefix_groups(self, b: int, h: int, p: int, device: torch.device) -> int:
        if self.kind == "efficient" or device.type != "cuda":
            return 1
        return _groups_for(b, h, p, _sm_count(device.index or 0), MAX_PREFIX_GROUPS)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float
                ) -> tuple[Tensor, Tensor, tuple]:
        length = q.shape[2]
        if self.kind == "flash":
            out, lse, cum_q, cum_k, _, _, seed, offset, _ = \
                aten._scaled_dot_product_flash_attention(q, k, v, scale=scale)
            return out, lse, (cum_q, cum_k, seed, offset)
        if self.kind == "cudnn":
            out, lse, cum_q, cum_k, _, _, seed, offset, _ = \
                aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, scale=scale)
            return out, lse.view(lse.shape[:3]), (cum_q, cum_k, seed, offset)
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, scale=scale)
        return out, lse[..., :length], (seed, offset)

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, aux: tuple, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        lq, lk = q.shape[2], k.shape[2]
        lse = lse.to(torch.float32).contiguous()
        if self.kind == "flash":
            cum_q, cum_k, seed, offset = aux
            return aten._scaled_dot_product_flash_attention_backward(
                grad_out, q, k, v, out, lse, cum_q, cum_k, lq, lk, 0.0, False, seed, offset,
                scale=scale)
        if self.kind == "cudnn":
            cum_q, cum_k, seed, offset = aux
            return aten._scaled_dot_product_cudnn_attention_backward(
                grad_out, q, k, v, out, lse.unsqueeze(-1), seed, offset, None, cum_q, cum_k,
                lq, lk, 0.0, False, scale=scale)
        seed, offset = aux
        padded = -(-lq // EFFICIENT_LSE_ALIGN) * EFFICIENT_LSE_ALIGN
        lse = torch.nn.functional.pad(lse, (0, padded - lq))
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False],
            False, scale=scale)
        return dq, dk, dv


SDPA_KERNELS = {f"sdpa_{kind}": SdpaKernels(kind) for kind in ("flash", "cudnn", "efficient")}
