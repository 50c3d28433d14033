"""Fused Triton NFT loss: per-sample loss and ``dL_i/dv_theta`` in one pass.

The math is docs/design.md section 7.

Per row ``i`` with ``D`` elements, ``d+ = v+ - v* = (1-b) v_old + b v_theta - v*`` and
``d- = v- - v* = (1+b) v_old - b v_theta - v*``. Both spaces share one form with per-row
coefficients ``c+ = r * k+`` and ``c- = (1-r) * k-``:

- ``L_i = (c+ * sum(d+^2) + c- * sum(d-^2)) / D``
- ``dL_i/dv_theta = (2b / D) * (c+ * d+ - c- * d-)``

with ``k = 1`` for ``space="velocity"`` and ``k = s^2 / w`` for ``space="x0"``, where
``w = max(s * mean|d|, 1e-5)`` (the detached mean absolute x0 error). So velocity is one pass
over the inputs, and x0 two: pass 1 reduces ``sum|d+|`` and ``sum|d-|`` per chunk, pass 2 is
the velocity kernel with the x0 coefficients. Rows are split into chunks (see
:mod:`wc_kernels._triton`); each chunk writes its part of the loss and the per-row sum is one
small ``torch.sum`` (deterministic, no atomics).

Loads are cast to fp32 (fp64 for fp64 inputs) before any arithmetic and the gradient is cast
back to the input dtype on store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from wc_kernels._dtypes import compute_dtype
from wc_kernels._triton import (
    AotConfig,
    check_operand,
    launchable,
    new_output,
    row_split,
    tl_acc,
)
from wc_kernels.ops.nft_loss.naive import X0_WEIGHT_FLOOR

GPU_BLOCK = 2048  # per loop step: 8 elements per thread, one 16-byte load for bf16
GPU_WARPS = 8


@triton.jit
def nft_abs_err_kernel(vt_ptr, vo_ptr, vs_ptr, part_ptr, beta, d, chunk, n_splits,
                       BLOCK: tl.constexpr, ACC: tl.constexpr):
    """x0 pass 1: ``part[i, c] = (sum|d+|, sum|d-|)`` over chunk ``c`` of row ``i``.

    ``vt, vo, vs`` ``[B, D]`` contiguous; ``part`` ``[B, n_splits, 2]`` in ``ACC``.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = row.to(tl.int64) * d
    start = split * chunk
    end = tl.minimum(start + chunk, d)
    b = tl.cast(beta, ACC)
    idx = tl.arange(0, BLOCK)
    sum_pos = tl.zeros([BLOCK], ACC)
    sum_neg = tl.zeros([BLOCK], ACC)
    for off in range(start, end, BLOCK):
        cols = off + idx
        mask = cols < end
        vt = tl.load(vt_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        vo = tl.load(vo_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        vs = tl.load(vs_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        sum_pos += tl.abs((1.0 - b) * vo + b * vt - vs)
        sum_neg += tl.abs((1.0 + b) * vo - b * vt - vs)
    out = part_ptr + (row.to(tl.int64) * n_splits + split) * 2
    tl.store(out, tl.sum(sum_pos, axis=0))
    tl.store(out + 1, tl.sum(sum_neg, axis=0))


@triton.jit
def nft_loss_grad_kernel(vt_ptr, vo_ptr, vs_ptr, r_ptr, k_ptr, grad_ptr, part_ptr, beta,
                         grad_scale, d, chunk, n_splits, HAS_K: tl.constexpr,
                         BLOCK: tl.constexpr, ACC: tl.constexpr):
    """Loss part of chunk ``c`` of row ``i`` into ``part[i, c]`` and that chunk's gradient
    times ``grad_scale``.

    ``vt, vo, vs, grad`` ``[B, D]`` contiguous; ``r`` ``[B]`` fp32; ``k`` ``[B, 2]`` in ``ACC``
    (``k+, k-``; read only when ``HAS_K``, else 1); ``part`` ``[B, n_splits]`` in ``ACC``.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = row.to(tl.int64) * d
    start = split * chunk
    end = tl.minimum(start + chunk, d)
    b = tl.cast(beta, ACC)
    r = tl.load(r_ptr + row).to(ACC)
    c_pos = r
    c_neg = 1.0 - r
    if HAS_K:
        c_pos = c_pos * tl.load(k_ptr + row * 2).to(ACC)
        c_neg = c_neg * tl.load(k_ptr + row * 2 + 1).to(ACC)
    inv_d = 1.0 / tl.cast(d, ACC)
    scale = tl.cast(grad_scale, ACC)
    g_pos = 2.0 * b * inv_d * c_pos * scale
    g_neg = 2.0 * b * inv_d * c_neg * scale
    idx = tl.arange(0, BLOCK)
    sq_pos = tl.zeros([BLOCK], ACC)
    sq_neg = tl.zeros([BLOCK], ACC)
    for off in range(start, end, BLOCK):
        cols = off + idx
        mask = cols < end
        vt = tl.load(vt_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        vo = tl.load(vo_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        vs = tl.load(vs_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        d_pos = (1.0 - b) * vo + b * vt - vs
        d_neg = (1.0 + b) * vo - b * vt - vs
        sq_pos += d_pos * d_pos
        sq_neg += d_neg * d_neg
        grad = g_pos * d_pos - g_neg * d_neg
        tl.store(grad_ptr + base + cols, grad.to(grad_ptr.dtype.element_ty), mask=mask)
    loss = (c_pos * tl.sum(sq_pos, axis=0) + c_neg * tl.sum(sq_neg, axis=0)) * inv_d
    tl.store(part_ptr + row.to(tl.int64) * n_splits + split, loss)


def _check(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor, sigma: Tensor | None,
           x0: bool) -> None:
    if v_theta.dim() != 2:
        raise ValueError(f"nft_loss_fwd: v_theta must be [B, D], got {tuple(v_theta.shape)}")
    rows, d = v_theta.shape
    for name, t in (("v_old", v_old), ("v_target", v_target)):
        check_operand("nft_loss_fwd", name, t, (rows, d), "v_theta", v_theta, same_dtype=True)
    check_operand("nft_loss_fwd", "r", r, (rows,), "v_theta", v_theta, same_dtype=False)
    if x0:
        if sigma is None:
            raise ValueError("nft_loss_fwd: sigma [B] is required when x0=True")
        check_operand("nft_loss_fwd", "sigma", sigma, (rows,), "v_theta", v_theta,
                      same_dtype=False)


def nft_loss_fwd(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor,
                 sigma: Tensor | None, beta: float, x0: bool, grad_scale: float = 1.0
                 ) -> tuple[Tensor, Tensor]:
    """Per-sample NFT loss ``[B]`` and its gradient w.r.t. ``v_theta`` ``[B, D]`` times
    ``grad_scale``.

    ``v_theta, v_old, v_target`` ``[B, D]`` of one dtype (non-contiguous ones are copied),
    ``r, sigma`` ``[B]`` (cast to fp32; ``sigma`` is read only when ``x0``). Returns the loss
    in fp32 (fp64 for fp64 inputs) and ``grad[i] = grad_scale * dL_i/dv_theta[i]`` in
    ``v_theta``'s dtype.
    Same contract as ``wc_kernels._native.nft_loss_fwd``.
    """
    _check(v_theta, v_old, v_target, r, sigma, x0)
    vt, vo, vs = v_theta.contiguous(), v_old.contiguous(), v_target.contiguous()
    rows, d = vt.shape
    acc = compute_dtype(vt.dtype)
    cfg = row_split(rows, d, vt.device, GPU_BLOCK, GPU_WARPS)
    grid = (rows, cfg.n_splits)
    r32 = r.to(torch.float32).contiguous()
    k = r32  # not read in velocity space (HAS_K=False)
    if x0:
        sums = new_output((rows, cfg.n_splits, 2), acc, vt.device)
        launchable(nft_abs_err_kernel, vt, vo, vs)[grid](
            vt, vo, vs, sums, beta, d, cfg.chunk, cfg.n_splits,
            BLOCK=cfg.block, ACC=tl_acc(vt.dtype), num_warps=cfg.num_warps)
        s = sigma.to(torch.float32).to(acc).unsqueeze(1)
        w = (s * sums.sum(dim=1) / d).clamp_min(X0_WEIGHT_FLOOR)
        k = (s * s / w).contiguous()
    grad = new_output(vt.shape, vt.dtype, vt.device)
    part = new_output((rows, cfg.n_splits), acc, vt.device)
    launchable(nft_loss_grad_kernel, vt, vo, vs, r32, k)[grid](
        vt, vo, vs, r32, k, grad, part, beta, grad_scale, d, cfg.chunk, cfg.n_splits,
        HAS_K=x0, BLOCK=cfg.block, ACC=tl_acc(vt.dtype), num_warps=cfg.num_warps)
    return part.sum(dim=1), grad


def aot_configs() -> list[AotConfig]:
    """Every CUDA launch of :func:`nft_loss_fwd`: per input dtype, pass 1 of x0 and the loss
    kernel for each space; each also with one chunk per row (``n_splits=1``, many rows)."""
    configs = []
    for dtype in ("fp32", "fp16", "bf16"):
        inputs = {"vt_ptr": f"*{dtype}", "vo_ptr": f"*{dtype}", "vs_ptr": f"*{dtype}"}
        sizes = {"beta": "fp32", "d": "i32", "chunk": "i32", "n_splits": "i32"}
        loss_sizes = {"beta": "fp32", "grad_scale": "fp32", "d": "i32", "chunk": "i32",
                      "n_splits": "i32"}
        consts = {"BLOCK": GPU_BLOCK, "ACC": tl.float32}
        meta = {"BLOCK": "constexpr", "ACC": "constexpr"}
        aligned = (*inputs, "part_ptr", "d", "chunk")
        configs.append(AotConfig(
            nft_abs_err_kernel, dtype, "x0 pass 1",
            {**inputs, "part_ptr": "*fp32", **sizes, **meta}, consts, GPU_WARPS, aligned))
        for x0 in (False, True):
            configs.append(AotConfig(
                nft_loss_grad_kernel, dtype, "x0 pass 2" if x0 else "velocity",
                {**inputs, "r_ptr": "*fp32", "k_ptr": "*fp32", "grad_ptr": f"*{dtype}",
                 "part_ptr": "*fp32", **loss_sizes, "HAS_K": "constexpr", **meta},
                {**consts, "HAS_K": x0}, GPU_WARPS,
                (*aligned, "r_ptr", "k_ptr", "grad_ptr")))
    return configs + [c.with_unit("n_splits") for c in configs]
