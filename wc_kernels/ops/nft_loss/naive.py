"""Plain-PyTorch reference of ``nft_loss``: the spec every fast backend is tested against.

Written for clarity, not speed: it materializes every intermediate and lets autograd derive
the gradients. Inputs are validated by the public op in :mod:`wc_kernels.nft_loss`.
"""

from __future__ import annotations

from torch import Tensor

from wc_kernels._dtypes import compute_dtype

X0_WEIGHT_FLOOR = 1e-5


def nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    v_target: Tensor,
    r: Tensor,
    *,
    beta: float = 1.0,
    sigma: Tensor | None = None,
    space: str = "velocity",
) -> Tensor:
    """Per-sample negative-aware flow-matching loss ``[B]`` (docs/design.md section 7).

    ``v_theta``, ``v_old``, ``v_target``: ``[B, ...]``; ``r``, ``sigma``: ``[B]``.
    ``v+ = (1-beta) v_old + beta v_theta`` is pulled toward ``v_target`` with weight ``r`` and
    ``v- = (1+beta) v_old - beta v_theta`` with weight ``1 - r``. In ``x0`` space each term is
    the squared x0 error ``e = -sigma (v -+ v*)`` divided by its own detached mean absolute error.
    Only ``v_theta`` receives a gradient.
    """
    acc = compute_dtype(v_theta.dtype)
    b = v_theta.shape[0]
    vt = v_theta.reshape(b, -1).to(acc)
    vo = v_old.detach().reshape(b, -1).to(acc)
    vs = v_target.detach().reshape(b, -1).to(acc)
    rr = r.detach().to(acc)
    v_pos = (1.0 - beta) * vo + beta * vt
    v_neg = (1.0 + beta) * vo - beta * vt
    if space == "velocity":
        l_pos = ((v_pos - vs) ** 2).mean(dim=1)
        l_neg = ((v_neg - vs) ** 2).mean(dim=1)
    elif space == "x0":
        s = sigma.detach().to(acc).reshape(b, 1)
        e_pos = -s * (v_pos - vs)
        e_neg = -s * (v_neg - vs)
        w_pos = e_pos.abs().mean(dim=1).clamp_min(X0_WEIGHT_FLOOR).detach()
        w_neg = e_neg.abs().mean(dim=1).clamp_min(X0_WEIGHT_FLOOR).detach()
        l_pos = (e_pos**2).mean(dim=1) / w_pos
        l_neg = (e_neg**2).mean(dim=1) / w_neg
    else:
        raise ValueError(f"space must be 'velocity' or 'x0', got {space!r}")
    return rr * l_pos + (1.0 - rr) * l_neg
