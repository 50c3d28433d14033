"""Host cost of the fused ops as a tested budget (the Triton route, under the interpreter).

Each public call on ``backend="triton"`` launches a few ATen ops around its kernels; on a GPU
every one costs microseconds of host time, more than a small kernel runs. Counted as a
``TorchDispatchMode`` sees them (views and the autograd seed's ``ones_like`` included), over
one forward and its backward (``torch.autograd.grad``, so no leaf accumulation is counted),
and host reads (``.item()``, ``.tolist()``, ``bool()``, which a dispatch mode does not see) by
patching them. A dispatch mode makes the op take its registered route; the direct eager route
is checked to launch the same ATen ops (profiler) and give the same bits.
"""

import collections

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from wc_kernels import _backend, _registry, flow_noise, grpo_sde_loss, nft_loss
from wc_kernels.ops.flow_noise import library as flow_library
from wc_kernels.ops.grpo_sde_loss import library as grpo_library
from wc_kernels.ops.nft_loss import library as nft_library

NATIVE = _backend.native_built()
NFT_BUDGET = 3  # the op, the autograd seed, the backward's multiply
FLOW_BUDGET = 3
GRPO_BUDGET = 6  # measured: 3 (the op, the autograd seed, the backward op)
DTYPES = (torch.float32, torch.bfloat16)


class CountOps(TorchDispatchMode):
    """The ATen (and custom) ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def host_reads(monkeypatch) -> list[str]:
    """Names of the host reads made while the test runs."""
    reads: list[str] = []
    for name in ("item", "tolist", "__bool__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return reads


def _nft_inputs(dtype, x0: bool):
    g = torch.Generator().manual_seed(3)
    vt, vo, vs = (torch.randn(5, 3, 37, generator=g).to(dtype) for _ in range(3))
    r = torch.rand(5, generator=g)
    sigma = torch.rand(5, generator=g) if x0 else None
    return vt.requires_grad_(), vo, vs, r, sigma


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("space", ["velocity", "x0"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nft_loss_forward_and_backward_within_budget(host_reads, dtype, space, reduction):
    vt, vo, vs, r, sigma = _nft_inputs(dtype, space == "x0")
    kwargs = dict(sigma=sigma, space=space, reduction=reduction, backend="triton")
    for check_values, reads_allowed in ((False, 0), (True, 1)):
        host_reads.clear()
        with CountOps() as count:
            loss = nft_loss(vt, vo, vs, r, check_values=check_values, **kwargs)
            torch.autograd.grad(loss, vt)
        if not check_values:
            assert len(count.ops) <= NFT_BUDGET, count.ops
            assert count.ops[0] == "wc_fast.nft_loss_fwd_triton.default", count.ops
        assert len(host_reads) <= reads_allowed, host_reads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_noise", [True, False])
def test_flow_noise_forward_within_budget(host_reads, dtype, with_noise):
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(3, 2, 5, 7, generator=g).to(dtype)
    sigmas = torch.rand(3, 4, generator=g)
    noise = torch.randn(12, 2, 5, 7, generator=g).to(dtype) if with_noise else None
    with CountOps() as count:
        x_t, v = flow_noise(x0, sigmas, noise, backend="triton", check_values=False)
    assert len(count.ops) <= FLOW_BUDGET, count.ops
    assert x_t.shape == v.shape == (12, 2, 5, 7)
    assert not host_reads, host_reads


def _grpo_inputs(dtype, with_ref: bool, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    m, x, p, ref = (torch.randn(4, 3, 41, generator=g).to(dtype) for _ in range(4))
    sigma = torch.tensor([1.0, 0.8, 0.5, 0.3])
    sigma_next = sigma - 0.05
    old, adv = torch.randn(4, generator=g) - 60.0, torch.randn(4, generator=g)
    return m.requires_grad_(), x, p, sigma, sigma_next, old, adv, ref if with_ref else None


GRPO_KW = {"noise_level": 0.7, "clip_range": 0.2, "adv_clip_max": 2.0, "sigma_max": 0.98}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_ref", [False, True])
@pytest.mark.parametrize("return_stats", [False, True])
def test_grpo_sde_loss_forward_and_backward_within_budget(host_reads, dtype, with_ref,
                                                          return_stats):
    m, x, p, sigma, sigma_next, old, adv, ref = _grpo_inputs(dtype, with_ref)
    kw = dict(GRPO_KW, ref_output=ref, kl_beta=0.1 if with_ref else 0.0,
              return_stats=return_stats, backend="triton")
    for check_values, reads_allowed in ((False, 0), (True, 1)):
        host_reads.clear()
        with CountOps() as count:
            out = grpo_sde_loss(m, x, p, sigma, sigma_next, old, adv,
                                check_values=check_values, **kw)
            torch.autograd.grad(out[0] if return_stats else out, m)
        if not check_values:
            assert len(count.ops) <= GRPO_BUDGET, count.ops
            assert count.ops[0] == "wc_fast.grpo_sde_loss_fwd_triton.default", count.ops
        assert len(host_reads) <= reads_allowed, host_reads


def _routes(fused: dict, name: str) -> list[_registry.FusedOp]:
    return [fused[name + _registry.TRITON_TWIN]] + ([fused[name]] if NATIVE else [])


def _run(call, args: tuple, grad_of: list[torch.Tensor]) -> list[torch.Tensor]:
    outputs = call(*args)
    loss = outputs[0]
    upstream = torch.full_like(loss, 0.75)
    return [*outputs, *torch.autograd.grad(loss, grad_of, upstream)]


def _nft_args(dtype, reduce: bool):
    vt, vo, vs, r, _ = _nft_inputs(dtype, x0=True)
    sigma = torch.rand(5, generator=torch.Generator().manual_seed(5))
    return (vt, vo, vs, r, sigma, 0.7, True, 0.125, reduce), [vt]


def _flow_args(dtype, reduce: bool):
    g = torch.Generator().manual_seed(6)
    x0 = torch.randn(3, 4, 9, generator=g).to(dtype).requires_grad_()
    sigmas = torch.rand(3, 2, generator=g).requires_grad_()
    noise = torch.randn(6, 4, 9, generator=g).to(dtype).requires_grad_()
    return (x0, sigmas, noise), [x0, sigmas, noise]


def _grpo_args(dtype, with_ref: bool):
    m, x, p, sigma, sigma_next, old, adv, ref = _grpo_inputs(dtype, with_ref)
    args = (m, x, p, sigma, sigma_next, old, adv, ref, 0.7, 0.98, 0.2, 2.0,
            0.1 if with_ref else 0.0)
    return args, [m]


OPS = [(nft_library.FUSED, nft_library.NFT_LOSS, _nft_args),
       (flow_library.FUSED, flow_library.FLOW_NOISE, _flow_args),
       (grpo_library.FUSED, grpo_library.GRPO_LOSS, _grpo_args)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", [True, False])
@pytest.mark.parametrize(("fused", "name", "make"), OPS)
def test_direct_and_registered_routes_give_the_same_bits(fused, name, make, variant, dtype):
    """``variant``: nft_loss reduced or per sample, grpo_sde_loss with or without a reference
    output (flow_noise has none)."""
    for op in _routes(fused, name):
        args, grad_of = make(dtype, variant)
        direct = _run(op.direct, args, grad_of)
        registered = _run(op.registered, args, grad_of)
        for a, b in zip(direct, registered, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a, b)


@pytest.mark.parametrize(("fused", "name", "make"), OPS)
def test_direct_route_launches_the_registered_routes_aten_ops(fused, name, make):
    """The profiler sees inside both routes: the same ATen ops, only the dispatch differs."""
    counts = []
    for route in ("direct", "registered"):
        op = fused[name + _registry.TRITON_TWIN]
        args, grad_of = make(torch.float32, True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _run(getattr(op, route), args, grad_of)
        counts.append(collections.Counter(e.name for e in prof.events()
                                          if e.name.startswith("aten::")))
    assert counts[0] == counts[1]


def test_plain_eager_calls_skip_the_registered_op(monkeypatch):
    """Outside compile and dispatch modes the public ops never call the registered op; under
    a dispatch mode they do (there it must be one node)."""
    calls = []
    for fused, name in ((nft_library.FUSED, nft_library.NFT_LOSS),
                        (flow_library.FUSED, flow_library.FLOW_NOISE)):
        key = name + _registry.TRITON_TWIN
        op = fused[key]

        def registered(*args, _op=op):
            calls.append(_op)
            return _op.registered(*args)

        monkeypatch.setitem(fused, key, _registry.FusedOp(registered, op.direct))
    vt, vo, vs, r, _ = _nft_inputs(torch.float32, x0=False)
    x0, sigmas = torch.randn(2, 8), torch.rand(2, 3)
    nft_loss(vt, vo, vs, r, backend="triton").backward()
    flow_noise(x0, sigmas, backend="triton")
    assert calls == []
    with CountOps():
        nft_loss(vt, vo, vs, r, backend="triton")
        flow_noise(x0, sigmas, backend="triton")
    assert len(calls) == 2
