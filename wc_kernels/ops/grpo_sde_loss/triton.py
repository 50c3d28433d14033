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

GPU_BLOCK = 2048  # per loop step: 8 elements per thread, one 16-byte load for bf16
GPU_WARPS = 8
EPILOGUE_MAX_BLOCK = 1024  # rows per loop step of the one-program epilogue
EPILOGUE_WARPS = 4


@triton.jit
def sde_step(sig, sig_next, noise_level, sigma_max, HAS_SIGMA_MAX: tl.constexpr):
    """The SDE step of ``sigma -> sigma_next`` (docs/design.md section 4.1): ``std``,
    ``var = std^2``, ``dt``, and the mean's coefficients ``a, c`` (mean ``a x + c m``)."""
    if HAS_SIGMA_MAX:
        s = tl.where(sig == 1.0, sigma_max, sig)
    else:
        s = sig
    std = noise_level * tl.sqrt(sig / (1.0 - s))
    var = std * std
    dt = sig_next - sig
    a = 1.0 + var / (2.0 * sig) * dt
    c = (1.0 + var * (1.0 - sig) / (2.0 * sig)) * dt
    return std, var, dt, a, c


@triton.jit
def _row_coefficients(row, coef_ptr, sig_ptr, sig_next_ptr, noise_level, sigma_max,
                      STEP: tl.constexpr, HAS_SIGMA_MAX: tl.constexpr, ACC: tl.constexpr):
    """``(a, c)`` of ``row``: from ``coef [B, 2]``, or (``STEP``) from its sigmas."""
    if STEP:
        _, _, _, a, c = sde_step(tl.load(sig_ptr + row).to(ACC),
                                 tl.load(sig_next_ptr + row).to(ACC), noise_level, sigma_max,
                                 HAS_SIGMA_MAX)
    else:
        a = tl.load(coef_ptr + row * 2).to(ACC)
        c = tl.load(coef_ptr + row * 2 + 1).to(ACC)
    return a, c


@triton.jit
def sde_sums_kernel(m_ptr, x_ptr, p_ptr, r_ptr, coef_ptr, sig_ptr, sig_next_ptr, part_ptr,
                    noise_level, sigma_max, d, chunk, n_splits, HAS_REF: tl.constexpr,
                    STEP: tl.constexpr, HAS_SIGMA_MAX: tl.constexpr, BLOCK: tl.constexpr,
                    ACC: tl.constexpr):
    """``part[i, c] = (S1, S2)`` over chunk ``c`` of row ``i`` (``S2 = 0`` without a ref).

    ``m, x, p, r`` ``[B, D]`` contiguous (``r`` read only when ``HAS_REF``); ``(a, c)`` from
    ``coef [B, 2]``, or with ``STEP`` from ``sig, sig_next [B]`` fp32; ``part``
    ``[B, n_splits, 2]`` in ``ACC``.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = row.to(tl.int64) * d
    start = split * chunk
    end = tl.minimum(start + chunk, d)
    a, c = _row_coefficients(row, coef_ptr, sig_ptr, sig_next_ptr, noise_level, sigma_max,
                             STEP, HAS_SIGMA_MAX, ACC)
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
def grpo_epilogue_kernel(part_ptr, sig_ptr, sig_next_ptr, old_ptr, adv_ptr, loss_ptr, lp_ptr,
                         kl_ptr, w_ptr, noise_level, sigma_max, clip_range, adv_clip_max,
                         kl_beta, b, d, n_splits, HAS_SIGMA_MAX: tl.constexpr,
                         BLOCK_B: tl.constexpr, ACC: tl.constexpr):
    """One program over all ``b`` rows: from the partial sums ``part [B, n_splits, 2]``, the
    log-probability, KL, PPO-clipped loss and the backward's row weights.

    ``lp, kl [B]``, ``loss []`` (mean clipped objective + ``kl_beta`` mean KL) in ``ACC``;
    ``w [B, 2] = (dL/dS1 * -2c, dL/dS2 * 2)``, with torch's subgradients: ``max`` splits a tie
    in half, ``clamp`` passes the gradient at its bounds.
    """
    total = tl.zeros([BLOCK_B], ACC)
    for start in range(0, b, BLOCK_B):
        rows = start + tl.arange(0, BLOCK_B)
        mask = rows < b
        s1 = tl.zeros([BLOCK_B], ACC)
        s2 = tl.zeros([BLOCK_B], ACC)
        for split in range(0, n_splits):
            at = part_ptr + (rows.to(tl.int64) * n_splits + split) * 2
            s1 += tl.load(at, mask=mask, other=0.0).to(ACC)
            s2 += tl.load(at + 1, mask=mask, other=0.0).to(ACC)
        sig = tl.load(sig_ptr + rows, mask=mask, other=0.5).to(ACC)
        sig_next = tl.load(sig_next_ptr + rows, mask=mask, other=0.25).to(ACC)
        std, var, dt, a, c = sde_step(sig, sig_next, noise_level, sigma_max, HAS_SIGMA_MAX)
        neg_dt = -dt
        lp = (-s1 / (2.0 * d * var * neg_dt) - tl.log(std * tl.sqrt(neg_dt))
              - 0.9189385332046727)  # log(sqrt(2 pi))
        kl = c * c * s2 / (2.0 * d * var)
        ratio = tl.exp(lp - tl.load(old_ptr + rows, mask=mask, other=0.0).to(ACC))
        adv = tl.load(adv_ptr + rows, mask=mask, other=0.0).to(ACC)
        adv = tl.minimum(tl.maximum(adv, -adv_clip_max), adv_clip_max)
        clipped = tl.minimum(tl.maximum(ratio, 1.0 - clip_range), 1.0 + clip_range)
        u = -adv * ratio
        v = -adv * clipped
        per_sample = tl.maximum(u, v)
        total += tl.where(mask, per_sample + kl_beta * kl, 0.0)
        g_u = tl.where(u > v, 1.0, tl.where(u == v, 0.5, 0.0))
        inside = (ratio >= 1.0 - clip_range) & (ratio <= 1.0 + clip_range)
        d_ratio = -adv * (g_u + tl.where(inside, 1.0 - g_u, 0.0))
        d_s1 = d_ratio * ratio * (-1.0 / (2.0 * d * var * neg_dt)) / b
        d_s2 = kl_beta * c * c / (2.0 * d * var) / b
        tl.store(lp_ptr + rows, lp, mask=mask)
        tl.store(kl_ptr + rows, kl, mask=mask)
        tl.store(w_ptr + rows * 2, d_s1 * (-2.0 * c), mask=mask)
        tl.store(w_ptr + rows * 2 + 1, d_s2 * 2.0, mask=mask)
    tl.store(loss_ptr, tl.sum(total, axis=0) / b)


@triton.jit
def sde_grad_kernel(m_ptr, x_ptr, p_ptr, r_ptr, coef_ptr, sig_ptr, sig_next_ptr, w_ptr,
                    up_ptr, grad_ptr, noise_level, sigma_max, d, chunk, HAS_REF: tl.constexpr,
                    STEP: tl.constexpr, HAS_SIGMA_MAX: tl.constexpr, SCALED: tl.constexpr,
                    BLOCK: tl.constexpr, ACC: tl.constexpr):
    """``grad = u * (w1 * (p - a x - c m) + w2 * (m - r))`` over chunk ``c`` of row ``i``.

    ``m, x, p, r, grad`` ``[B, D]`` contiguous (``r`` read only when ``HAS_REF``); ``(a, c)``
    as in :func:`sde_sums_kernel`; ``w`` (``w1, w2``) ``[B, 2]`` in ``ACC``; ``u`` the
    upstream gradient ``up[0]`` with ``SCALED``, else 1.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = row.to(tl.int64) * d
    start = split * chunk
    end = tl.minimum(start + chunk, d)
    a, c = _row_coefficients(row, coef_ptr, sig_ptr, sig_next_ptr, noise_level, sigma_max,
                             STEP, HAS_SIGMA_MAX, ACC)
    w1 = tl.load(w_ptr + row * 2).to(ACC)
    w2 = tl.load(w_ptr + row * 2 + 1).to(ACC)
    if SCALED:
        up = tl.load(up_ptr).to(ACC)
        w1 *= up
        w2 *= up
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
    return _partial_sums(m, x, p, r, ref_output is not None, cfg, coef=k).sum(dim=1)


def _partial_sums(m: Tensor, x: Tensor, p: Tensor, r: Tensor, has_ref: bool, cfg,
                  *, coef: Tensor | None = None, step: tuple | None = None) -> Tensor:
    """``part [B, n_splits, 2]`` of :func:`sde_sums_kernel`, the coefficients from ``coef``
    or from ``step = (sigma, sigma_next, noise_level, sigma_max)``."""
    rows = m.shape[0]
    acc = compute_dtype(m.dtype)
    part = new_output((rows, cfg.n_splits, 2), acc, m.device)
    sig, sig_next, noise_level, sigma_max = step or (m, m, 0.0, None)
    k = m if coef is None else coef
    launchable(sde_sums_kernel, m, x, p, r, k, sig, sig_next)[(rows, cfg.n_splits)](
        m, x, p, r, k, sig, sig_next, part, noise_level,
        0.0 if sigma_max is None else sigma_max, m.shape[1], cfg.chunk, cfg.n_splits,
        HAS_REF=has_ref, STEP=step is not None, HAS_SIGMA_MAX=sigma_max is not None,
        BLOCK=cfg.block, ACC=tl_acc(m.dtype), num_warps=cfg.num_warps)
    return part


def _gradient(weights: Tensor, m: Tensor, x: Tensor, p: Tensor, r: Tensor, has_ref: bool, cfg,
              *, coef: Tensor | None = None, step: tuple | None = None,
              upstream: Tensor | None = None) -> Tensor:
    """:func:`sde_grad_kernel`'s gradient ``[B, D]``, the coefficients as in
    :func:`_partial_sums`, the weights times ``upstream`` (a one-element tensor) if given."""
    grad = new_output(m.shape, m.dtype, m.device)
    sig, sig_next, noise_level, sigma_max = step or (m, m, 0.0, None)
    k = m if coef is None else coef
    up = weights if upstream is None else upstream
    launchable(sde_grad_kernel, m, x, p, r, k, sig, sig_next, weights, up)[
        (m.shape[0], cfg.n_splits)](
        m, x, p, r, k, sig, sig_next, weights, up, grad, noise_level,
        0.0 if sigma_max is None else sigma_max, m.shape[1], cfg.chunk, HAS_REF=has_ref,
        STEP=step is not None, HAS_SIGMA_MAX=sigma_max is not None,
        SCALED=upstream is not None, BLOCK=cfg.block, ACC=tl_acc(m.dtype),
        num_warps=cfg.num_warps)
    return grad


def sde_residual_sums_bwd(weights: Tensor, model_output: Tensor, sample: Tensor,
                          prev_sample: Tensor, ref_output: Tensor | None, coef: Tensor
                          ) -> Tensor:
    """``w1 * residual + w2 * (model_output - ref_output)`` ``[B, D]`` in model_output's dtype,
    with ``weights`` ``[B, 2]`` = ``(w1, w2)`` per row (``w2`` unused without a ref)."""
    _check("sde_residual_sums_bwd", model_output, sample, prev_sample, ref_output, coef)
    check_operand("sde_residual_sums_bwd", "weights", weights, coef.shape, "model_output",
                  model_output, same_dtype=False)
    m, x, p, r, k, cfg = _prepared(model_output, sample, prev_sample, ref_output, coef)
    return _gradient(weights.to(k.dtype).contiguous(), m, x, p, r, ref_output is not None, cfg,
                     coef=k)


def _rows(*tensors: Tensor | None) -> list[Tensor | None]:
    """``[B, ...]`` tensors as contiguous ``[B, D]`` rows (None stays None)."""
    return [None if t is None else t.reshape(t.shape[0], -1).contiguous() for t in tensors]


def _fp32(*tensors: Tensor) -> list[Tensor]:
    return [t.to(torch.float32).contiguous() for t in tensors]


def grpo_loss_fwd(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                  sigma_next: Tensor, old_log_prob: Tensor, advantage: Tensor,
                  ref_output: Tensor | None, noise_level: float, sigma_max: float | None,
                  clip_range: float, adv_clip_max: float, kl_beta: float
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GRPO's loss in two kernels: ``(loss [], log_prob [B], kl [B], weights [B, 2])`` in fp32
    (fp64 for fp64 inputs), ``weights`` the backward's row weights for ``loss``
    (:func:`grpo_epilogue_kernel`). ``[B, ...]`` tensors of one dtype; ``sigma, sigma_next,
    old_log_prob, advantage`` ``[B]`` (read in fp32); the float arguments as in
    :func:`wc_kernels.grpo_sde_loss` (``sigma_max`` None: no substitution at ``sigma == 1``)."""
    m, x, p, r = _rows(model_output, sample, prev_sample, ref_output)
    has_ref = r is not None
    r = m if r is None else r
    sig, sig_next, old, adv = _fp32(sigma, sigma_next, old_log_prob, advantage)
    rows, d = m.shape
    cfg = row_split(rows, d, m.device, GPU_BLOCK, GPU_WARPS)
    part = _partial_sums(m, x, p, r, has_ref, cfg,
                         step=(sig, sig_next, noise_level, sigma_max))
    acc = compute_dtype(m.dtype)
    loss = new_output((), acc, m.device)
    log_prob, kl = new_output((rows,), acc, m.device), new_output((rows,), acc, m.device)
    weights = new_output((rows, 2), acc, m.device)
    block_b = (EPILOGUE_MAX_BLOCK if m.device.type == "cuda"
               else min(EPILOGUE_MAX_BLOCK, max(16, triton.next_power_of_2(rows))))
    launchable(grpo_epilogue_kernel, part, sig, sig_next, old, adv)[(1,)](
        part, sig, sig_next, old, adv, loss, log_prob, kl, weights, noise_level,
        0.0 if sigma_max is None else sigma_max, clip_range, adv_clip_max, kl_beta, rows, d,
        cfg.n_splits, HAS_SIGMA_MAX=sigma_max is not None, BLOCK_B=block_b,
        ACC=tl_acc(m.dtype), num_warps=EPILOGUE_WARPS)
    return loss, log_prob, kl, weights


def grpo_loss_bwd(grad_loss: Tensor, weights: Tensor, model_output: Tensor, sample: Tensor,
                  prev_sample: Tensor, ref_output: Tensor | None, sigma: Tensor,
                  sigma_next: Tensor, noise_level: float, sigma_max: float | None) -> Tensor:
    """``d loss / d model_output`` ``[B, ...]`` in its dtype, times the upstream ``grad_loss``
    (a 0-dim tensor, read on the device), in one kernel."""
    m, x, p, r = _rows(model_output, sample, prev_sample, ref_output)
    has_ref = r is not None
    r = m if r is None else r
    sig, sig_next = _fp32(sigma, sigma_next)
    cfg = row_split(m.shape[0], m.shape[1], m.device, GPU_BLOCK, GPU_WARPS)
    grad = _gradient(weights.contiguous(), m, x, p, r, has_ref, cfg,
                     step=(sig, sig_next, noise_level, sigma_max),
                     upstream=grad_loss.reshape(1))
    return grad.view(model_output.shape)


def aot_configs() -> list[AotConfig]:
    """Every CUDA launch of the launchers: per input dtype, with and without a reference
    output, the coefficients from ``coef`` (``sde_log_prob``) or from the sigmas with and
    without ``sigma_max`` (``grpo_sde_loss``, whose gradient also reads the upstream gradient);
    each sums kernel also with one chunk per row (``n_splits=1``); and the epilogue."""
    configs = []
    for dtype in ("fp32", "fp16", "bf16"):
        inputs = {"m_ptr": f"*{dtype}", "x_ptr": f"*{dtype}", "p_ptr": f"*{dtype}",
                  "r_ptr": f"*{dtype}", "coef_ptr": "*fp32", "sig_ptr": "*fp32",
                  "sig_next_ptr": "*fp32"}
        meta = {"HAS_REF": "constexpr", "STEP": "constexpr", "HAS_SIGMA_MAX": "constexpr",
                "BLOCK": "constexpr", "ACC": "constexpr"}
        scalars = {"noise_level": "fp32", "sigma_max": "fp32"}
        aligned = (*inputs, "d", "chunk")
        for has_ref in (False, True):
            for step, has_sigma_max in ((False, False), (True, False), (True, True)):
                consts = {"HAS_REF": has_ref, "STEP": step, "HAS_SIGMA_MAX": has_sigma_max,
                          "BLOCK": GPU_BLOCK, "ACC": tl.float32}
                variant = ", ".join(filter(None, (
                    "with ref" if has_ref else "no ref", "step" if step else "",
                    "sigma_max" if has_sigma_max else "")))
                configs.append(AotConfig(
                    sde_sums_kernel, dtype, variant,
                    {**inputs, "part_ptr": "*fp32", **scalars, "d": "i32", "chunk": "i32",
                     "n_splits": "i32", **meta}, consts, GPU_WARPS, (*aligned, "part_ptr")))
                configs.append(AotConfig(
                    sde_grad_kernel, dtype, variant,
                    {**inputs, "w_ptr": "*fp32", "up_ptr": "*fp32", "grad_ptr": f"*{dtype}",
                     **scalars, "d": "i32", "chunk": "i32", **meta, "SCALED": "constexpr"},
                    {**consts, "SCALED": step}, GPU_WARPS,
                    (*aligned, "w_ptr", "up_ptr", "grad_ptr")))
    sums = [c.with_unit("n_splits") for c in configs if c.kernel is sde_sums_kernel]
    epilogue = [AotConfig(
        grpo_epilogue_kernel, "fp32", "sigma_max" if has_sigma_max else "",
        {**{name: "*fp32" for name in ("part_ptr", "sig_ptr", "sig_next_ptr", "old_ptr",
                                       "adv_ptr", "loss_ptr", "lp_ptr", "kl_ptr", "w_ptr")},
         **{name: "fp32" for name in ("noise_level", "sigma_max", "clip_range", "adv_clip_max",
                                      "kl_beta")},
         "b": "i32", "d": "i32", "n_splits": "i32", "HAS_SIGMA_MAX": "constexpr",
         "BLOCK_B": "constexpr", "ACC": "constexpr"},
        {"HAS_SIGMA_MAX": has_sigma_max, "BLOCK_B": EPILOGUE_MAX_BLOCK, "ACC": tl.float32},
        EPILOGUE_WARPS) for has_sigma_max in (False, True)]
    return configs + sums + epilogue
