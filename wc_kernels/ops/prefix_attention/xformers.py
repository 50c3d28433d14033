"""Shared-prefix attention through xformers' partial attentions and their autograd merge.

``memory_efficient_attention_partial_autograd`` returns a partial (output plus LSE) and
``merge_attentions_autograd`` merges partials; its backward hands every partial the merged
output and LSE, the same construction as :mod:`wc_kernels.ops.prefix_attention.split`. The prefix
partial runs on all rows folded into one query sequence against the single prefix copy, then is
reshaped into rows so both partials have the same query shape. Layout in xformers:
``[B, M, H, K]``.
"""

from __future__ import annotations

from torch import Tensor


def xformers_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                              prefix_v: Tensor, scale: float) -> Tensor:
    """``[B, H, L, D]`` attention over ``cat(prefix, own keys)`` with one prefix copy."""
    from xformers.ops.fmha.merge_training import (
        memory_efficient_attention_partial_autograd,
        merge_attentions_autograd,
    )

    b, h, length, d = q.shape
    rows = q.transpose(1, 2)
    partials = []
    if prefix_k.shape[2] > 0:
        folded = memory_efficient_attention_partial_autograd(
            rows.reshape(1, b * length, h, d), prefix_k.transpose(1, 2),
            prefix_v.transpose(1, 2), scale=scale)
        partials.append(folded.apply(lambda x: x.reshape(b, length, *x.shape[2:])))
    if k.shape[2] > 0:
        partials.append(memory_efficient_attention_partial_autograd(
            rows, k.transpose(1, 2), v.transpose(1, 2), scale=scale))
    return merge_attentions_autograd(*partials).transpose(1, 2).to(q.dtype)
