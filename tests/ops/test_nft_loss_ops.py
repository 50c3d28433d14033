"""torch.library registration of ``wc_fast::nft_loss_fwd`` and its Triton twin: opcheck,
gradcheck, and the op without triton or without the native extension (``torch.compile`` of
the ops together is in ``test_registry.py``)."""

import pytest
import torch

from wc_kernels import _backend, _registry, nft_loss
from wc_kernels.ops.nft_loss import library
from wc_kernels.ops.nft_loss.library import NFT_LOSS, OPS

NATIVE = _backend.native_built()
GPU = pytest.mark.gpu


def _nft_args(b=3, d=20, dtype=torch.float32, device="cpu", x0=True, grad=True,
              grad_scale=None):
    g = torch.Generator().manual_seed(0)
    vt, vo, vs = (torch.randn(b, d, generator=g, dtype=dtype).to(device) for _ in range(3))
    r, sigma = torch.rand(b, generator=g).to(device), torch.rand(b, generator=g).to(device)
    scale = () if grad_scale is None else (grad_scale,)
    return (vt.requires_grad_(grad), vo, vs, r, sigma if x0 else None, 0.5, x0, *scale)


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck(name):
    for kw in [{"x0": True}, {"x0": False, "dtype": torch.float16},
               {"x0": True, "grad_scale": -0.25}]:
        torch.library.opcheck(OPS[name], _nft_args(**kw))


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradcheck_float64(name):
    """The registered backward against finite differences, w.r.t. v_theta in velocity space
    (x0 space detaches its weights, so its gradient is not the derivative)."""
    op = OPS[name]
    for grad_scale in (None, 0.3):
        vt, *rest = _nft_args(b=2, d=3, dtype=torch.float64, x0=False, grad_scale=grad_scale)
        assert torch.autograd.gradcheck(lambda v, rest=rest: op(v, *rest)[0], (vt,))


@pytest.mark.skipif(not NATIVE, reason="the native extension is not built")
def test_native_only_registration_without_triton(monkeypatch):
    """Without triton installed the op is a plain CPU custom op over the native kernel."""
    monkeypatch.setattr(_registry, "HAVE_TRITON", False)
    suffix = "_native_only_test"
    fused = library.define_ops(suffix, native_cpu=True)[NFT_LOSS + suffix]
    torch.library.opcheck(fused.registered,
                          _nft_args())


def test_unavailable_backend_under_compile_raises():
    def f(vt, vo, vs, r):
        return nft_loss(vt, vo, vs, r, backend="native")

    vt, vo, vs, r, *_ = _nft_args(x0=False)
    if NATIVE:
        pytest.skip("the native backend is built here")
    with pytest.raises(Exception, match="native extension wc_kernels._native is not built"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(vt, vo, vs, r)


@GPU
def test_opcheck_cuda():
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(OPS[NFT_LOSS], _nft_args(dtype=dtype, device="cuda"))
