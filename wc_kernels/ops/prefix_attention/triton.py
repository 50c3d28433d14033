"""Fused Triton attention over one shared prefix KV plus each row's own keys: forward, backward.

Shapes: ``q`` ``[B, H, L, D]``, ``k, v`` ``[B, H, Lk, D]`` (row ``b``'s own keys),
``prefix_k, prefix_v`` ``[1, H, P, D]`` (one copy for all rows). Row ``b`` attends to
``cat(prefix, k[b])`` without a mask; ``Lk`` or ``P`` may be 0.

Forward: one program per (query tile, row, head) runs a single online-softmax pass over the
prefix keys and then over the row's own keys. This is the Hydragen split (prefix partial plus
own-keys partial, merged by log-sum-exp) with the merge folded into the running max and sum of
the online softmax: no partial outputs are written, no merge pass runs, and an empty key set is
a loop of zero iterations (weight 0, never NaN). The prefix is read straight from its single
copy by every query tile, never replicated per row. It writes the output and the natural-log
LSE ``[B, H, L]`` (fp32), which the backward needs.

Backward (flash-attention 2, given the final output ``O`` and LSE, which are those of the
merged attention, so each key set's gradient is its ordinary attention backward):

1. ``dq`` kernel, per query tile: ``delta = rowsum(dO * O)`` (stored for step 2) and
   ``dq = scale * sum_keys dS k`` over the prefix then the own keys, with
   ``P = exp(scale q k^T - lse)`` and ``dS = P * (dO v^T - delta)``;
2. ``dk, dv`` kernel, per key tile: ``dv = P^T dO`` and ``dk = scale dS^T q`` summed over the
   queries that see the tile. Own keys: the row's ``L`` queries. Prefix keys: all ``B*L``
   queries of the head, i.e. the rows folded into one sequence (Hydragen), which sums the
   prefix gradient over rows without atomics. On a GPU the folded rows are cut into a few
   groups, one program per (key tile, group, head), so that a small ``P * H`` still fills the
   SMs; the groups' fp32 partial sums are then added (deterministically) by one ``sum``.

Numerics: softmax statistics and all accumulators in fp32, exponentials in base 2 with the
scale folded into ``log2(e)``. The matmul operands are the input dtype on the GPU: fp16/bf16
tensor cores, and TF32 ones for fp32 inputs, rounded to nearest in the kernel (about 1e-3
relative, as torch's TF32 matmuls; the 3-pass ``tf32x3`` spills registers at these tiles).
Under the interpreter they are fp32, since its fp16/bf16 arithmetic is not exact. fp64 is not
supported (the public op rejects it). Inputs may have any strides with a unit stride along ``D``
(others are copied); outputs and gradients are contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

from wc_kernels._triton import PROGRAMS_PER_SM, AotConfig, _sm_count, launchable, new_output

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
# Tiles under the interpreter: large, since every program instance and loop step costs time.
INTERPRET_MAX_BLOCK_M = 64
INTERPRET_MAX_BLOCK_N = 128
INTERPRET_ROW_GROUPS = 2


@dataclass(frozen=True)
class Tiles:
    """One kernel's CUDA tile shape, warp count and software-pipeline depth (Triton's
    ``num_stages``; 3 is its CUDA default)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 3


# CUDA tiles per (kernel, BLOCK_D, fp32 inputs?); fixed so that ``python -m wc_kernels.aot``
# compiles exactly what runs (checked there for register spills on sm_90, under Triton 3.6 and
# 3.9; CI runs both). fp32 dq at D=128 with the TF32 rounding of its operands: every tile with
# BLOCK_M >= 64 spills under Triton 3.6 (e.g. (128, 32, 8) at two stages: 156 bytes), while
# (32, 64, 8) at two stages compiles to 180 registers (3.6) and 172 (3.9) without spills, in
# 128 KB of shared memory. fp32 dkdv at D=128 runs 8 warps: at 4 the TF32 rounding of its
# operands spills 24 bytes (Triton 3.9).
GPU_TILES = {
    ("fwd", 32, False): Tiles(128, 64, 4),
    ("fwd", 64, False): Tiles(128, 64, 4),
    ("fwd", 128, False): Tiles(128, 64, 8),
    ("fwd", 32, True): Tiles(64, 64, 4),
    ("fwd", 64, True): Tiles(64, 64, 4),
    ("fwd", 128, True): Tiles(64, 32, 4),
    ("dq", 32, False): Tiles(128, 64, 4),
    ("dq", 64, False): Tiles(128, 64, 8),
    ("dq", 128, False): Tiles(128, 32, 8),
    ("dq", 32, True): Tiles(64, 64, 4),
    ("dq", 64, True): Tiles(64, 32, 4),
    ("dq", 128, True): Tiles(32, 64, 8, num_stages=2),
    ("dkdv", 32, False): Tiles(64, 64, 4),
    ("dkdv", 64, False): Tiles(32, 64, 4),
    ("dkdv", 128, False): Tiles(32, 64, 8),
    ("dkdv", 32, True): Tiles(32, 64, 4),
    ("dkdv", 64, True): Tiles(32, 64, 4),
    ("dkdv", 128, True): Tiles(32, 32, 8),
}
GPU_HEAD_BLOCKS = (32, 64, 128)


@triton.jit
def _operand(x, DOT: tl.constexpr, PREC: tl.constexpr):
    """``x`` as a matmul operand in ``DOT``. A TF32 operand is rounded here, to nearest with
    ties to even: the tensor cores read an fp32 register truncated to TF32, which doubles the
    worst rounding error and biases it (triton-lang/triton#4574); rounded, the error is that of
    torch's TF32 matmuls."""
    if DOT == tl.float32:
        if PREC == "tf32":
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + ((bits >> 13) & 1) + 0xFFF) & 0xFFFFE000
            return bits.to(tl.float32, bitcast=True)
    return x.to(DOT)


@triton.jit
def _fwd_key_set(acc, m_i, l_i, q, k_base, v_base, stride_kl, stride_vl, n_keys, qk_scale,
                 offs_d, d_mask, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
                 PREC: tl.constexpr):
    """Online-softmax update of ``(acc [BM, BD], m_i, l_i [BM])`` over ``n_keys`` keys.

    ``q`` ``[BM, BD]`` in ``DOT``; ``k_base, v_base`` point at key 0 of one head, keys
    ``stride_kl`` / ``stride_vl`` apart. ``m_i`` is the running max of the base-2 scores.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_keys, BLOCK_N):
        cols = start + offs_n
        col_mask = cols < n_keys
        kv_mask = col_mask[:, None] & d_mask[None, :]
        k = _operand(tl.load(k_base + cols[:, None] * stride_kl + offs_d[None, :],
                             mask=kv_mask, other=0.0), DOT, PREC)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        s = tl.where(col_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _operand(tl.load(v_base + cols[:, None] * stride_vl + offs_d[None, :],
                             mask=kv_mask, other=0.0), DOT, PREC)
        acc = acc * alpha[:, None] + tl.dot(_operand(p, DOT, PREC), v, input_precision=PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def prefix_attn_fwd_kernel(
        q_ptr, k_ptr, v_ptr, pk_ptr, pv_ptr, o_ptr, lse_ptr,
        stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl,
        stride_vb, stride_vh, stride_vl, stride_pkh, stride_pkl, stride_pvh, stride_pvl,
        n_heads, q_len, k_len, p_len, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Query tile ``program_id(0)`` of row ``b``, head ``h`` (``program_id(1) = b*H + h``).

    Writes ``o`` ``[B, H, L, D]`` and ``lse`` ``[B, H, L]`` (fp32, natural log), contiguous.
    """
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = rows < q_len
    d_mask = offs_d < HEAD_DIM
    q_mask = row_mask[:, None] & d_mask[None, :]
    q = _operand(tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_ql
                         + offs_d[None, :], mask=q_mask, other=0.0), DOT, PREC)
    # fp32 even when the launcher passes a Python float as fp64 (torch.compile does)
    scale = tl.cast(scale, tl.float32)
    qk_scale = scale * LOG2E  # base-2 exponentials
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, m_i, l_i = _fwd_key_set(acc, m_i, l_i, q, pk_ptr + h * stride_pkh,
                                 pv_ptr + h * stride_pvh, stride_pkl, stride_pvl, p_len,
                                 qk_scale, offs_d, d_mask, BLOCK_N, DOT, PREC)
    acc, m_i, l_i = _fwd_key_set(acc, m_i, l_i, q, k_ptr + b * stride_kb + h * stride_kh,
                                 v_ptr + b * stride_vb + h * stride_vh, stride_kl, stride_vl,
                                 k_len, qk_scale, offs_d, d_mask, BLOCK_N, DOT, PREC)
    out = acc / l_i[:, None]
    lse = (m_i + tl.log2(l_i)) * LN2
    seq = bh.to(tl.int64) * q_len
    tl.store(o_ptr + (seq + rows[:, None]) * HEAD_DIM + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=q_mask)
    tl.store(lse_ptr + seq + rows, lse, mask=row_mask)


@triton.jit
def _dq_key_set(dq, q, do, lse2, delta, k_base, v_base, stride_kl, stride_vl, n_keys,
                qk_scale, row_mask, offs_d, d_mask, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
                PREC: tl.constexpr):
    """``dq [BM, BD] += dS k`` (unscaled) over ``n_keys`` keys of one head.

    ``lse2`` is the LSE in base 2; ``delta = rowsum(dO * O)``; keys as in :func:`_fwd_key_set`.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_keys, BLOCK_N):
        cols = start + offs_n
        col_mask = cols < n_keys
        kv_mask = col_mask[:, None] & d_mask[None, :]
        k = _operand(tl.load(k_base + cols[:, None] * stride_kl + offs_d[None, :],
                             mask=kv_mask, other=0.0), DOT, PREC)
        v = _operand(tl.load(v_base + cols[:, None] * stride_vl + offs_d[None, :],
                             mask=kv_mask, other=0.0), DOT, PREC)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        p = tl.where(row_mask[:, None] & col_mask[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(_operand(ds, DOT, PREC), k, input_precision=PREC)
    return dq


@triton.jit
def prefix_attn_bwd_dq_kernel(
        q_ptr, k_ptr, v_ptr, pk_ptr, pv_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
        stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl,
        stride_vb, stride_vh, stride_vl, stride_pkh, stride_pkl, stride_pvh, stride_pvl,
        stride_dob, stride_doh, stride_dol, n_heads, q_len, k_len, p_len, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Query tile ``program_id(0)`` of ``program_id(1) = b*H + h``: writes ``delta`` and ``dq``.

    ``o, dq`` ``[B, H, L, D]`` and ``lse, delta`` ``[B, H, L]`` (fp32) contiguous; the others
    strided as in :func:`prefix_attn_fwd_kernel`.
    """
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = rows < q_len
    d_mask = offs_d < HEAD_DIM
    q_mask = row_mask[:, None] & d_mask[None, :]
    seq = bh.to(tl.int64) * q_len
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_ql
                + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows[:, None] * stride_dol
                 + offs_d[None, :], mask=q_mask, other=0.0).to(tl.float32)
    o = tl.load(o_ptr + (seq + rows[:, None]) * HEAD_DIM + offs_d[None, :], mask=q_mask,
                other=0.0).to(tl.float32)
    delta = tl.sum(do * o, axis=1)
    tl.store(delta_ptr + seq + rows, delta, mask=row_mask)
    lse2 = tl.load(lse_ptr + seq + rows, mask=row_mask, other=0.0) * LOG2E
    scale = tl.cast(scale, tl.float32)
    qk_scale = scale * LOG2E
    q = _operand(q, DOT, PREC)
    do = _operand(do, DOT, PREC)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dq = _dq_key_set(dq, q, do, lse2, delta, pk_ptr + h * stride_pkh, pv_ptr + h * stride_pvh,
                     stride_pkl, stride_pvl, p_len, qk_scale, row_mask, offs_d, d_mask,
                     BLOCK_N, DOT, PREC)
    dq = _dq_key_set(dq, q, do, lse2, delta, k_ptr + b * stride_kb + h * stride_kh,
                     v_ptr + b * stride_vb + h * stride_vh, stride_kl, stride_vl, k_len,
                     qk_scale, row_mask, offs_d, d_mask, BLOCK_N, DOT, PREC)
    tl.store(dq_ptr + (seq + rows[:, None]) * HEAD_DIM + offs_d[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def prefix_attn_bwd_dkdv_kernel(
        q_ptr, do_ptr, lse_ptr, delta_ptr, k_ptr, v_ptr, dk_ptr, dv_ptr,
        stride_qb, stride_qh, stride_ql, stride_dob, stride_doh, stride_dol,
        stride_kb, stride_kh, stride_kl, stride_vb, stride_vh, stride_vl,
        n_heads, q_len, n_keys, n_rows, rows_per_group, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """``dk, dv`` of key tile ``program_id(0)`` for row group ``g``, head ``h``
    (``program_id(1) = g*H + h``): summed over the ``L`` queries of rows
    ``g*rows_per_group .. min((g+1)*rows_per_group, n_rows) - 1``, into ``dk[g, h], dv[g, h]``.

    Own keys: ``k, v, dk, dv`` ``[B, H, Lk, D]``, one row per group. Prefix: ``k, v``
    ``[1, H, P, D]`` with ``stride_kb = stride_vb = 0`` (every group reads the one copy) and
    ``dk, dv`` ``[G, H, P, D]``: the rows folded into one query sequence, cut into ``G`` groups
    whose partial sums the launcher adds up. ``dk, dv`` contiguous; ``lse, delta`` ``[B, H, L]``
    fp32 contiguous.
    """
    pid_n = tl.program_id(0)
    gh = tl.program_id(1)
    group = (gh // n_heads).to(tl.int64)
    h = (gh % n_heads).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    col_mask = cols < n_keys
    d_mask = offs_d < HEAD_DIM
    kv_mask = col_mask[:, None] & d_mask[None, :]
    k = _operand(tl.load(k_ptr + group * stride_kb + h * stride_kh + cols[:, None] * stride_kl
                         + offs_d[None, :], mask=kv_mask, other=0.0), DOT, PREC)
    v = _operand(tl.load(v_ptr + group * stride_vb + h * stride_vh + cols[:, None] * stride_vl
                         + offs_d[None, :], mask=kv_mask, other=0.0), DOT, PREC)
    scale = tl.cast(scale, tl.float32)
    qk_scale = scale * LOG2E
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    first = group * rows_per_group
    for b in range(first, tl.minimum(first + rows_per_group, n_rows)):
        q_base = q_ptr + b * stride_qb + h * stride_qh
        do_base = do_ptr + b * stride_dob + h * stride_doh
        seq = (b * n_heads + h) * q_len
        for start in range(0, q_len, BLOCK_M):
            rows = start + offs_m
            row_mask = rows < q_len
            q_mask = row_mask[:, None] & d_mask[None, :]
            q = _operand(tl.load(q_base + rows[:, None] * stride_ql + offs_d[None, :],
                                 mask=q_mask, other=0.0), DOT, PREC)
            do = _operand(tl.load(do_base + rows[:, None] * stride_dol + offs_d[None, :],
                                  mask=q_mask, other=0.0), DOT, PREC)
            lse2 = tl.load(lse_ptr + seq + rows, mask=row_mask, other=0.0) * LOG2E
            delta = tl.load(delta_ptr + seq + rows, mask=row_mask, other=0.0)
            # Transposed scores [BN, BM]: keys along the rows, as dk and dv are laid out.
            s_t = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
            p_t = tl.exp2(s_t - lse2[None, :])
            p_t = tl.where(col_mask[:, None] & row_mask[None, :], p_t, 0.0)
            dv += tl.dot(_operand(p_t, DOT, PREC), do, input_precision=PREC)
            dp_t = tl.dot(v, tl.trans(do), input_precision=PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(_operand(ds_t, DOT, PREC), q, input_precision=PREC)
    out = (gh.to(tl.int64) * n_keys + cols[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptr + out, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


# Launchers ---------------------------------------------------------------------------------

def head_block(d: int) -> int:
    """``BLOCK_D``: the head dim padded to a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(d))


def _dot_type(dtype: torch.dtype, device: torch.device) -> tuple[tl.dtype, str]:
    """Matmul operand dtype and fp32 input precision (see the module docstring)."""
    if device.type != "cuda":
        return tl.float32, "ieee"
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}.get(dtype, tl.float32), "tf32"


def _tiles(kind: str, dtype: torch.dtype, d: int, q_len: int, n_keys: int,
           device: torch.device) -> Tiles:
    """Tiles of kernel ``kind`` (``fwd``, ``dq``, ``dkdv``): the fixed CUDA table, or under the
    interpreter the largest that ``q_len`` queries and ``n_keys`` keys need."""
    if device.type == "cuda":
        return GPU_TILES[kind, max(32, head_block(d)), dtype == torch.float32]
    block_m = min(INTERPRET_MAX_BLOCK_M, max(16, triton.next_power_of_2(q_len)))
    block_n = min(INTERPRET_MAX_BLOCK_N, max(16, triton.next_power_of_2(n_keys)))
    return Tiles(block_m, block_n, 4)


def _unit_last(t: Tensor) -> Tensor:
    """``t`` itself when its last dim is unit-strided (or of size 1), else a contiguous copy."""
    return t if t.shape[-1] == 1 or t.stride(-1) == 1 else t.contiguous()


def _check(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor) -> None:
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"triton prefix_attention supports float16, bfloat16 and float32, got "
                        f"{q.dtype}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"triton prefix_attention supports head dims up to {MAX_HEAD_DIM}, "
                         f"got {q.shape[-1]}")
    b, h, _, d = q.shape
    if k.shape[:2] != (b, h) or prefix_k.shape[:2] != (1, h) or v.shape != k.shape \
            or prefix_v.shape != prefix_k.shape or k.shape[3] != d or prefix_k.shape[3] != d:
        raise ValueError(f"prefix_attention: expected q [B, H, L, D], k/v [B, H, Lk, D], "
                         f"prefix_k/v [1, H, P, D]; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {tuple(prefix_k.shape)}, {tuple(prefix_v.shape)}")


def _key_sets(k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Unit-strided key sets; an empty one is replaced by the other (it is never read), so no
    kernel argument is a null pointer."""
    k, v, pk, pv = (_unit_last(t) for t in (k, v, prefix_k, prefix_v))
    if pk.shape[2] == 0:
        pk, pv = k, v
    if k.shape[2] == 0:
        k, v = pk, pv
    return k, v, pk, pv


def _strides3(t: Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def prefix_attention_fwd(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
                         scale: float) -> tuple[Tensor, Tensor]:
    """``(out [B, H, L, D] in q's dtype, lse [B, H, L] fp32)`` of attention over the prefix and
    the row's own keys (module docstring). ``L_k + P`` must be positive."""
    _check(q, k, v, prefix_k, prefix_v)
    b, h, lq, d = q.shape
    lk, p = k.shape[2], prefix_k.shape[2]
    q = _unit_last(q)
    k_, v_, pk, pv = _key_sets(k, v, prefix_k, prefix_v)
    out = new_output((b, h, lq, d), q.dtype, q.device)
    lse = new_output((b, h, lq), torch.float32, q.device)
    tiles = _tiles("fwd", q.dtype, d, lq, max(lk, p), q.device)
    dot, prec = _dot_type(q.dtype, q.device)
    grid = (triton.cdiv(lq, tiles.block_m), b * h)
    if lq > 0 and b > 0:
        launchable(prefix_attn_fwd_kernel, q, k_, v_, pk, pv)[grid](
            q, k_, v_, pk, pv, out, lse, *_strides3(q), *_strides3(k_), *_strides3(v_),
            pk.stride(1), pk.stride(2), pv.stride(1), pv.stride(2), h, lq, lk, p, scale,
            HEAD_DIM=d, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=head_block(d),
            DOT=dot, PREC=prec, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages)
    return out, lse


def prefix_attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                         prefix_v: Tensor, out: Tensor, lse: Tensor, scale: float
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv, dprefix_k, dprefix_v)`` (contiguous, in the inputs' dtype) from
    ``grad_out`` ``[B, H, L, D]`` and the forward's ``out`` and ``lse``; the prefix gradients
    are summed over rows."""
    _check(q, k, v, prefix_k, prefix_v)
    b, h, lq, d = q.shape
    lk, p = k.shape[2], prefix_k.shape[2]
    q, do = _unit_last(q), _unit_last(grad_out)
    out, lse = out.contiguous(), lse.contiguous()
    k_, v_, pk, pv = _key_sets(k, v, prefix_k, prefix_v)
    dot, prec = _dot_type(q.dtype, q.device)
    meta = {"HEAD_DIM": d, "BLOCK_D": head_block(d), "DOT": dot, "PREC": prec}
    dq = new_output((b, h, lq, d), q.dtype, q.device)
    delta = new_output((b, h, lq), torch.float32, q.device)
    if lq > 0 and b > 0:
        tiles = _tiles("dq", q.dtype, d, lq, max(lk, p), q.device)
        grid = (triton.cdiv(lq, tiles.block_m), b * h)
        launchable(prefix_attn_bwd_dq_kernel, q, k_, v_, pk, pv, out, do)[grid](
            q, k_, v_, pk, pv, out, do, lse, delta, dq, *_strides3(q), *_strides3(k_),
            *_strides3(v_), pk.stride(1), pk.stride(2), pv.stride(1), pv.stride(2),
            *_strides3(do), h, lq, lk, p, scale, BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, **meta)
    # Own keys: row b's key set gets the gradient of row b's queries alone.
    dk, dv = _dkdv(q, do, lse, delta, k_, v_, lk, b, 1, False, scale, meta)
    # Prefix: the folded rows are cut into groups whose fp32 partial sums are added here.
    groups = _prefix_row_groups(b, p, h, q.dtype, d, q.device)
    dpk, dpv = _dkdv(q, do, lse, delta, pk, pv, p, groups, triton.cdiv(b, groups), True, scale,
                     meta)
    if groups > 1:
        dpk, dpv = (t.sum(dim=0, keepdim=True).to(q.dtype) for t in (dpk, dpv))
    return dq, dk, dv, dpk, dpv


def _prefix_row_groups(b: int, p: int, h: int, dtype: torch.dtype, d: int,
                       device: torch.device) -> int:
    """Row groups of the prefix ``dk, dv`` kernel: on CUDA enough programs for
    ``PROGRAMS_PER_SM`` per SM (each group re-reads the prefix tile and adds a partial sum),
    two under the interpreter so that the tests cover the partial sums. No group is empty."""
    if device.type == "cuda":
        per_group = triton.cdiv(p, _tiles("dkdv", dtype, d, 1, p, device).block_n) * h
        groups = triton.cdiv(PROGRAMS_PER_SM * _sm_count(device.index or 0), max(per_group, 1))
    else:
        groups = INTERPRET_ROW_GROUPS
    groups = max(1, min(b, groups))
    return triton.cdiv(b, triton.cdiv(b, groups)) if b > 0 else 1


def _dkdv(q: Tensor, do: Tensor, lse: Tensor, delta: Tensor, keys: Tensor, values: Tensor,
          n: int, groups: int, rows_per_group: int, shared: bool, scale: float, meta: dict
          ) -> tuple[Tensor, Tensor]:
    """``dk, dv`` ``[groups, H, n, D]`` of ``n`` keys: row ``g``'s own keys ``[B, H, n, D]``
    (one row per group), or the ``shared`` prefix ``[1, H, n, D]`` read by every group. In
    ``q``'s dtype when each group's sum is a whole gradient, else fp32 partial sums."""
    b, h, lq, d = q.shape
    out_dtype = torch.float32 if shared and groups > 1 else q.dtype
    dk = new_output((groups, h, n, d), out_dtype, q.device)
    dv = new_output((groups, h, n, d), out_dtype, q.device)
    if n > 0 and groups > 0:
        tiles = _tiles("dkdv", q.dtype, d, lq, n, q.device)
        stride_kb, stride_vb = (0, 0) if shared else (keys.stride(0), values.stride(0))
        grid = (triton.cdiv(n, tiles.block_n), groups * h)
        launchable(prefix_attn_bwd_dkdv_kernel, q, do, keys, values)[grid](
            q, do, lse, delta, keys, values, dk, dv, *_strides3(q), *_strides3(do),
            stride_kb, keys.stride(1), keys.stride(2), stride_vb, values.stride(1),
            values.stride(2), h, lq, n, b, rows_per_group, scale, BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, **meta)
    return dk, dv


# AOT ---------------------------------------------------------------------------------------

_TL_DTYPES = {"fp16": tl.float16, "bf16": tl.bfloat16, "fp32": tl.float32}


def _aot_signature(names: list[str], pointers: dict[str, str], ints: tuple[str, ...]
                   ) -> dict[str, str]:
    sig = {}
    for name in names:
        if name in pointers:
            sig[name] = pointers[name]
        elif name == "scale":
            sig[name] = "fp32"
        elif name in ints:
            sig[name] = "i32"
        else:
            sig[name] = "constexpr"
    return sig


def aot_configs() -> list[AotConfig]:
    """Every CUDA launch of the forward and backward, per input dtype and ``BLOCK_D`` in
    ``GPU_HEAD_BLOCKS`` (at ``D = BLOCK_D``). ``dk, dv`` three ways: the prefix in one row group
    (gradients in the input dtype), the own keys (``rows_per_group = 1``, which Triton compiles
    as a constant at run time) and the prefix in several groups (fp32 partial sums). Pointers
    and strides are marked 16-aligned, as they are for the usual head dims."""
    configs = []
    for dtype, tl_dtype in _TL_DTYPES.items():
        fp32 = dtype == "fp32"
        for block_d in GPU_HEAD_BLOCKS:
            for kind, kernel in (("fwd", prefix_attn_fwd_kernel),
                                 ("dq", prefix_attn_bwd_dq_kernel),
                                 ("dkdv", prefix_attn_bwd_dkdv_kernel)):
                names = list(kernel.arg_names)
                ptrs = {n: f"*{dtype}" for n in names if n.endswith("_ptr")}
                ptrs.update({n: "*fp32" for n in ("lse_ptr", "delta_ptr") if n in ptrs})
                sizes = ("n_heads", "q_len", "k_len", "p_len", "n_keys", "n_rows",
                         "rows_per_group")
                ints = tuple(n for n in names if n.startswith("stride_")) + sizes
                tiles = GPU_TILES[kind, block_d, fp32]
                consts = {"HEAD_DIM": block_d, "BLOCK_M": tiles.block_m,
                          "BLOCK_N": tiles.block_n, "BLOCK_D": block_d,
                          "DOT": tl_dtype, "PREC": "tf32"}
                aligned = (*ptrs, *(n for n in ints if n.startswith("stride_")))
                config = AotConfig(kernel, dtype, f"D={block_d}",
                                   _aot_signature(names, ptrs, ints), consts, tiles.num_warps,
                                   aligned, tiles.num_stages)
                configs.append(config)
                if kind == "dkdv":
                    configs.append(config.with_unit("rows_per_group"))
                if kind == "dkdv" and not fp32:  # fp32 inputs: the partials are the same
                    partial = {**config.signature, "dk_ptr": "*fp32", "dv_ptr": "*fp32"}
                    configs.append(replace(config, variant=f"D={block_d}, fp32 partials",
                                           signature=partial))
    return configs
