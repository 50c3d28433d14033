"""``nft_loss_fwd`` on the native C++ CPU kernel (``wc_kernels._native``, from ``csrc/``)."""

from __future__ import annotations

import torch
from torch import Tensor


def nft_loss_fwd(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor,
                 sigma: Tensor | None, beta: float, x0: bool, grad_scale: float = 1.0
                 ) -> tuple[Tensor, Tensor]:
    """The kernel on contiguous rows, with ``r`` and ``sigma`` in fp32."""
    from wc_kernels import _native

    sig = None if sigma is None else sigma.to(torch.float32).contiguous()
    return _native.nft_loss_fwd(v_theta.contiguous(), v_old.contiguous(), v_target.contiguous(),
                                r.to(torch.float32).contiguous(), sig, beta, x0, grad_scale)
