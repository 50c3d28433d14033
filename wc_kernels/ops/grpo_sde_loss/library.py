"""``torch.library`` registration of GRPO's SDE residual sums: ``wc_fast::sde_residual_sums``,
its backward op, and their Triton twins, with fake kernels and autograd (see
:mod:`wc_kernels._registry` for how the pairs dispatch; the kernels are in
:mod:`wc_kernels.ops.grpo_sde_loss.triton`).

``sde_residual_sums(model_output, sample, prev_sample [B, D], ref_output [B, D] | None,
coef [B, 2]) -> sums [B, 2]`` (fp32, fp64 for fp64 inputs) with
``sums[:, 0] = sum((prev_sample - a sample - c model_output)^2)`` and
``sums[:, 1] = sum((model_output - ref_output)^2)`` (0 without a ref), ``coef = (a, c)``.
Backward: ``wc_fast::sde_residual_sums_bwd(weights, model_output, sample, prev_sample,
ref_output, coef)`` with ``weights = grad_sums * (-2c, 2)``; only ``model_output`` gets a
gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from wc_kernels import _registry
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.grpo_sde_loss import native

SDE_SUMS = "wc_fast::sde_residual_sums"
SDE_SUMS_BWD = "wc_fast::sde_residual_sums_bwd"


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


def define_ops(suffix: str, native_cpu: bool) -> dict[str, Any]:
    """``sde_residual_sums`` + ``suffix`` and its backward op, native on CPU when
    ``native_cpu``."""
    launch = launch_bwd = None
    if _registry.HAVE_TRITON:
        from wc_kernels.ops.grpo_sde_loss.triton import sde_residual_sums as launch
        from wc_kernels.ops.grpo_sde_loss.triton import sde_residual_sums_bwd as launch_bwd
    backward = _registry.define(SDE_SUMS_BWD + suffix, launch_bwd, native.sde_residual_sums_bwd,
                                native_cpu)
    backward.register_fake(_bwd_fake)
    forward = _registry.define(SDE_SUMS + suffix, launch, native.sde_residual_sums, native_cpu)
    forward.register_fake(_fake)
    forward.register_autograd(lambda ctx, grad: _backward(backward, ctx, grad),
                              setup_context=_setup_context)
    return {SDE_SUMS_BWD + suffix: backward, SDE_SUMS + suffix: forward}


OPS = _registry.define_with_twin(define_ops)
