"""Shared-prefix attention with FlexAttention (CUDA; forward-only on CPU).

Keys are laid out once as ``[1, H, P + B*Lk, D]``: the prefix, then every row's own keys.
A block mask lets query row ``b`` see the prefix and its own block; the KV batch of 1 is
broadcast against the ``B`` query rows, so the prefix is stored once. Block masks are cached
per shape because building one can cost more than the attention itself.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.lru_cache(maxsize=64)
def _block_mask(b: int, lq: int, p: int, lk: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def row_sees_prefix_and_own_keys(batch, head, q_idx, kv_idx):
        own = (kv_idx >= p) & ((kv_idx - p) // max(lk, 1) == batch)
        return (kv_idx < p) | own

    return create_block_mask(row_sees_prefix_and_own_keys, B=b, H=None, Q_LEN=lq,
                             KV_LEN=p + b * lk, device=device)


@functools.cache
def _flex_attention(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if device_type == "cuda" else flex_attention


def flex_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                          scale: float) -> Tensor:
    """``[B, H, L, D]`` attention over ``cat(prefix, own keys)`` via one masked FlexAttention."""
    b, h, lq, d = q.shape
    p, lk = prefix_k.shape[2], k.shape[2]
    keys = torch.cat([prefix_k, k.transpose(0, 1).reshape(1, h, b * lk, d)], dim=2)
    values = torch.cat([prefix_v, v.transpose(0, 1).reshape(1, h, b * lk, d)], dim=2)
    mask = _block_mask(b, lq, p, lk, str(q.device))
    return _flex_attention(q.device.type)(q, keys, values, block_mask=mask, scale=scale)
