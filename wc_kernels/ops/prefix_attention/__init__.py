"""``prefix_attention``: B query blocks attending to one shared prefix KV plus their own keys."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_kernels import _checks
from wc_kernels._backend import resolve
from wc_kernels.ops.prefix_attention import auto, naive
from wc_kernels.ops.prefix_attention.flex import flex_prefix_attention
from wc_kernels.ops.prefix_attention.prefix_grouper import prefix_grouper_attention
from wc_kernels.ops.prefix_attention.sdpa import SDPA_KERNELS
from wc_kernels.ops.prefix_attention.split import split_prefix_attention
from wc_kernels.ops.prefix_attention.xformers import xformers_prefix_attention

IMPLEMENTED = ("reference", "triton", "split", "flex", "flash_attn", "xformers", "prefix_grouper",
               "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "replicated")
_HALF = (torch.float16, torch.bfloat16)
# dtypes each fast backend takes ("auto" passes over a backend that cannot take the input)
DTYPES = {"triton": (*_HALF, torch.float32), "flash_attn": _HALF,
          "xformers": (*_HALF, torch.float32), "sdpa_flash": _HALF, "sdpa_cudnn": _HALF,
          "sdpa_efficient": (*_HALF, torch.float32)}
MAX_HEAD_DIM = {"triton": 128, "flash_attn": 256, "sdpa_flash": 256, "sdpa_cudnn": 128}
# FlexAttention's CUDA kernels need D >= 16 (torch 2.11: "NYI: embedding dimension of the
# query, key, and value must be at least 16"); on CPU it takes any head dim
FLEX_CUDA_MIN_HEAD_DIM = 16


def _min_head_dim(backend: str, device: torch.device) -> int:
    return FLEX_CUDA_MIN_HEAD_DIM if backend == "flex" and device.type == "cuda" else 1


def triton_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                            prefix_v: Tensor, scale: float) -> Tensor:
    """The fused Triton kernels (:mod:`wc_kernels.ops.prefix_attention.triton`) through the
    registered op ``wc_fast::prefix_attention_fwd`` and its autograd."""
    from wc_kernels.ops.prefix_attention.library import OPS, PREFIX_ATTENTION

    return OPS[PREFIX_ATTENTION](q, k, v, prefix_k, prefix_v, scale)[0]


def flash_attn_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                                prefix_v: Tensor, scale: float) -> Tensor:
    """The split path with the ``flash-attn`` library's CUDA kernels as its partials."""
    from wc_kernels.ops.prefix_attention.flash_attn import flash_attn_kernels

    return split_prefix_attention(q, k, v, prefix_k, prefix_v, scale, flash_attn_kernels())


def _sdpa_prefix_attention(kind: str):
    """The split path with SDPA's ``kind`` CUDA kernels as its partials."""

    def attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                  scale: float) -> Tensor:
        return split_prefix_attention(q, k, v, prefix_k, prefix_v, scale, SDPA_KERNELS[kind])

    return attention


def replicated_prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                                prefix_v: Tensor, scale: float) -> Tensor:
    """``F.scaled_dot_product_attention`` over ``cat(prefix, own keys)`` with the prefix copied
    for every row: what batching the rows does without a shared prefix (a baseline)."""
    b = q.shape[0]
    keys = torch.cat([prefix_k.expand(b, -1, -1, -1), k], dim=2)
    values = torch.cat([prefix_v.expand(b, -1, -1, -1), v], dim=2)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, scale=scale)


_FAST = {"split": split_prefix_attention, "flex": flex_prefix_attention,
         "replicated": replicated_prefix_attention,
         "triton": triton_prefix_attention, "flash_attn": flash_attn_prefix_attention,
         "xformers": xformers_prefix_attention, "prefix_grouper": prefix_grouper_attention,
         **{name: _sdpa_prefix_attention(name) for name in SDPA_KERNELS}}


def _check_inputs(q, k, v, prefix_k, prefix_v) -> None:
    _checks.check_tensor("q", q)
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, H, L, D], got {tuple(q.shape)}")
    b, h, _, d = q.shape
    if h == 0 or d == 0:
        raise ValueError(f"q must have at least one head and a head dim >= 1 (attention over "
                         f"zero heads or zero-length vectors is undefined), got H={h}, D={d} "
                         f"in q.shape {tuple(q.shape)}")
    _checks.check_tensor("k", k)
    _checks.check_like("v", _checks.check_tensor("v", v), "k", k)
    if k.dim() != 4 or k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
        raise ValueError(f"k must have shape [B={b}, H={h}, L, D={d}], got {tuple(k.shape)}")
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        _checks.check_tensor(name, t)
        if t.dim() != 4 or t.shape[0] != 1 or t.shape[1] != h or t.shape[3] != d:
            raise ValueError(f"{name} must have shape [1, H={h}, P, D={d}] (one copy shared "
                             f"by all rows), got {tuple(t.shape)}")
    if prefix_v.shape != prefix_k.shape:
        raise ValueError(f"prefix_v must have the shape of prefix_k {tuple(prefix_k.shape)}, "
                         f"got {tuple(prefix_v.shape)}")
    for name, t in (("k", k), ("v", v), ("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
        _checks.check_device(name, t, "q", q)
    if k.shape[2] + prefix_k.shape[2] == 0:
        raise ValueError(f"k and prefix_k hold no key at all (k.shape {tuple(k.shape)}, "
                         f"prefix_k.shape {tuple(prefix_k.shape)}): attention needs Lk + P > 0")


def _check_scale(scale: object) -> float | None:
    """``scale`` as a float (``None`` stays ``None``: the default ``D ** -0.5``); a NaN or inf
    scale would give NaN on some backends and finite garbage on others, so it is refused."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"prefix_attention: scale must be a float or None, got "
                        f"{type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"prefix_attention: scale must be finite, got {scale}")
    return float(scale)


def _no_rows(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor) -> Tensor:
    """The output ``[B, H, L, D]`` when ``B * L == 0`` (no query row): empty, of ``q``'s shape,
    with a zero gradient to every input. No backend is called: some divide by the row count
    (the native CPU attention of ``split`` dies with SIGFPE on it)."""
    keys = k.sum() + v.sum() + prefix_k.sum() + prefix_v.sum()
    return q * 0 + keys * 0


def _candidates(q: Tensor, backend: str) -> tuple[str, ...]:
    """Backends that can take ``q``'s dtype and head dim; raises if ``backend`` cannot."""
    def fits(name: str) -> bool:
        return (q.dtype in DTYPES.get(name, (q.dtype,))
                and _min_head_dim(name, q.device) <= q.shape[-1]
                <= MAX_HEAD_DIM.get(name, q.shape[-1]))

    if backend != "auto" and q.shape[-1] < _min_head_dim(backend, q.device):
        raise ValueError(f"prefix_attention: backend={backend!r} on {q.device.type} needs head "
                         f"dim D >= {_min_head_dim(backend, q.device)} (q.shape[-1]), got "
                         f"D={q.shape[-1]} (use 'triton' or 'reference')")
    if backend != "auto" and backend in IMPLEMENTED and not fits(backend):
        dtypes = ", ".join(str(t).removeprefix("torch.") for t in DTYPES.get(backend, ()))
        limit = f" with D <= {MAX_HEAD_DIM[backend]}" if backend in MAX_HEAD_DIM else ""
        raise TypeError(f"prefix_attention: backend={backend!r} takes {dtypes} inputs{limit}; "
                        f"got {q.dtype}, D={q.shape[-1]} (use 'split' on CPU, 'flex' or "
                        f"'reference')")
    return tuple(name for name in IMPLEMENTED if fits(name))


def prefix_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Softmax attention of each row over ``cat(prefix, own keys)`` with one shared prefix.

    ``q`` ``[B, H, L, D]``, ``k, v`` ``[B, H, Lk, D]``, ``prefix_k, prefix_v`` ``[1, H, P, D]``
    (``P`` may be 0) -> ``[B, H, L, D]``. ``scale`` defaults to ``D ** -0.5``. Differentiable
    in all five inputs (``flex`` on CPU: forward only); the prefix gradient is summed over rows.
    Every backend but ``reference``, ``replicated`` and ``prefix_grouper`` keeps a single copy
    of the prefix. ``triton`` takes fp16/bf16/fp32 with ``D <= 128``, ``flash_attn``
    fp16/bf16 with ``D <= 256``, ``xformers`` fp16/bf16/fp32, ``flex`` on CUDA ``D >= 16``
    (``auto`` passes over a backend that cannot take the input; naming one raises). With no
    query row (``B = 0`` or ``L = 0``) every backend returns the empty ``[B, H, L, D]``; an
    empty key set on one side (``Lk = 0`` or ``P = 0``) is attention over the other side alone.
    Zero heads, a zero head dim, no key at all (``Lk + P = 0``) or a NaN or inf ``scale``
    raise ``ValueError``. The optional ``flash_attn`` and ``xformers`` backends run on CUDA
    when their library is installed and are chosen by name only, like ``sdpa_flash``,
    ``sdpa_cudnn`` and ``sdpa_efficient`` (the split path on SDPA's own CUDA kernels:
    fp16/bf16, and fp32 for ``sdpa_efficient``). ``replicated`` is SDPA over the prefix copied
    for every row, the baseline the others are measured against; ``prefix_grouper`` (CPU or
    CUDA, when the ``prefix-grouper`` library is installed) is that library's attention, also
    over a copied prefix, a peer contender in the benchmarks. ``auto`` first tries the backend
    that ``auto.yaml`` (measured per device name) lists for the device, head dim and pass (with
    or without gradients), then the default order.
    """
    _check_inputs(q, k, v, prefix_k, prefix_v)
    scale = _check_scale(scale)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, prefix_k, prefix_v))
    preferred = auto.listed_backend(q.device, q.shape[-1], grad) if backend == "auto" else ()
    chosen = resolve("prefix_attention", backend, q.device, _candidates(q, backend), preferred)
    if q.shape[0] * q.shape[2] == 0:
        return _no_rows(q, k, v, prefix_k, prefix_v)
    if chosen == "reference":
        return naive.prefix_attention(q, k, v, prefix_k, prefix_v, scale=scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _FAST[chosen](q, k, v, prefix_k, prefix_v, scale)
