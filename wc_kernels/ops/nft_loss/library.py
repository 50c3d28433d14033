"""``torch.library`` registration of ``wc_fast::nft_loss_fwd`` and its Triton twin, with their
fake kernel and autograd (see :mod:`wc_kernels._registry` for how the pair dispatches and for
the direct eager route).

``nft_loss_fwd(v_theta, v_old, v_target [B, ...], r [B], sigma [B] | None, beta, x0,
grad_scale=1.0, reduce=False) -> (loss, grad [B, ...])``: ``loss`` is ``grad_scale * L_i``
per sample ``[B]``, or its sum (a 0-dim tensor) when ``reduce``, in fp32 (fp64 for fp64
inputs); ``grad[i] = grad_scale * dL_i/dv_theta[i]`` in ``v_theta``'s dtype. The rows are
flattened inside the op, so :func:`wc_kernels.nft_loss` launches it alone. Backward:
``dv_theta = grad * grad_loss``, one multiply (a 0-dim upstream gradient keeps ``grad``'s
dtype); the other inputs get no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from wc_kernels import _registry
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.nft_loss import native

NFT_LOSS = "wc_fast::nft_loss_fwd"


def _fake(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor, sigma: Tensor | None,
          beta: float, x0: bool, grad_scale: float = 1.0, reduce: bool = False
          ) -> tuple[Tensor, Tensor]:
    shape = () if reduce else (v_theta.shape[0],)
    loss = v_theta.new_empty(shape, dtype=compute_dtype(v_theta.dtype))
    return loss, torch.empty_like(v_theta, memory_format=torch.contiguous_format)


def _on_rows(launch: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
    """The op's implementation around ``launch``, a kernel on ``[B, D]`` rows (Triton or
    native, same contract): flatten the rows, scale and reduce the per-sample loss."""

    def nft_loss_fwd(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor,
                     sigma: Tensor | None, beta: float, x0: bool, grad_scale: float = 1.0,
                     reduce: bool = False) -> tuple[Tensor, Tensor]:
        b = v_theta.shape[0]
        loss, grad = launch(v_theta.reshape(b, -1), v_old.reshape(b, -1),
                            v_target.reshape(b, -1), r, sigma, beta, x0, grad_scale)
        if grad_scale != 1.0:
            loss = loss * grad_scale
        return (loss.sum() if reduce else loss), grad.view(v_theta.shape)

    return nft_loss_fwd


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    # the gradient output gets no upstream gradient: without this, autograd would fill a
    # [B, D] tensor of zeros for it on every backward (a full pass, for nothing)
    ctx.set_materialize_grads(False)


def _backward(ctx: Any, grad_loss: Tensor | None, _grad_grad: Tensor | None) -> tuple:
    (grad,) = ctx.saved_tensors
    if grad_loss is None:
        dv_theta = None
    elif grad_loss.dim() == 0:
        dv_theta = grad * grad_loss
    else:
        per_row = grad_loss.view(-1, *(1,) * (grad.dim() - 1))
        dv_theta = (grad * per_row).to(grad.dtype)
    return dv_theta, None, None, None, None, None, None, None, None


def define_ops(suffix: str, native_cpu: bool) -> dict[str, _registry.FusedOp]:
    """``nft_loss_fwd`` + ``suffix``, native on CPU when ``native_cpu``."""
    launch = None
    if _registry.HAVE_TRITON:
        from wc_kernels.ops.nft_loss.triton import nft_loss_fwd as triton_rows

        launch = _on_rows(triton_rows)
    native_impl = _on_rows(native.nft_loss_fwd)
    return {NFT_LOSS + suffix: _registry.fuse(
        NFT_LOSS + suffix, launch, native_impl, native_cpu, fake=_fake,
        setup_context=_setup_context, backward=_backward)}


# each op with its direct eager route (what wc_kernels.nft_loss calls), and the registered ops
FUSED = _registry.define_with_twin(define_ops)
OPS = {name: fused.registered for name, fused in FUSED.items()}
