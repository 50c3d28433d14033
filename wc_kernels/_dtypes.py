"""The accumulation dtype every op and backend computes in."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32
