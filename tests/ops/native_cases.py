"""Cases shared by the tests of the native C++ kernels (``wc_kernels._native``)."""

import importlib

import pytest
import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
COLS = (1, 3, 1000, 65537)


def public_module(name: str):
    """The module of a public op, skipping when it does not offer the native backend yet."""
    module = importlib.import_module(f"wc_kernels.ops.{name}")
    if "native" not in module.IMPLEMENTED:
        pytest.skip(f"wc_kernels.ops.{name} is not wired to the native backend")
    return module
