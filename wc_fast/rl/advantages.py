"""Group advantages, optimality and candidate selection (docs/design.md section 4, steps 4-5)."""

from __future__ import annotations

import math
import typing

import torch
import torch.distributed as dist
from torch import Tensor

from wc_fast.config import StdMode

STD_MODES = typing.get_args(StdMode)
ADVANTAGE_EPS = 1e-8


def _check_scores(name: str, s: object) -> Tensor:
    if not isinstance(s, Tensor) or not s.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor [B, G], got "
                        f"{getattr(s, 'dtype', type(s).__name__)}")
    if s.dim() != 2 or s.shape[0] < 1 or s.shape[1] < 2:
        raise ValueError(f"{name} must have shape [B, G] with B >= 1 groups of G >= 2 "
                         f"candidates, got {tuple(s.shape)}")
    return s


def _check_finite(name: str, s: Tensor) -> None:
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"{name} must be finite; got NaN or inf (check the reward model)")


def _global_std(s: Tensor, process_group: dist.ProcessGroup | None) -> Tensor:
    """Unbiased std over every score of every group (and every rank when a group is given)."""
    stats = torch.stack([s.sum(), (s * s).sum(), torch.tensor(float(s.numel()), dtype=s.dtype,
                                                               device=s.device)])
    if process_group is not None:
        dist.all_reduce(stats, group=process_group)
    total, total_sq, n = stats.unbind()
    var = (total_sq - total * total / n).clamp_min(0.0) / (n - 1)
    return var.sqrt()


def group_advantages(
    scores: Tensor,
    *,
    std: str = "group",
    process_group: dist.ProcessGroup | None = None,
) -> Tensor:
    """``(s - mean_group) / (std + 1e-8)`` per group ``[B, G]``, in float64.

    ``std="group"`` uses each group's unbiased std, ``"global"`` the unbiased std over all
    groups (all ranks of ``process_group`` when given). A group whose scores are all equal has
    advantage exactly 0 (never NaN, and never amplified rounding noise).
    """
    if std not in STD_MODES:
        raise ValueError(f"std must be one of {STD_MODES}, got {std!r}")
    s = scores.to(torch.float64)
    mean = s.mean(dim=1, keepdim=True)
    if std == "group":
        scale = s.std(dim=1, keepdim=True)
    else:
        scale = _global_std(s, process_group)
    adv = (s - mean) / (scale + ADVANTAGE_EPS)
    flat_group = s.amax(dim=1, keepdim=True) == s.amin(dim=1, keepdim=True)
    return torch.where(flat_group, torch.zeros_like(adv), adv)


def optimality(
    s_if: Tensor,
    s_vq: Tensor,
    *,
    lam: float = 2.0 / 3.0,
    Z: float = 2.0,
    std: str = "group",
    process_group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor]:
    """Optimality ``r`` and combined advantage ``A``, both ``[B, G]``.

    ``A = lam * a_IF + (1 - lam) * a_VQ`` with per-group z-scored rewards, and
    ``r = 1/2 + 1/2 * clip(A / Z, -1, 1)`` in [0, 1]. Returned in the scores' dtype.
    """
    _check_scores("s_if", s_if)
    _check_scores("s_vq", s_vq)
    if s_if.shape != s_vq.shape:
        raise ValueError(f"s_vq must have the shape of s_if {tuple(s_if.shape)}, got "
                         f"{tuple(s_vq.shape)}")
    if s_if.device != s_vq.device:
        raise ValueError(f"s_vq is on {s_vq.device} but s_if is on {s_if.device}")
    _check_finite("s_if", s_if)
    _check_finite("s_vq", s_vq)
    if not (isinstance(lam, (int, float)) and 0.0 <= lam <= 1.0):
        raise ValueError(f"lam must lie in [0, 1], got {lam!r}")
    if not (isinstance(Z, (int, float)) and math.isfinite(Z) and Z > 0):
        raise ValueError(f"Z must be a finite number > 0, got {Z!r}")
    a_if = group_advantages(s_if, std=std, process_group=process_group)
    a_vq = group_advantages(s_vq, std=std, process_group=process_group)
    adv = lam * a_if + (1.0 - lam) * a_vq
    r = 0.5 + 0.5 * (adv / Z).clamp(-1.0, 1.0)
    out_dtype = torch.promote_types(s_if.dtype, s_vq.dtype)
    return r.to(out_dtype), adv.to(out_dtype)


def select_extremes(A: Tensor, k: int = 3, *, generator: torch.Generator | None = None
                    ) -> Tensor:
    """Indices ``[B, 2k]`` of the top-k candidates (best first) then the bottom-k (worst first).

    Ties keep candidate order (stable sort), so the selection is deterministic; with a
    ``generator``, tied candidates are ordered by a random permutation drawn from it instead, so
    that no candidate index is favoured at the cut (label rewards tie often).
    """
    if not isinstance(A, Tensor) or A.dim() != 2:
        raise ValueError(f"A must be a tensor [B, G], got "
                         f"{tuple(A.shape) if isinstance(A, Tensor) else type(A).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or 2 * k > A.shape[1]:
        raise ValueError(f"k must be an int with 1 <= k and 2k <= G = {A.shape[1]}, got {k!r}")
    if A.is_floating_point() and not bool(torch.isfinite(A).all()):
        raise ValueError("A must be finite, got NaN or inf")
    if generator is None:
        order = torch.sort(A, dim=1, descending=True, stable=True).indices
    else:
        perm = torch.stack([torch.randperm(A.shape[1], generator=generator,
                                           device=generator.device) for _ in range(A.shape[0])])
        perm = perm.to(A.device)
        shuffled = torch.sort(A.gather(1, perm), dim=1, descending=True, stable=True).indices
        order = perm.gather(1, shuffled)
    return torch.cat([order[:, :k], order[:, -k:].flip(1)], dim=1)
