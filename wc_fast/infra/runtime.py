"""Device choice and deterministic per-step random streams."""

from __future__ import annotations

import hashlib

import torch


def resolve_device(name: str, field: str = "train.device") -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error naming
    ``field``, the setting it came from."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{field}='cuda' but no CUDA device is available")
    return torch.device(name)


def compile_unavailable(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot generate code for ``device``, or ``None`` when it can.

    On CPU, Inductor writes C++ and needs a compiler on the machine; a laptop without one
    should still train (eagerly), not fail at its first iteration.
    """
    if device.type != "cpu":
        return None
    # Inductor's own compiler search (private, pinned with torch), so the answer is its answer
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as err:  # noqa: BLE001 - any failure of the search means "no compiler"
        return f"no C++ compiler for torch.compile's CPU code ({type(err).__name__}: {err})"
    return None


def stream_seed(*parts: int | str) -> int:
    """A 63-bit seed derived from ``parts`` (run seed, step, rank, purpose, ...).

    Each random draw of a step comes from its own stream, so a resumed run draws exactly what
    an uninterrupted one would, whatever happened before.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(*parts: int | str, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with :func:`stream_seed` of ``parts``."""
    return torch.Generator(device=device).manual_seed(stream_seed(*parts))


def uniform(gen: torch.Generator, shape: int | tuple[int, ...], lo: float, hi: float, *,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values uniform in ``[lo, hi)`` of ``shape``, drawn from ``gen`` (on the CPU)."""
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=dtype)
