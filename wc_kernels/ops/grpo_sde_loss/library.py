"""``torch.library`` registration of GRPO's fused ops, each with its Triton twin (see
:mod:`wc_kernels._registry` for how the pairs dispatch and for the direct eager route; the
kernels are in :mod:`wc_kernels.ops.grpo_sde_loss.triton`).

``wc_fast::grpo_sde_loss_fwd(model_output, sample, prev_sample [B, ...], sigma, sigma_next,
old_log_prob, advantage [B], ref_output | None, noise_level, sigma_max | None, clip_range,
adv_clip_max, kl_beta) -> (loss [], log_prob [B], kl [B], weights [B, 2])``: the whole loss
(:func:`wc_kernels.grpo_sde_loss`) with the backward's per-row weights; only ``loss`` has a
gradient, ``wc_fast::grpo_sde_loss_bwd(grad_loss, weights, model_output, sample, prev_sample,
ref_output, sigma, sigma_next, noise_level, sigma_max) -> d model_output`` (one kernel, the
upstream gradient read on the device). On Triton the forward is two kernels (row sums, then a
one-program epilogue); natively the row sums are the C++ kernel and the epilogue
(:func:`epilogue`, the same formulas) is torch arithmetic on ``[B]`` tensors.

``sde_residual_sums(model_output, sample, prev_sample [B, D], ref_output [B, D] | None,
coef [B, 2]) -> sums [B, 2]`` (fp32, fp64 for fp64 inputs) with
``sums[:, 0] = sum((prev_sample - a sample - c model_output)^2)`` and
``sums[:, 1] = sum((model_output - ref_output)^2)`` (0 without a ref), ``coef = (a, c)``,
for :func:`wc_kernels.sde_log_prob`. Backward: ``wc_fast::sde_residual_sums_bwd(weights,
model_output, sample, prev_sample, ref_output, coef)`` with ``weights = grad_sums * (-2c, 2)``;
only ``model_output`` gets a gradient.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from wc_kernels import _registry
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.grpo_sde_loss import naive, native

SDE_SUMS = "wc_fast::sde_residual_sums"
SDE_SUMS_BWD = "wc_fast::sde_residual_sums_bwd"
GRPO_LOSS = "wc_fast::grpo_sde_loss_fwd"
GRPO_LOSS_BWD = "wc_fast::grpo_sde_loss_bwd"


def _fake(model_output: Tensor, sample: Tensor, prev_sample: Tensor,
          ref_output: Tensor | None, coef: Tensor) -> Tensor:
    return model_output.new_empty((model_output.shape[0], 2),
                                  dtype=compute_dtype(model_output.dtype))


def _bwd_fake(weights: Tensor, model_output: Tensor, sample: Tensor, prev_sample: Tensor,
              ref_output: Tensor | None, coef: Tensor) -> Tensor:
    return torch.empty_like(model_output, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    model_output, sample, prev_sample, ref_output, coef = inputs
    ctx.has_ref = ref_output is not None
    ctx.save_for_backward(model_output, sample, prev_sample,
                          ref_output if ctx.has_ref else None, coef)


def _backward(backward: Any, ctx: Any, grad_sums: Tensor) -> tuple:
    """``backward`` is the ``sde_residual_sums_bwd`` op paired with the forward."""
    model_output, sample, prev_sample, ref_output, coef = ctx.saved_tensors
    d_model = None
    if ctx.needs_input_grad[0]:
        # dS1/dm = -2c * residual, dS2/dm = 2 (m - r): fold the row factors into the weights
        factors = torch.stack([-2.0 * coef[:, 1], torch.full_like(coef[:, 1], 2.0)], dim=1)
        weights = grad_sums.to(coef.dtype) * factors
        d_model = backward(weights, model_output, sample, prev_sample, ref_output, coef)
    return d_model, None, None, None, None


LOG_SQRT_2PI = math.log(math.sqrt(2.0 * math.pi))


def step_coefficients(sigma: Tensor, sigma_next: Tensor, noise_level: float,
                      sigma_max: float | None, acc: torch.dtype
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """``std [B]``, ``-dt [B]`` and ``coef [B, 2]`` = ``(a, c)`` with the step's mean
    ``a * sample + c * model_output``, in ``acc``."""
    sig, sig_next = sigma.detach().to(acc), sigma_next.detach().to(acc)
    std = naive.sde_std(sig, noise_level, sigma_max)
    dt = sig_next - sig
    var = std * std
    a = 1.0 + var / (2.0 * sig) * dt
    c = (1.0 + var * (1.0 - sig) / (2.0 * sig)) * dt
    return std, -dt, torch.stack([a, c], dim=1)


def epilogue(sums: Tensor, std: Tensor, neg_dt: Tensor, coef: Tensor, old_log_prob: Tensor,
             advantage: Tensor, d: int, clip_range: float, adv_clip_max: float, kl_beta: float
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(loss, log_prob, kl, weights)`` from the row sums ``[B, 2]``: the formulas of
    :func:`~wc_kernels.ops.grpo_sde_loss.triton.grpo_epilogue_kernel` in torch ops."""
    b, acc = sums.shape[0], sums.dtype
    var, c = std * std, coef[:, 1]
    log_prob = (-sums[:, 0] / (2.0 * d * var * neg_dt) - torch.log(std * torch.sqrt(neg_dt))
                - LOG_SQRT_2PI)
    kl = c * c * sums[:, 1] / (2.0 * d * var)
    ratio = torch.exp(log_prob - old_log_prob.to(acc))
    adv = advantage.to(acc).clamp(-adv_clip_max, adv_clip_max)
    u, v = -adv * ratio, -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = (torch.maximum(u, v) + kl_beta * kl).mean()
    g_u = torch.where(u > v, 1.0, torch.where(u == v, 0.5, 0.0)).to(acc)
    inside = (ratio >= 1.0 - clip_range) & (ratio <= 1.0 + clip_range)
    d_ratio = -adv * (g_u + torch.where(inside, 1.0 - g_u, 0.0))
    d_s1 = d_ratio * ratio * (-1.0 / (2.0 * d * var * neg_dt)) / b
    d_s2 = kl_beta * c * c / (2.0 * d * var) / b
    return loss, log_prob, kl, torch.stack([d_s1 * (-2.0 * c), d_s2 * 2.0], dim=1)


def native_loss_fwd(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                    sigma_next: Tensor, old_log_prob: Tensor, advantage: Tensor,
                    ref_output: Tensor | None, noise_level: float, sigma_max: float | None,
                    clip_range: float, adv_clip_max: float, kl_beta: float
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``grpo_sde_loss_fwd`` on the native row sums and the torch :func:`epilogue`."""
    b = model_output.shape[0]
    acc = compute_dtype(model_output.dtype)
    std, neg_dt, coef = step_coefficients(sigma, sigma_next, noise_level, sigma_max, acc)
    ref = None if ref_output is None else ref_output.reshape(b, -1)
    sums = native.sde_residual_sums(model_output.reshape(b, -1), sample.reshape(b, -1),
                                    prev_sample.reshape(b, -1), ref, coef)
    return epilogue(sums, std, neg_dt, coef, old_log_prob, advantage,
                    math.prod(model_output.shape[1:]), clip_range, adv_clip_max, kl_beta)


def native_loss_bwd(grad_loss: Tensor, weights: Tensor, model_output: Tensor, sample: Tensor,
                    prev_sample: Tensor, ref_output: Tensor | None, sigma: Tensor,
                    sigma_next: Tensor, noise_level: float, sigma_max: float | None) -> Tensor:
    """``grpo_sde_loss_bwd`` on the native gradient kernel."""
    b = model_output.shape[0]
    _, _, coef = step_coefficients(sigma, sigma_next, noise_level, sigma_max,
                                   compute_dtype(model_output.dtype))
    ref = None if ref_output is None else ref_output.reshape(b, -1)
    grad = native.sde_residual_sums_bwd(weights * grad_loss, model_output.reshape(b, -1),
                                        sample.reshape(b, -1), prev_sample.reshape(b, -1), ref,
                                        coef)
    return grad.view(model_output.shape)


def _loss_fake(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
               sigma_next: Tensor, old_log_prob: Tensor, advantage: Tensor,
               ref_output: Tensor | None, noise_level: float, sigma_max: float | None,
               clip_range: float, adv_clip_max: float, kl_beta: float
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    acc = compute_dtype(model_output.dtype)
    b = model_output.shape[0]
    return (model_output.new_empty((), dtype=acc), model_output.new_empty((b,), dtype=acc),
            model_output.new_empty((b,), dtype=acc), model_output.new_empty((b, 2), dtype=acc))


def _loss_bwd_fake(grad_loss: Tensor, weights: Tensor, model_output: Tensor, sample: Tensor,
                   prev_sample: Tensor, ref_output: Tensor | None, sigma: Tensor,
                   sigma_next: Tensor, noise_level: float, sigma_max: float | None) -> Tensor:
    return torch.empty_like(model_output, memory_format=torch.contiguous_format)


def _loss_setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    m, x, p, sigma, sigma_next, _, _, ref, noise_level, sigma_max, *_ = inputs
    ctx.save_for_backward(output[3], m, x, p, ref, sigma, sigma_next)
    ctx.noise_level, ctx.sigma_max = noise_level, sigma_max
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)


def _loss_backward(backward: Any, ctx: Any, grad_loss: Tensor | None, *_: Tensor | None
                   ) -> tuple:
    """``backward``: the ``grpo_sde_loss_bwd`` op paired with the forward."""
    d_model = None
    if grad_loss is not None and ctx.needs_input_grad[0]:
        d_model = backward(grad_loss, *ctx.saved_tensors, ctx.noise_level, ctx.sigma_max)
    return (d_model, *(None,) * 12)


def define_ops(suffix: str, native_cpu: bool) -> dict[str, Any]:
    """``sde_residual_sums``, ``grpo_sde_loss_fwd`` + ``suffix`` and their backward ops, native
    on CPU when ``native_cpu``; the GRPO pair as :class:`~wc_kernels._registry.FusedOp`."""
    launch = launch_bwd = loss_launch = loss_launch_bwd = None
    if _registry.HAVE_TRITON:
        from wc_kernels.ops.grpo_sde_loss.triton import grpo_loss_bwd as loss_launch_bwd
        from wc_kernels.ops.grpo_sde_loss.triton import grpo_loss_fwd as loss_launch
        from wc_kernels.ops.grpo_sde_loss.triton import sde_residual_sums as launch
        from wc_kernels.ops.grpo_sde_loss.triton import sde_residual_sums_bwd as launch_bwd
    backward = _registry.define(SDE_SUMS_BWD + suffix, launch_bwd, native.sde_residual_sums_bwd,
                                native_cpu)
    backward.register_fake(_bwd_fake)
    forward = _registry.define(SDE_SUMS + suffix, launch, native.sde_residual_sums, native_cpu)
    forward.register_fake(_fake)
    forward.register_autograd(lambda ctx, grad: _backward(backward, ctx, grad),
                              setup_context=_setup_context)

    loss_bwd = _registry.fuse(GRPO_LOSS_BWD + suffix, loss_launch_bwd, native_loss_bwd,
                              native_cpu, fake=_loss_bwd_fake)

    def loss_backward(ctx: Any, *grads: Tensor | None) -> tuple:
        return _loss_backward(loss_bwd, ctx, *grads)

    loss = _registry.fuse(GRPO_LOSS + suffix, loss_launch, native_loss_fwd, native_cpu,
                          fake=_loss_fake, setup_context=_loss_setup_context,
                          backward=loss_backward)
    return {SDE_SUMS_BWD + suffix: backward, SDE_SUMS + suffix: forward,
            GRPO_LOSS_BWD + suffix: loss_bwd, GRPO_LOSS + suffix: loss}


DEFINED = _registry.define_with_twin(define_ops)
# the GRPO loss ops with their direct eager route (what wc_kernels.grpo_sde_loss calls)
FUSED = {name: op for name, op in DEFINED.items() if isinstance(op, _registry.FusedOp)}
# every registered op
OPS = {name: getattr(op, "registered", op) for name, op in DEFINED.items()}
