"""``flow_noise`` on the native C++ CPU kernel (``wc_kernels._native``, from ``csrc/``)."""

from __future__ import annotations

import torch
from torch import Tensor


def flow_noise(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel on contiguous rows, with ``sigmas`` in fp32."""
    from wc_kernels import _native

    return _native.flow_noise(x0.contiguous(), sigmas.to(torch.float32).contiguous(),
                              noise.contiguous())
