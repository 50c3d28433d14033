"""``torch.library`` registration of ``wc_fast::flow_noise`` and its Triton twin, with their
fake kernel and autograd (see :mod:`wc_kernels._registry` for how the pair dispatches and for
the direct eager route).

``flow_noise(x0 [S, ...], sigmas [S, K], noise [S*K, ...]) -> (x_t, v_target [S*K, ...])``;
the rows are flattened inside the op, so :func:`wc_kernels.flow_noise` launches it alone.
Backward: ``dx0[s] = sum_j (1 - sig[s, j]) g_xt[s*K+j] - g_v[s*K+j]``,
``dnoise = sig * g_xt + g_v``, ``dsigmas[s, j] = <g_xt[s*K+j], noise[s*K+j] - x0[s]>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch import Tensor

from wc_kernels import _registry
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.flow_noise import native

FLOW_NOISE = "wc_fast::flow_noise"


def _fake(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    return noise.new_empty(noise.shape), noise.new_empty(noise.shape)


def _on_rows(launch: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
    """The op's implementation around ``launch``, a kernel on ``[S, D]`` rows (Triton or
    native, same contract): flatten the rows, shape the outputs like ``noise``."""

    def flow_noise(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        x_t, v_target = launch(x0.reshape(x0.shape[0], -1), sigmas,
                               noise.reshape(noise.shape[0], -1))
        return x_t.view(noise.shape), v_target.view(noise.shape)

    return flow_noise


def _setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, g_xt: Tensor, g_v: Tensor) -> tuple:
    x0, sigmas, noise = ctx.saved_tensors
    acc = compute_dtype(x0.dtype)
    (s, k), d = sigmas.shape, math.prod(x0.shape[1:])
    sig = sigmas.to(acc).reshape(s, k, 1)
    g_xt, g_v = g_xt.to(acc).reshape(s, k, d), g_v.to(acc).reshape(s, k, d)
    d_x0 = d_sig = d_noise = None
    if ctx.needs_input_grad[0]:
        d_x0 = ((1.0 - sig) * g_xt - g_v).sum(dim=1).to(x0.dtype).view(x0.shape)
    if ctx.needs_input_grad[1]:
        v_target = noise.to(acc).reshape(s, k, d) - x0.to(acc).reshape(s, 1, d)
        d_sig = (g_xt * v_target).sum(dim=2).to(sigmas.dtype)
    if ctx.needs_input_grad[2]:
        d_noise = (sig * g_xt + g_v).to(noise.dtype).view(noise.shape)
    return d_x0, d_sig, d_noise


def define_ops(suffix: str, native_cpu: bool) -> dict[str, _registry.FusedOp]:
    """``flow_noise`` + ``suffix``, native on CPU when ``native_cpu``."""
    launch = None
    if _registry.HAVE_TRITON:
        from wc_kernels.ops.flow_noise.triton import flow_noise as triton_rows

        launch = _on_rows(triton_rows)
    native_impl = _on_rows(native.flow_noise)
    return {FLOW_NOISE + suffix: _registry.fuse(
        FLOW_NOISE + suffix, launch, native_impl, native_cpu, fake=_fake,
        setup_context=_setup_context, backward=_backward)}


# each op with its direct eager route (what wc_kernels.flow_noise calls), and the registered ops
FUSED = _registry.define_with_twin(define_ops)
OPS = {name: fused.registered for name, fused in FUSED.items()}
