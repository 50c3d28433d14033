"""``torch.library`` registration of ``wc_fast::nft_loss_fwd`` and its Triton twin, with their
fake kernel and autograd (see :mod:`wc_kernels._registry` for how the pair dispatches).

``nft_loss_fwd(v_theta, v_old, v_target [B, D], r [B], sigma [B] | None, beta, x0,
grad_scale=1.0) -> (loss [B] fp32 (fp64 for fp64 inputs), grad [B, D])`` with
``grad[i] = grad_scale * dL_i/dv_theta[i]`` (rows flattened by :func:`wc_kernels.nft_loss`).
Backward: ``dv_theta = grad * (grad_loss / grad_scale)[:, None]``; the other inputs get no
gradient. The public op passes the factor its reduction will apply as ``grad_scale``, so for
the usual ``loss.backward()`` the factor is 1 and the saved gradient is the answer: on CPU that
is checked and the multiply skipped (on CUDA the check would synchronise, and traced graphs
cannot branch on values, so there the multiply always runs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from wc_kernels import _registry
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.nft_loss import native

NFT_LOSS = "wc_fast::nft_loss_fwd"


def _fake(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor, sigma: Tensor | None,
          beta: float, x0: bool, grad_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    loss = v_theta.new_empty(v_theta.shape[0], dtype=compute_dtype(v_theta.dtype))
    return loss, torch.empty_like(v_theta, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    # the gradient output gets no upstream gradient: without this, autograd would fill a
    # [B, D] tensor of zeros for it on every backward (a full pass, for nothing)
    ctx.set_materialize_grads(False)
    ctx.grad_scale = inputs[7] if len(inputs) > 7 else 1.0


def _upstream_is_grad_scale(grad_loss: Tensor, grad_scale: float) -> bool:
    """Whether every row's upstream gradient equals the factor the forward already applied
    (checked on the host, so only for CPU tensors outside tracing; see the module doc)."""
    if grad_loss.device.type != "cpu" or torch.compiler.is_compiling() or is_fake(grad_loss):
        return False
    return bool((grad_loss == grad_scale).all())


def _backward(ctx: Any, grad_loss: Tensor | None, _grad_grad: Tensor | None) -> tuple:
    (grad,) = ctx.saved_tensors
    if grad_loss is None:
        dv_theta = None
    elif _upstream_is_grad_scale(grad_loss, ctx.grad_scale):
        dv_theta = grad
    else:
        factor = (grad_loss / ctx.grad_scale).unsqueeze(1)
        dv_theta = (grad.to(grad_loss.dtype) * factor).to(grad.dtype)
    return dv_theta, None, None, None, None, None, None, None


def define_ops(suffix: str, native_cpu: bool) -> dict[str, Any]:
    """``nft_loss_fwd`` + ``suffix``, native on CPU when ``native_cpu``."""
    launch = None
    if _registry.HAVE_TRITON:
        from wc_kernels.ops.nft_loss.triton import nft_loss_fwd as launch
    op = _registry.define(NFT_LOSS + suffix, launch, native.nft_loss_fwd, native_cpu)
    op.register_fake(_fake)
    op.register_autograd(_backward, setup_context=_setup_context)
    return {NFT_LOSS + suffix: op}


OPS = _registry.define_with_twin(define_ops)
