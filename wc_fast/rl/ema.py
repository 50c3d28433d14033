"""EMA of the old (rollout) model: decay schedules and an in-place on-device update."""

from __future__ import annotations

import typing

import torch
from torch import nn

from wc_fast.config import EmaSchedule

SCHEDULES = typing.get_args(EmaSchedule)


def ema_decay(step: int, total_steps: int, *, start: float = 0.4, end: float = 0.8,
              schedule: str = "linear") -> float:
    """Decay ``eta`` at iteration ``step`` (0-based) of ``total_steps``.

    ``linear`` (paper): ``start`` at step 0 to ``end`` at the last step ``total_steps - 1``.
    ``official`` (WorldCompass code): ``min(0.9, 0.2 + 0.01 * step)``; ``start``/``end`` unused.
    ``constant``: ``start`` throughout.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be an int >= 1, got {total_steps!r}")
    for name, value in (("start", start), ("end", end)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    if schedule == "official":
        return min(0.9, 0.2 + 0.01 * step)
    if schedule == "constant" or total_steps == 1:
        return float(start)
    frac = min(step / (total_steps - 1), 1.0)
    return float(start + (end - start) * frac)


@torch.no_grad()
def ema_update(old: nn.Module, current: nn.Module, decay: float) -> None:
    """``old <- decay * old + (1 - decay) * current`` for every parameter ``current`` trains,
    in place, on device.

    One ``torch._foreach_lerp_`` over the parameters that require a gradient in ``current``;
    the frozen ones (a LoRA run's backbone, all but the conditioning with ``optim.trainable
    conditioning``) never change, so the two models already hold them equal. Buffers are
    copied.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must lie in [0, 1], got {decay!r}")
    old_params = list(old.parameters())
    new_params = list(current.parameters())
    if len(old_params) != len(new_params):
        raise ValueError(f"old and current models differ: {len(old_params)} vs "
                         f"{len(new_params)} parameters")
    for a, b in zip(old_params, new_params, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            raise ValueError(f"parameter mismatch between old and current model: "
                             f"{tuple(a.shape)} {a.dtype} {a.device} vs "
                             f"{tuple(b.shape)} {b.dtype} {b.device}")
    trained = [(a, b) for a, b in zip(old_params, new_params, strict=True) if b.requires_grad]
    if trained:
        averaged, targets = zip(*trained, strict=True)
        torch._foreach_lerp_(list(averaged), list(targets), 1.0 - decay)
    for a, b in zip(old.buffers(), current.buffers(), strict=True):
        a.copy_(b)
