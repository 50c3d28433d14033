"""Fused Triton flow noising: K noisy copies of each clean row and their velocity targets.

One program owns one tile of one clean row ``x0[s]``: it loads the tile once and, for each of
the K sigmas of that sample, reads the matching noise tile and writes
``x_t = (1 - sigma) * x0 + sigma * eps`` and ``v* = eps - x0`` (docs/design.md section
3). Arithmetic in fp32 (fp64 for fp64 inputs); stores cast to the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from wc_kernels._triton import (
    AotConfig,
    check_operand,
    interpret_block,
    launchable,
    new_output,
    tl_acc,
)

GPU_BLOCK = 1024  # 8 elements per thread: a few clean rows still give enough programs
GPU_WARPS = 4


@triton.jit
def flow_noise_kernel(x0_ptr, sig_ptr, noise_ptr, xt_ptr, v_ptr, d, k,
                      BLOCK: tl.constexpr, ACC: tl.constexpr):
    """Tile ``t`` of sample ``s``: rows ``s*k .. s*k + k - 1`` of ``x_t`` and ``v``.

    ``x0`` ``[S, D]``, ``sig`` ``[S, K]`` fp32, ``noise, xt, v`` ``[S*K, D]``, all contiguous.
    """
    s = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x = tl.load(x0_ptr + s * d + cols, mask=mask, other=0.0).to(ACC)
    for j in range(k):
        row = s * k + j
        sig = tl.load(sig_ptr + row).to(ACC)
        eps = tl.load(noise_ptr + row * d + cols, mask=mask, other=0.0).to(ACC)
        x_t = (1.0 - sig) * x + sig * eps
        tl.store(xt_ptr + row * d + cols, x_t.to(xt_ptr.dtype.element_ty), mask=mask)
        tl.store(v_ptr + row * d + cols, (eps - x).to(v_ptr.dtype.element_ty), mask=mask)


def flow_noise(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """``x_t, v_target`` ``[S*K, D]`` in ``x0``'s dtype; row ``s*K + j`` uses ``sigmas[s, j]``.

    ``x0`` ``[S, D]``, ``sigmas`` ``[S, K]`` (cast to fp32), ``noise`` ``[S*K, D]`` of ``x0``'s
    dtype; non-contiguous inputs are copied. Same contract as ``wc_kernels._native.flow_noise``.
    """
    if x0.dim() != 2 or sigmas.dim() != 2:
        raise ValueError(f"flow_noise: x0 [S, D] and sigmas [S, K] must be 2-D, got "
                         f"{tuple(x0.shape)} and {tuple(sigmas.shape)}")
    s, d = x0.shape
    k = sigmas.shape[1]
    check_operand("flow_noise", "sigmas", sigmas, (s, k), "x0", x0, same_dtype=False)
    check_operand("flow_noise", "noise", noise, (s * k, d), "x0", x0, same_dtype=True)
    x, eps = x0.contiguous(), noise.contiguous()
    sig = sigmas.to(torch.float32).contiguous()
    x_t = new_output(eps.shape, eps.dtype, eps.device)
    v = new_output(eps.shape, eps.dtype, eps.device)
    on_gpu = x.device.type == "cuda"
    block = GPU_BLOCK if on_gpu else interpret_block(d)
    if d > 0:
        launchable(flow_noise_kernel, x, sig, eps)[(s, triton.cdiv(d, block))](
            x, sig, eps, x_t, v, d, k, BLOCK=block, ACC=tl_acc(x.dtype), num_warps=GPU_WARPS)
    return x_t, v


def aot_configs() -> list[AotConfig]:
    """Every CUDA launch of :func:`flow_noise`: one per input dtype, each also with ``k=1``."""
    configs = [
        AotConfig(flow_noise_kernel, dtype, "",
                  {"x0_ptr": f"*{dtype}", "sig_ptr": "*fp32", "noise_ptr": f"*{dtype}",
                   "xt_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "d": "i32", "k": "i32",
                   "BLOCK": "constexpr", "ACC": "constexpr"},
                  {"BLOCK": GPU_BLOCK, "ACC": tl.float32}, GPU_WARPS,
                  ("x0_ptr", "sig_ptr", "noise_ptr", "xt_ptr", "v_ptr", "d"))
        for dtype in ("fp32", "fp16", "bf16")
    ]
    return configs + [c.with_unit("k") for c in configs]
