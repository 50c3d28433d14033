"""3D rotary position embedding over (frame, row, column) tokens."""

from __future__ import annotations

import torch
from torch import Tensor


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Rotated dims per axis (frame, row, column), each even; leftover dims are not rotated."""
    frame = 2 * (head_dim // 8)
    spatial = 2 * ((head_dim - frame) // 4)
    return frame, spatial, spatial


def rope_angles(frame_pos: Tensor, grid: int, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Angles ``[N, head_dim // 2]`` for frames ``frame_pos`` ``[F]`` of ``grid x grid`` tokens.

    Token order is frame-major, then row, then column (``N = F * grid * grid``).
    """
    dims = axis_dims(head_dim)
    f = frame_pos.to(torch.float64)
    rows = torch.arange(grid, dtype=torch.float64, device=f.device)
    pos_f = f.repeat_interleave(grid * grid)
    pos_r = rows.repeat_interleave(grid).repeat(len(f))
    pos_c = rows.repeat(grid * len(f))
    parts = []
    for pos, dim in zip((pos_f, pos_r, pos_c), dims, strict=True):
        freqs = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=f.device) / dim)
        parts.append(pos[:, None] * freqs[None, :])
    used = sum(dims) // 2
    parts.append(torch.zeros(len(pos_f), head_dim // 2 - used, dtype=torch.float64,
                             device=f.device))
    return torch.cat(parts, dim=1).to(torch.float32)


def rope_tables(frame_pos: Tensor, grid: int, head_dim: int, dtype: torch.dtype = torch.float32
                ) -> tuple[Tensor, Tensor]:
    """Cosines and sines ``[N, head_dim // 2]`` of :func:`rope_angles` in ``dtype``.

    Computed once per forward and shared by every layer's queries and keys, so a compiled
    forward reads two small tables instead of re-evaluating them for every rotated element.
    """
    angles = rope_angles(frame_pos, grid, head_dim).to(dtype)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs ``(i, i + Dh/2)`` of ``x`` ``[B, H, N, Dh]`` by the angles whose ``cos`` and
    ``sin`` ``[N, Dh/2]`` are given (:func:`rope_tables`); arithmetic in at least fp32."""
    half = x.shape[-1] // 2
    acc = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos.to(acc), sin.to(acc)
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)
