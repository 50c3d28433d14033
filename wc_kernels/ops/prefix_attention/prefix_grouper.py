"""Shared-prefix attention as the ``prefix-grouper`` library (PrefixGrouper, the GRPO utility
verl merged) computes it: a peer contender for the benchmarks, chosen by name only.

PrefixGrouper runs the prefix's tokens through the model's other layers once per group, and in
attention splits the packed sequence into the prefix's self-attention and the suffixes'
attention over ``cat(prefix, own keys)``, where the prefix keys and values are copied for every
suffix (``batch_repeat_cat``: ``repeat_interleave`` then ``cat``). Here only that suffix
attention runs, over inputs already split: the rows ``prefix_attention`` computes. Its
``ungroup``/``group`` gathers and the prefix's self-attention (which a cached prefix does not
need) are left out, which can only favour it. A group has no padding (every row has ``Lk``
own keys), so the key mask it builds is all true and is not passed to SDPA, which would
otherwise leave its flash kernels.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.lru_cache(maxsize=16)
def _grouper(p: int, lk: int, rows: int, device: torch.device):
    """One ``PrefixGrouper`` per shape: built once per batch in its intended use (its
    construction reads masks back to the host), not once per attention call."""
    from prefix_grouper import PrefixGrouper

    return PrefixGrouper([[p] + [lk] * rows], device=device)


def prefix_grouper_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                             prefix_v: Tensor, scale: float) -> Tensor:
    """``[B, H, L, D]`` attention over ``cat(prefix, own keys)``, the prefix copied per row by
    PrefixGrouper's ``batch_repeat_cat``, then ``F.scaled_dot_product_attention``."""
    grouper = _grouper(prefix_k.shape[2], k.shape[2], q.shape[0], q.device)
    keys = grouper.batch_repeat_cat(prefix_k, k, cat_dim=2)
    values = grouper.batch_repeat_cat(prefix_v, v, cat_dim=2)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, scale=scale)
