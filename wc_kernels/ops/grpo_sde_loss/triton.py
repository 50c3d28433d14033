"""Fused Triton kernels of the GRPO SDE loss: per-row residual sums, and their gradient.

Per row ``i`` with ``D`` elements and per-row coefficients ``a, c`` (the SDE step's mean is
``a * sample + c * model_output``, see :mod:`wc_kernels.grpo_sde_loss`):

- ``S1 = sum((prev_sample - a * sample - c * model_output)^2)`` (log_prob's residual),
- ``S2 = sum((model_output - ref_output)^2)`` (the KL's, since ``mean - mean_ref = c (m - r)``).

Everything else of the loss (log-probability, ratio, clipping, KL weight) is arithmetic on
``[B]`` tensors that autograd differentiates; the backward kernel receives per-row weights
``w1 = dL/dS1 * (-2c)`` and ``w2 = dL/dS2 * 2`` and writes
``dL/dmodel_output = w1 * residual + w2 * (model_output - ref_output)``.

Two passes (sums, then gradient), rather than one pass writing ``d(log_prob)/d(model_output)``
to be scaled by a per-row factor afterwards: the factor depends on the row's ratio and clip
state, known only once the whole row is summed, so the one-pass scheme needs a second pass
too (read and write the stored gradient), and with a reference output two stored terms. The
two-pass scheme instead keeps the forward free of writes (``sde_log_prob`` and no-grad
evaluation read the inputs once and write nothing), holds no ``[B, D]`` buffer between
forward and backward, and costs about the same traffic: the backward re-reads the three (four)
inputs instead of reading back and rewriting a stored gradient.

Rows are split into chunks (see :mod:`wc_kernels._triton`); each chunk writes its partial sums
and the per-row sum is one small ``torch.sum`` (deterministic, no atomics). Loads are cast to
fp32 (fp64 for fp64 inputs) before any arithmetic; the gradient is cast to the input dtype on
store.
"""

from __future__ import annotations

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

GPU_BLOCK = 2048  # per loop step: 8 elements per thread, one 16-byte load for bf16
GPU_WARPS = 8


@triton.jit
def sde_sums_kernel(m_ptr, x_ptr, p_ptr, r_ptr, coef_ptr, part_ptr, d, chunk, n_splits,
                    HAS_REF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr):
    """``part[i, c] = (S1, S2)`` over chunk ``c`` of row ``i`` (``S2 = 0`` without a ref).

    ``m, x, p, r`` ``[B, D]`` contiguous (``r`` read only when ``HAS_REF``); ``coef``
    ``[B, 2]`` (``a, c``) and ``part`` ``[B, n_splits, 2]`` in ``ACC``.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = row.to(tl.int64) * d
    start = split * chunk
    end = tl.minimum(start + chunk, d)
    a = tl.load(coef_ptr + row * 2).to(ACC)
    c = tl.load(coef_ptr + row * 2 + 1).to(ACC)
    idx = tl.arange(0, BLOCK)
    sq_res = tl.zeros([BLOCK], ACC)
    sq_ref = tl.zeros([BLOCK], ACC)
    for off in range(start, end, BLOCK):
        cols = off + idx
        mask = cols < end
        m = tl.load(m_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        p = tl.load(p_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        res = p - a * x - c * m
        sq_res += res * res
        if HAS_REF:
            delta = m - tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(ACC)
            sq_ref += delta * delta
    out = part_ptr + (row.to(tl.int64) * n_splits + split) * 2
    tl.store(out, tl.sum(sq_res, axis=0))
    tl.store(out + 1, tl.sum(sq_ref, axis=0))


@triton.jit
def sde_grad_kernel(m_ptr, x_ptr, p_ptr, r_ptr, coef_ptr, w_ptr, grad_ptr, d, chunk,
                    HAS_REF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr):
    """``grad = w1 * (p - a x - c m) + w2 * (m - r)`` over chunk ``c`` of row ``i``.

    ``m, x, p, r, grad`` ``[B, D]`` contiguous (``r`` read only when ``HAS_REF``); ``coef``
    (``a, c``) and ``w`` (``w1, w2``) ``[B, 2]`` in ``ACC``.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = row.to(tl.int64) * d
    start = split * chunk
    end = tl.minimum(start + chunk, d)
    a = tl.load(coef_ptr + row * 2).to(ACC)
    c = tl.load(coef_ptr + row * 2 + 1).to(ACC)
    w1 = tl.load(w_ptr + row * 2).to(ACC)
    w2 = tl.load(w_ptr + row * 2 + 1).to(ACC)
    idx = tl.arange(0, BLOCK)
    for off in range(start, end, BLOCK):
        cols = off + idx
        mask = cols < end
        m = tl.load(m_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        p = tl.load(p_ptr + base + cols, mask=mask, other=0.0).to(ACC)
        grad = w1 * (p - a * x - c * m)
        if HAS_REF:
            grad += w2 * (m - tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(ACC))
        tl.store(grad_ptr + base + cols, grad.to(grad_ptr.dtype.element_ty), mask=mask)


def _check(op: str, model_output: Tensor, sample: Tensor, prev_sample: Tensor,
           ref_output: Tensor | None, coef: Tensor) -> None:
    if model_output.dim() != 2:
        raise ValueError(f"{op}: model_output must be [B, D], got {tuple(model_output.shape)}")
    rows, d = model_output.shape
    named = (("sample", sample), ("prev_sample", prev_sample), ("ref_output", ref_output))
    for name, t in named:
        if t is not None:
            check_operand(op, name, t, (rows, d), "model_output", model_output, same_dtype=True)
    check_operand(op, "coef", coef, (rows, 2), "model_output", model_output, same_dtype=False)


def _prepared(model_output: Tensor, sample: Tensor, prev_sample: Tensor,
              ref_output: Tensor | None, coef: Tensor) -> tuple:
    """Contiguous inputs, ``ref`` (``m`` itself when absent: never read), ``[B, 2]`` in the
    compute dtype, and the row split."""
    m, x, p = model_output.contiguous(), sample.contiguous(), prev_sample.contiguous()
    r = m if ref_output is None else ref_output.contiguous()
    acc = compute_dtype(m.dtype)
    cfg = row_split(m.shape[0], m.shape[1], m.device, GPU_BLOCK, GPU_WARPS)
    return m, x, p, r, coef.to(acc).contiguous(), cfg


def sde_residual_sums(model_output: Tensor, sample: Tensor, prev_sample: Tensor,
                      ref_output: Tensor | None, coef: Tensor) -> Tensor:
    """Per-row ``(S1, S2)`` ``[B, 2]`` in fp32 (fp64 for fp64 inputs); see the module doc.

    ``model_output, sample, prev_sample, ref_output`` ``[B, D]`` of one dtype (non-contiguous
    ones are copied), ``coef`` ``[B, 2]`` holds ``(a, c)`` per row. ``S2 = 0`` without
    ``ref_output``.
    """
    _check("sde_residual_sums", model_output, sample, prev_sample, ref_output, coef)
    m, x, p, r, k, cfg = _prepared(model_output, sample, prev_sample, ref_output, coef)
    rows = m.shape[0]
    part = new_output((rows, cfg.n_splits, 2), k.dtype, m.device)
    launchable(sde_sums_kernel, m, x, p, r, k)[(rows, cfg.n_splits)](
        m, x, p, r, k, part, m.shape[1], cfg.chunk, cfg.n_splits,
        HAS_REF=ref_output is not None, BLOCK=cfg.block, ACC=tl_acc(m.dtype),
        num_warps=cfg.num_warps)
    return part.sum(dim=1)


def sde_residual_sums_bwd(weights: Tensor, model_output: Tensor, sample: Tensor,
                          prev_sample: Tensor, ref_output: Tensor | None, coef: Tensor
                          ) -> Tensor:
    """``w1 * residual + w2 * (model_output - ref_output)`` ``[B, D]`` in model_output's dtype,
    with ``weights`` ``[B, 2]`` = ``(w1, w2)`` per row (``w2`` unused without a ref)."""
    _check("sde_residual_sums_bwd", model_output, sample, prev_sample, ref_output, coef)
    check_operand("sde_residual_sums_bwd", "weights", weights, coef.shape, "model_output",
                  model_output, same_dtype=False)
    m, x, p, r, k, cfg = _prepared(model_output, sample, prev_sample, ref_output, coef)
    w = weights.to(k.dtype).contiguous()
    grad = new_output(m.shape, m.dtype, m.device)
    launchable(sde_grad_kernel, m, x, p, r, k, w)[(m.shape[0], cfg.n_splits)](
        m, x, p, r, k, w, grad, m.shape[1], cfg.chunk, HAS_REF=ref_output is not None,
        BLOCK=cfg.block, ACC=tl_acc(m.dtype), num_warps=cfg.num_warps)
    return grad


def aot_configs() -> list[AotConfig]:
    """Every CUDA launch of the two launchers: per input dtype, with and without a reference
    output; each also with one chunk per row (``n_splits=1``) for the sums kernel."""
    configs = []
    for dtype in ("fp32", "fp16", "bf16"):
        inputs = {"m_ptr": f"*{dtype}", "x_ptr": f"*{dtype}", "p_ptr": f"*{dtype}",
                  "r_ptr": f"*{dtype}", "coef_ptr": "*fp32"}
        meta = {"HAS_REF": "constexpr", "BLOCK": "constexpr", "ACC": "constexpr"}
        aligned = (*inputs, "d", "chunk")
        for has_ref in (False, True):
            consts = {"HAS_REF": has_ref, "BLOCK": GPU_BLOCK, "ACC": tl.float32}
            variant = "with ref" if has_ref else "no ref"
            configs.append(AotConfig(
                sde_sums_kernel, dtype, variant,
                {**inputs, "part_ptr": "*fp32", "d": "i32", "chunk": "i32", "n_splits": "i32",
                 **meta}, consts, GPU_WARPS, (*aligned, "part_ptr")))
            configs.append(AotConfig(
                sde_grad_kernel, dtype, variant,
                {**inputs, "w_ptr": "*fp32", "grad_ptr": f"*{dtype}", "d": "i32",
                 "chunk": "i32", **meta}, consts, GPU_WARPS, (*aligned, "w_ptr", "grad_ptr")))
    return configs + [c.with_unit("n_splits") for c in configs if c.kernel is sde_sums_kernel]
