"""``sde_residual_sums`` and its backward on the native C++ CPU kernels (``wc_kernels._native``,
from ``csrc/``)."""

from __future__ import annotations

from torch import Tensor


def sde_residual_sums(model_output: Tensor, sample: Tensor, prev_sample: Tensor,
                      ref_output: Tensor | None, coef: Tensor) -> Tensor:
    """The forward kernel on contiguous rows."""
    from wc_kernels import _native

    ref = None if ref_output is None else ref_output.contiguous()
    return _native.sde_residual_sums(model_output.contiguous(), sample.contiguous(),
                                     prev_sample.contiguous(), ref, coef.contiguous())


def sde_residual_sums_bwd(weights: Tensor, model_output: Tensor, sample: Tensor,
                          prev_sample: Tensor, ref_output: Tensor | None, coef: Tensor
                          ) -> Tensor:
    """The backward kernel on contiguous rows."""
    from wc_kernels import _native

    ref = None if ref_output is None else ref_output.contiguous()
    return _native.sde_residual_sums_bwd(weights.contiguous(), model_output.contiguous(),
                                         sample.contiguous(), prev_sample.contiguous(), ref,
                                         coef.contiguous())
