"""``torch.library`` registration of ``wc_fast::flow_noise`` and its Triton twin, with their
fake kernel and autograd (see :mod:`wc_kernels._registry` for how the pair dispatches).

``flow_noise(x0 [S, D], sigmas [S, K], noise [S*K, D]) -> (x_t, v_target [S*K, D])`` (rows
flattened by :func:`wc_kernels.flow_noise`). Backward:
``dx0[s] = sum_j (1 - sig[s, j]) g_xt[s*K+j] - g_v[s*K+j]``, ``dnoise = sig * g_xt + g_v``,
``dsigmas[s, j] = <g_xt[s*K+j], noise[s*K+j] - x0[s]>``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from wc_kernels import _registry
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.flow_noise import native

FLOW_NOISE = "wc_fast::flow_noise"


def _fake(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    shape = (sigmas.shape[0] * sigmas.shape[1], x0.shape[1])
    return x0.new_empty(shape), x0.new_empty(shape)


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, g_xt: Tensor, g_v: Tensor) -> tuple:
    x0, sigmas, noise = ctx.saved_tensors
    acc = compute_dtype(x0.dtype)
    (s, k), d = sigmas.shape, x0.shape[1]
    sig = sigmas.to(acc).reshape(s, k, 1)
    g_xt, g_v = g_xt.to(acc).reshape(s, k, d), g_v.to(acc).reshape(s, k, d)
    d_x0 = d_sig = d_noise = None
    if ctx.needs_input_grad[0]:
        d_x0 = ((1.0 - sig) * g_xt - g_v).sum(dim=1).to(x0.dtype)
    if ctx.needs_input_grad[1]:
        v_target = noise.to(acc).reshape(s, k, d) - x0.to(acc).unsqueeze(1)
        d_sig = (g_xt * v_target).sum(dim=2).to(sigmas.dtype)
    if ctx.needs_input_grad[2]:
        d_noise = (sig * g_xt + g_v).reshape(s * k, d).to(noise.dtype)
    return d_x0, d_sig, d_noise


def define_ops(suffix: str, native_cpu: bool) -> dict[str, Any]:
    """``flow_noise`` + ``suffix``, native on CPU when ``native_cpu``."""
    launch = None
    if _registry.HAVE_TRITON:
        from wc_kernels.ops.flow_noise.triton import flow_noise as launch
    op = _registry.define(FLOW_NOISE + suffix, launch, native.flow_noise, native_cpu)
    op.register_fake(_fake)
    op.register_autograd(_backward, setup_context=_setup_context)
    return {FLOW_NOISE + suffix: op}


OPS = _registry.define_with_twin(define_ops)
