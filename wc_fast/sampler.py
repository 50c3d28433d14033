"""Flow-matching sampler schedule (DESIGN section 3)."""

from __future__ import annotations

import torch
from torch import Tensor


def sigma_schedule(steps: int = 40, shift: float = 5.0) -> Tensor:
    """``steps + 1`` sigmas from 1 to 0: ``s' = shift*s / (1 + (shift-1)*s)``, s = linspace(1, 0).

    Equals diffusers' ``FlowMatchEulerDiscreteScheduler(shift=shift)`` after
    ``set_timesteps(sigmas=linspace(1, 0, steps + 1)[:-1])``. Computed in float64, returned fp32.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not shift > 0:
        raise ValueError(f"shift must be > 0, got {shift!r}")
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return (shift * s / (1.0 + (shift - 1.0) * s)).to(torch.float32)
