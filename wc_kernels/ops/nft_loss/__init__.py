"""``nft_loss``: the negative-aware flow-matching loss of DiffusionNFT / WorldCompass."""

from __future__ import annotations

import math

from torch import Tensor

from wc_kernels import _checks
from wc_kernels._backend import resolve
from wc_kernels.ops.nft_loss import naive

SPACES = ("velocity", "x0")
REDUCTIONS = ("mean", "sum", "none")
IMPLEMENTED = ("reference", "triton", "native")


def _check_inputs(v_theta, v_old, v_target, r, beta, sigma, space, reduction, scale,
                  values) -> None:
    _checks.check_tensor("v_theta", v_theta, min_dim=1)
    _checks.check_like("v_old", _checks.check_tensor("v_old", v_old), "v_theta", v_theta)
    _checks.check_like("v_target", _checks.check_tensor("v_target", v_target), "v_theta",
                       v_theta)
    if v_theta.shape[0] == 0 or math.prod(v_theta.shape[1:]) == 0:
        raise ValueError(f"v_theta must be non-empty [B, ...], got shape {tuple(v_theta.shape)}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta):
        raise TypeError(f"beta must be a finite float, got {beta!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite float, got {scale!r}")
    if scale == 0:
        raise ValueError("scale must be non-zero (it multiplies the loss and its gradient)")
    _checks.check_choice("space", space, SPACES)
    _checks.check_choice("reduction", reduction, REDUCTIONS)
    b = v_theta.shape[0]
    _checks.check_tensor("r", r)
    _checks.check_shape("r", r, (b,), "one optimality value per sample")
    _checks.check_device("r", r, "v_theta", v_theta)
    ranged = {"r": r}
    if space == "x0":
        if sigma is None:
            raise ValueError("sigma [B] is required for space='x0'")
        _checks.check_tensor("sigma", sigma)
        _checks.check_shape("sigma", sigma, (b,), "one noise level per sample")
        _checks.check_device("sigma", sigma, "v_theta", v_theta)
        ranged["sigma"] = sigma
    if values:
        _checks.check_ranges(ranged, 0.0, 1.0)


def nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    v_target: Tensor,
    r: Tensor,
    *,
    beta: float = 1.0,
    sigma: Tensor | None = None,
    space: str = "velocity",
    reduction: str = "mean",
    scale: float = 1.0,
    backend: str = "auto",
    check_values: bool = True,
) -> Tensor:
    """Negative-aware flow-matching loss (docs/design.md section 7).

    ``v_theta`` (current model, gets the gradient), ``v_old`` (old model), ``v_target``
    (``eps - x0``): ``[B, ...]`` of one dtype (fp16, bf16, fp32; fp64 for gradcheck).
    ``r`` ``[B]`` in [0, 1] is the optimality of each sample; ``sigma`` ``[B]`` the noise level,
    required for ``space="x0"``. Returns the fp32 loss (fp64 for fp64 inputs), averaged
    (``"mean"``), summed (``"sum"``) or per sample ``[B]`` (``"none"``), times ``scale`` (for
    example ``1 / total`` when the samples of one step come in several calls).

    ``backend="triton"`` / ``"native"`` run the fused op ``wc_fast::nft_loss_fwd`` (see
    :mod:`wc_kernels.ops.nft_loss.library`): one pass over the inputs (two for ``x0``) yields the
    reduced loss and the gradient already multiplied by the reduction's factor and ``scale``,
    so the backward is one multiply by the upstream gradient. In plain eager code the kernels
    are called directly, without the ``torch.library`` dispatcher; compiled or traced, the op
    is one node. ``r`` and ``sigma`` are used in fp32 and non-contiguous inputs are copied
    first.

    ``check_values=False`` skips the range checks of ``r`` and ``sigma``, which read them on
    the host (a device sync on CUDA): for callers that validated them already.
    """
    _check_inputs(v_theta, v_old, v_target, r, beta, sigma, space, reduction, scale,
                  check_values)
    chosen = resolve("nft_loss", backend, v_theta.device, IMPLEMENTED)
    # the factor the reduction applies to each sample's loss (the fused op applies it to the
    # loss and the gradient it writes)
    factor = float(scale) / v_theta.shape[0] if reduction == "mean" else float(scale)
    if chosen != "reference":
        from wc_kernels._registry import op_for
        from wc_kernels.ops.nft_loss.library import FUSED, NFT_LOSS

        op = op_for(NFT_LOSS, chosen, v_theta.device, FUSED)
        x0 = space == "x0"
        loss, _ = op(v_theta, v_old, v_target, r, sigma if x0 else None, float(beta), x0,
                     factor, reduction != "none")
        return loss
    per_sample = naive.nft_loss(v_theta, v_old, v_target, r, beta=float(beta), sigma=sigma,
                                space=space)
    if factor != 1.0:
        per_sample = per_sample * factor
    return per_sample if reduction == "none" else per_sample.sum()
