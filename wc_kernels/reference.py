"""Plain-PyTorch references of the drop-in ops, in one namespace. These functions ARE the spec.

Each op's reference lives beside its fast backends, in ``wc_kernels.<op>.naive``; this module
gathers them. Every fast backend (Triton, native C++) is tested against them. They are written
for clarity, not speed: they materialize every intermediate and let autograd derive the
gradients. Inputs are validated by the public entry points in ``wc_kernels``, not here.
"""

from __future__ import annotations

from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.flow_noise.naive import flow_noise
from wc_kernels.ops.grpo_sde_loss.naive import grpo_sde_loss, sde_log_prob, sde_std, sde_step_mean
from wc_kernels.ops.nft_loss.naive import X0_WEIGHT_FLOOR, nft_loss
from wc_kernels.ops.prefix_attention.naive import prefix_attention

__all__ = ["nft_loss", "flow_noise", "prefix_attention", "sde_log_prob", "grpo_sde_loss",
           "compute_dtype", "sde_std", "sde_step_mean", "X0_WEIGHT_FLOOR"]
