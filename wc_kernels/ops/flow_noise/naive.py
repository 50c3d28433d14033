"""Plain-PyTorch reference of ``flow_noise``: the spec every fast backend is tested against.

Written for clarity, not speed: it materializes every intermediate and lets autograd derive
the gradients. Inputs are validated by the public op in :mod:`wc_kernels.flow_noise`.
"""

from __future__ import annotations

from torch import Tensor

from wc_kernels._dtypes import compute_dtype


def flow_noise(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """Noisy samples and velocity targets for K sigmas per clean sample.

    ``x0`` ``[S, ...]``, ``sigmas`` ``[S, K]``, ``noise`` ``[S*K, ...]`` ->
    ``x_t, v_target`` ``[S*K, ...]`` where row ``s*K + j`` is
    ``x_t = (1 - sigmas[s, j]) * x0[s] + sigmas[s, j] * noise[s*K + j]`` and
    ``v_target = noise[s*K + j] - x0[s]``. Outputs have ``x0``'s dtype.
    """
    acc = compute_dtype(x0.dtype)
    s, k = sigmas.shape
    x = x0.to(acc).repeat_interleave(k, dim=0)
    eps = noise.to(acc)
    sig = sigmas.to(acc).reshape(s * k, *([1] * (x0.dim() - 1)))
    x_t = (1.0 - sig) * x + sig * eps
    v_target = eps - x
    return x_t.to(x0.dtype), v_target.to(x0.dtype)
