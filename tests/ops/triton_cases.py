"""Cases and comparison shared by the tests of the fast elementwise backends (``triton``, and
``native`` when ``wc_kernels._native`` is built) against ``backend="reference"``."""

import pytest
import torch

from wc_kernels import _backend

GPU = pytest.mark.gpu
CPU_BACKENDS = ["triton"] + (["native"] if _backend.native_built() else [])
CASES = [  # (backend, device)
    *[(b, "cpu") for b in CPU_BACKENDS],
    pytest.param("triton", "cuda", marks=GPU, id="triton-cuda"),
]
# bf16 runs on every backend, the CPU ones too; only the CUDA cases need the gpu mark
DTYPES = [pytest.param(d, id=name) for d, name in ((torch.float32, "fp32"),
                                                   (torch.float16, "fp16"),
                                                   (torch.bfloat16, "bf16"))]


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 1) -> None:
    """fp32/fp64: relative 1e-5. fp16/bf16: within ``ulps`` units in the last place of the
    dtype (each rounding to the output dtype may land on the other neighbour), plus fp32
    rounding noise relative to the largest element."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.isfinite(actual).all(), "non-finite output (unwritten element?)"
    a, e = actual.double(), expected.double()
    scale = e.abs().max().item()
    if actual.dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6 * scale)
        return
    info = torch.finfo(actual.dtype)
    mag = torch.maximum(a.abs(), e.abs()).clamp_min(info.tiny)
    ulp = torch.exp2(torch.floor(torch.log2(mag))) * info.eps
    err = (a - e).abs()
    bad = err > ulps * ulp + 1e-6 * scale
    assert not bad.any(), (f"{int(bad.sum())} elements off by more than {ulps} ulp; worst "
                           f"{(err / ulp).max().item():.2f} ulp")
