"""``flow_noise``: K noisy copies of each clean sample at K sigmas, with velocity targets."""

from __future__ import annotations

import torch
from torch import Tensor

from wc_kernels import _checks
from wc_kernels._backend import resolve
from wc_kernels.ops.flow_noise import naive

IMPLEMENTED = ("reference", "triton", "native")


def _check_inputs(x0, sigmas, noise, values) -> None:
    _checks.check_tensor("x0", x0, min_dim=1)
    _checks.check_tensor("sigmas", sigmas)
    if sigmas.dim() != 2 or sigmas.shape[0] != x0.shape[0]:
        raise ValueError(f"sigmas must have shape [S, K] with S = x0.shape[0] = {x0.shape[0]}, "
                         f"got {tuple(sigmas.shape)}")
    if x0.shape[0] == 0 or sigmas.shape[1] == 0:
        raise ValueError(f"x0 and sigmas must be non-empty, got S={x0.shape[0]}, "
                         f"K={sigmas.shape[1]}")
    _checks.check_device("sigmas", sigmas, "x0", x0)
    if values:
        _checks.check_range("sigmas", sigmas, 0.0, 1.0)
    if noise is not None:
        _checks.check_tensor("noise", noise)
        s, k = sigmas.shape
        _checks.check_shape("noise", noise, (s * k, *x0.shape[1:]), "[S*K, ...] like x0")
        if noise.dtype != x0.dtype:
            raise TypeError(f"noise must have the dtype of x0 ({x0.dtype}), got {noise.dtype}")
        _checks.check_device("noise", noise, "x0", x0)


def flow_noise(
    x0: Tensor,
    sigmas: Tensor,
    noise: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    backend: str = "auto",
    check_values: bool = True,
) -> tuple[Tensor, Tensor]:
    """Noise each clean sample at K sigmas: ``x_t = (1-s) x0 + s eps``, ``v* = eps - x0``.

    ``x0`` ``[S, ...]``, ``sigmas`` ``[S, K]`` in [0, 1], ``noise`` ``[S*K, ...]`` (standard
    normal from ``generator`` when None) -> ``(x_t, v_target)`` ``[S*K, ...]`` in ``x0``'s
    dtype; row ``s*K + j`` uses ``sigmas[s, j]``. Differentiable in ``x0``, ``sigmas`` and
    ``noise``.

    ``backend="triton"`` / ``"native"`` run the fused op ``wc_fast::flow_noise`` (see
    :mod:`wc_kernels.ops.flow_noise.library`), which reads each clean row once for all its K
    outputs (called directly in plain eager code, one node when compiled or traced);
    ``sigmas`` are used in fp32 and non-contiguous inputs are copied first.
    ``check_values=False`` skips the host-side range check of ``sigmas`` (a device sync on
    CUDA).
    """
    _check_inputs(x0, sigmas, noise, check_values)
    s, k = sigmas.shape
    if noise is None:
        noise = torch.randn((s * k, *x0.shape[1:]), generator=generator, device=x0.device,
                            dtype=x0.dtype)
    chosen = resolve("flow_noise", backend, x0.device, IMPLEMENTED)
    if chosen == "reference":
        return naive.flow_noise(x0, sigmas, noise)
    from wc_kernels._registry import op_for
    from wc_kernels.ops.flow_noise.library import FLOW_NOISE, FUSED

    return op_for(FLOW_NOISE, chosen, x0.device, FUSED)(x0, sigmas, noise)
