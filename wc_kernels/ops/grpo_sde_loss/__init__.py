"""``grpo_sde_loss`` and ``sde_log_prob``: Flow-GRPO / DanceGRPO's PPO-clipped loss on the
flow-matching SDE step's Gaussian log-probability, with an optional KL to a reference model."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_kernels import _checks
from wc_kernels._backend import resolve
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.grpo_sde_loss import naive

IMPLEMENTED = ("reference", "triton", "native")


def _check_number(name: str, value: object, *, low: float, strict: bool) -> float:
    """``value`` is a finite real number above ``low`` (or at least ``low`` unless strict)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite float, got {value!r}")
    if value < low or (strict and value == low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low}, got {value!r}")
    return float(value)


def _check_rows(name: str, t: object, model_output: Tensor, what: str) -> None:
    _checks.check_tensor(name, t)
    _checks.check_shape(name, t, (model_output.shape[0],), what)
    _checks.check_device(name, t, "model_output", model_output)


def _check_step(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                sigma_next: Tensor, noise_level: float, sigma_max: float | None,
                values: bool = True) -> None:
    """The SDE step's arguments (shared by both public functions); ``values``: also the
    sigmas' values (one host read)."""
    _checks.check_tensor("model_output", model_output, min_dim=1)
    if model_output.shape[0] == 0 or math.prod(model_output.shape[1:]) == 0:
        raise ValueError(f"model_output must be non-empty [B, ...], got shape "
                         f"{tuple(model_output.shape)}")
    for name, t in (("sample", sample), ("prev_sample", prev_sample)):
        _checks.check_like(name, _checks.check_tensor(name, t), "model_output", model_output)
    _check_rows("sigma", sigma, model_output, "one noise level per sample")
    _check_rows("sigma_next", sigma_next, model_output, "the next noise level per sample")
    _check_number("noise_level", noise_level, low=0.0, strict=True)
    if sigma_max is not None:
        _check_number("sigma_max", sigma_max, low=0.0, strict=True)
        if sigma_max >= 1.0:
            raise ValueError(f"sigma_max must be < 1 (the schedule's second sigma), got "
                             f"{sigma_max!r}")
    if values:
        _check_sigma_values(sigma, sigma_next, sigma_max)


def _check_sigma_values(sigma: Tensor, sigma_next: Tensor, sigma_max: float | None) -> None:
    """``0 < sigma <= 1``, ``0 <= sigma_next < sigma``, ``sigma == 1`` only with ``sigma_max``.

    One host read for all of it (bounds of both and the largest ``sigma_next - sigma``): each
    read waits for the device queue, and at the GPU benchmarks' sizes five of them cost more
    than the kernels. Skipped while compiling or capturing; NaN fails every comparison.
    """
    if not _checks.values_checkable():
        return
    sig, sig_next = sigma.detach(), sigma_next.detach()
    low, high, next_low, next_high, gap = torch.stack(
        [*torch.aminmax(sig), *torch.aminmax(sig_next), (sig_next - sig).max()]).tolist()
    if not (0.0 <= low and high <= 1.0):
        _checks.check_range("sigma", sigma, 0.0, 1.0)
    if not (0.0 <= next_low and next_high <= 1.0):
        _checks.check_range("sigma_next", sigma_next, 0.0, 1.0)
    if low == 0:
        raise ValueError("sigma must be > 0 (the SDE step divides by it)")
    if not gap < 0:
        raise ValueError("sigma_next must be < sigma for every sample (sigma runs from 1 to "
                         "0, so dt = sigma_next - sigma < 0)")
    if sigma_max is None and high == 1:
        raise ValueError("sigma == 1 needs sigma_max (the schedule's second sigma): the SDE "
                         "std noise_level * sqrt(sigma / (1 - sigma)) is infinite there")


def _fused_stats(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                 sigma_next: Tensor, ref_output: Tensor | None, noise_level: float,
                 sigma_max: float | None, backend: str) -> tuple[Tensor, Tensor]:
    """``log_prob [B]`` and ``kl [B]`` from one fused pass of ``backend`` ("triton" or
    "native") over the rows (``kl`` zero without ``ref_output``)."""
    from wc_kernels._registry import op_for
    from wc_kernels.ops.grpo_sde_loss.library import (
        LOG_SQRT_2PI,
        OPS,
        SDE_SUMS,
        step_coefficients,
    )

    acc = compute_dtype(model_output.dtype)
    b = model_output.shape[0]
    d = math.prod(model_output.shape[1:])
    std, neg_dt, coef = step_coefficients(sigma, sigma_next, noise_level, sigma_max, acc)
    ref = None if ref_output is None else ref_output.detach().reshape(b, -1)
    op = op_for(SDE_SUMS, backend, model_output.device, OPS)
    sums = op(model_output.reshape(b, -1), sample.detach().reshape(b, -1),
              prev_sample.detach().reshape(b, -1), ref, coef)
    var = std * std
    log_prob = (-sums[:, 0] / (2.0 * d * var * neg_dt) - torch.log(std * torch.sqrt(neg_dt))
                - LOG_SQRT_2PI)
    kl = coef[:, 1] ** 2 * sums[:, 1] / (2.0 * d * var)
    return log_prob, kl


def sde_log_prob(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                 sigma_next: Tensor, *, noise_level: float, sigma_max: float | None = None,
                 backend: str = "auto") -> Tensor:
    """Per-sample log-probability ``[B]`` (mean over elements) of ``prev_sample`` under the
    flow-matching SDE step from ``sample`` with velocity ``model_output`` (docs/design.md
    section 8).

    ``model_output, sample, prev_sample`` ``[B, ...]`` of one dtype (fp16, bf16, fp32; fp64 for
    gradcheck); ``sigma, sigma_next`` ``[B]`` with ``0 <= sigma_next < sigma <= 1``;
    ``sigma_max`` (the schedule's second sigma) replaces ``sigma`` in the std's denominator
    where ``sigma == 1`` and is required there. Returns fp32 (fp64 for fp64 inputs);
    differentiable in ``model_output`` only. ``backend="triton"`` / ``"native"`` read the rows
    once.
    """
    _check_step(model_output, sample, prev_sample, sigma, sigma_next, noise_level, sigma_max)
    chosen = resolve("sde_log_prob", backend, model_output.device, IMPLEMENTED)
    if chosen == "reference":
        return naive.sde_log_prob(model_output, sample, prev_sample, sigma.detach(),
                                  sigma_next.detach(), noise_level=float(noise_level),
                                  sigma_max=sigma_max)
    log_prob, _ = _fused_stats(model_output, sample, prev_sample, sigma, sigma_next, None,
                               float(noise_level), sigma_max, chosen)
    return log_prob


def grpo_sde_loss(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                  sigma_next: Tensor, old_log_prob: Tensor, advantage: Tensor, *,
                  noise_level: float, clip_range: float, adv_clip_max: float,
                  sigma_max: float | None = None, ref_output: Tensor | None = None,
                  kl_beta: float = 0.0, return_stats: bool = False, backend: str = "auto",
                  check_values: bool = True) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """GRPO's PPO-clipped loss on the SDE step's log-probability, plus ``kl_beta`` times the
    KL to a reference model (docs/design.md section 8).

    The step's arguments are those of :func:`sde_log_prob`; ``old_log_prob, advantage``
    ``[B]``; ``ref_output`` ``[B, ...]`` like ``model_output`` (required when ``kl_beta``
    is non-zero). Returns the scalar loss (fp32, fp64 for fp64 inputs); with
    ``return_stats=True`` also the detached ``log_prob [B]`` and ``kl [B]`` (zeros without
    ``ref_output``) for logging. Only ``model_output`` receives a gradient.
    ``backend="triton"`` / ``"native"`` run the fused op ``wc_fast::grpo_sde_loss_fwd``
    (:mod:`wc_kernels.ops.grpo_sde_loss.library`): the rows are read once forward (with the
    per-row epilogue, ratio, clipping and KL in a second, one-program kernel on Triton) and
    once backward, in one kernel that reads the upstream gradient on the device; in plain
    eager code the kernels are called directly, compiled or traced the op is one node.
    ``check_values=False`` skips the one host read that checks the sigmas' values (a device
    sync on CUDA), for callers that validated them already.
    """
    _check_step(model_output, sample, prev_sample, sigma, sigma_next, noise_level, sigma_max,
                check_values)
    _check_rows("old_log_prob", old_log_prob, model_output, "the sampler's log-probability")
    _check_rows("advantage", advantage, model_output, "one advantage per sample")
    _check_number("clip_range", clip_range, low=0.0, strict=False)
    _check_number("adv_clip_max", adv_clip_max, low=0.0, strict=True)
    _check_number("kl_beta", kl_beta, low=0.0, strict=False)
    if ref_output is not None:
        _checks.check_like("ref_output", _checks.check_tensor("ref_output", ref_output),
                           "model_output", model_output)
    elif kl_beta != 0:
        raise ValueError("kl_beta != 0 needs ref_output (the reference model's output)")
    chosen = resolve("grpo_sde_loss", backend, model_output.device, IMPLEMENTED)
    if chosen == "reference":
        loss, log_prob, kl = naive.grpo_sde_loss(
            model_output, sample, prev_sample, sigma.detach(), sigma_next.detach(),
            old_log_prob, advantage, noise_level=float(noise_level),
            clip_range=float(clip_range), adv_clip_max=float(adv_clip_max),
            sigma_max=sigma_max, ref_output=ref_output, kl_beta=float(kl_beta))
        return (loss, log_prob.detach(), kl.detach()) if return_stats else loss
    from wc_kernels._registry import op_for
    from wc_kernels.ops.grpo_sde_loss.library import FUSED, GRPO_LOSS

    op = op_for(GRPO_LOSS, chosen, model_output.device, FUSED)
    # log_prob and kl come out without a gradient (non-differentiable outputs of the op)
    loss, log_prob, kl, _ = op(model_output, sample, prev_sample, sigma, sigma_next,
                               old_log_prob, advantage, ref_output, float(noise_level),
                               None if sigma_max is None else float(sigma_max),
                               float(clip_range), float(adv_clip_max), float(kl_beta))
    return (loss, log_prob, kl) if return_stats else loss
