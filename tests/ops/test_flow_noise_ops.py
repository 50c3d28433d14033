"""torch.library registration of ``wc_fast::flow_noise`` and its Triton twin: opcheck,
gradcheck, and the op without triton (``torch.compile`` of the ops together is in
``test_registry.py``)."""

import pytest
import torch

from wc_kernels import _backend, _registry
from wc_kernels.ops.flow_noise import library
from wc_kernels.ops.flow_noise.library import FLOW_NOISE, OPS

NATIVE = _backend.native_built()
GPU = pytest.mark.gpu


def _flow_args(s=2, k=3, d=10, dtype=torch.float32, device="cpu", grad=True):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(s, d, generator=g, dtype=dtype).to(device).requires_grad_(grad)
    sigmas = torch.rand(s, k, generator=g).to(device)
    noise = torch.randn(s * k, d, generator=g, dtype=dtype).to(device).requires_grad_(grad)
    return x0, sigmas, noise


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck(name):
    torch.library.opcheck(OPS[name], _flow_args())


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradcheck_float64(name):
    """The registered backward against finite differences, w.r.t. x0 and noise."""
    op = OPS[name]
    x0, sigmas, noise = _flow_args(s=2, k=2, d=3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, n: op(a, sigmas, n), (x0, noise))


@pytest.mark.skipif(not NATIVE, reason="the native extension is not built")
def test_native_only_registration_without_triton(monkeypatch):
    """Without triton installed the op is a plain CPU custom op over the native kernel."""
    monkeypatch.setattr(_registry, "HAVE_TRITON", False)
    suffix = "_native_only_test"
    fused = library.define_ops(suffix, native_cpu=True)[FLOW_NOISE + suffix]
    torch.library.opcheck(fused.registered,
                          _flow_args())


@GPU
def test_opcheck_cuda():
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(OPS[FLOW_NOISE], _flow_args(dtype=dtype, device="cuda"))
