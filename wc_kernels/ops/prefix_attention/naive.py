"""Plain-PyTorch reference of ``prefix_attention``: the spec every fast backend is tested against.

Written for clarity, not speed: it materializes every intermediate and lets autograd derive
the gradients. Inputs are validated by the public op in :mod:`wc_kernels.prefix_attention`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wc_kernels._dtypes import compute_dtype


def prefix_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """Softmax attention of each batch row over ``cat(prefix, own keys)``, no mask.

    ``q, k, v`` ``[B, H, L, D]``; ``prefix_k, prefix_v`` ``[1, H, P, D]`` shared by all rows
    (``P`` may be 0). The prefix is replicated per row here, which is exactly what the fast
    backends avoid. Scores and softmax in fp32 (fp64 for fp64 inputs); output in ``q``'s dtype.
    """
    acc = compute_dtype(q.dtype)
    b = q.shape[0]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    keys = torch.cat([prefix_k.expand(b, -1, -1, -1), k], dim=2).to(acc)
    values = torch.cat([prefix_v.expand(b, -1, -1, -1), v], dim=2).to(acc)
    scores = torch.einsum("bhld,bhmd->bhlm", q.to(acc), keys) * scale
    out = torch.einsum("bhlm,bhmd->bhld", scores.softmax(dim=-1), values)
    return out.to(q.dtype)
