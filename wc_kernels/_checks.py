"""Argument checks shared by the public ops: clear errors instead of silent wrong results."""

from __future__ import annotations

import torch
from torch import Tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(name: str, t: object, *, min_dim: int = 0, dtypes=FLOAT_DTYPES) -> Tensor:
    """``t`` is a tensor of one of ``dtypes`` with at least ``min_dim`` dimensions."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape "
                         f"{tuple(t.shape)}")
    return t


def check_like(name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    """``t`` matches ``ref`` in shape, dtype and device."""
    if t.shape != ref.shape:
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(ref.shape)}, "
                         f"got {tuple(t.shape)}")
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}")
    check_device(name, t, ref_name, ref)


def check_device(name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; "
                         "move them to one device")


def check_shape(name: str, t: Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({what}), got {tuple(t.shape)}")


def values_checkable() -> bool:
    """Value checks read tensors on the host: skip them while compiling, capturing a graph or
    running on fake tensors (``FakeTensorMode``, as a memory estimate does), which hold no
    values."""
    if torch.compiler.is_compiling() or torch._guards.detect_fake_mode() is not None:
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_finite(name: str, t: Tensor) -> None:
    if values_checkable() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite, got NaN or inf")


def check_range(name: str, t: Tensor, lo: float, hi: float) -> None:
    """All elements of ``t`` are finite and within ``[lo, hi]`` (see :func:`check_ranges`)."""
    check_ranges({name: t}, lo, hi)


def check_ranges(tensors: dict[str, Tensor], lo: float, hi: float) -> None:
    """All elements of each named tensor are finite and within ``[lo, hi]``: one fused
    min/max reduction per tensor, all read back in one transfer (NaN propagates into both
    bounds and fails the comparison). The error names the first tensor out of range."""
    tensors = {name: t for name, t in tensors.items() if t.numel()}
    if not values_checkable() or not tensors:
        return
    bounds = torch.stack([torch.stack(torch.aminmax(t.detach())).double()
                          for t in tensors.values()]).tolist()
    for (name, t), (low, high) in zip(tensors.items(), bounds, strict=True):
        if not (lo <= low and high <= hi):
            check_finite(name, t)
            raise ValueError(f"{name} must lie in [{lo}, {hi}], got values in "
                             f"[{low:.4g}, {high:.4g}]")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
