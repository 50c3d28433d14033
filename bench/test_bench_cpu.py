"""CPU throughput of the fused ops: eager reference vs torch.compile(reference) vs native C++.

Run with ``pytest --benchmark-only bench/test_bench_cpu.py --benchmark-group-by=group``.
Every contender produces the same results: the NFT loss under one reduction and its gradient
with respect to ``v_theta`` through autograd (fp32, 16M elements per call; the ``native``
entry is the bare extension call, per-sample loss and gradient), or ``flow_noise``'s two
outputs. The public and native entries record their speedups over the eager and compiled
entries of the same group in ``extra_info`` (see ``--benchmark-json``). torch.compile is warmed
up before timing.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels import reference

native = pytest.importorskip("kernels._native", reason="the native extension is not built")

NFT_SHAPES = ((4, 1 << 22), (1, 1 << 24))  # 16M elements as 4 rows and as one row
SPACES = ("velocity", "x0")
REDUCTIONS = ("mean", "sum", "none")
# "public" is kernels.nft_loss(backend="native") with autograd, when that backend is wired;
# "native" (last: it reads the others' times) calls the extension directly.
CONTENDERS = ("eager", "compile", "public", "native")
FLOW_SHAPE = (6, 20, 16 * 4 * 16 * 16)  # S, K, D: 6 clean latents at 20 sigmas, 2M outputs

# Median seconds of every finished benchmark, by (group, contender).
_MEDIANS: dict[tuple[str, str], float] = {}


def _reduce(per_sample, reduction: str):
    return {"mean": per_sample.mean, "sum": per_sample.sum,
            "none": lambda: per_sample}[reduction]()


def _loss_and_grad(loss_fn, inputs: dict, space: str):
    """The loss and d(loss summed)/d v_theta through autograd."""
    v_theta = inputs["v_theta"].detach().requires_grad_()
    loss = loss_fn(v_theta, inputs["v_old"], inputs["v_target"], inputs["r"],
                   sigma=inputs["sigma"], space=space)
    (grad,) = torch.autograd.grad(loss.sum(), v_theta)
    return loss.detach(), grad


def _reduced_reference(loss_fn, reduction: str):
    return lambda *args, **kw: _reduce(loss_fn(*args, **kw), reduction)


def _public_nft_loss(reduction: str):
    """The public op, or a skip when its native backend is not wired yet."""
    module = importlib.import_module("kernels.nft_loss")
    if "native" not in module.IMPLEMENTED:
        pytest.skip("kernels.nft_loss has no native backend yet")
    return lambda *args, **kw: module.nft_loss(*args, **kw, reduction=reduction,
                                               backend="native")


def _nft_callable(contender: str, inputs: dict, space: str, reduction: str):
    if contender == "public":
        return lambda: _loss_and_grad(_public_nft_loss(reduction), inputs, space)
    if contender == "native":
        args = (inputs["v_theta"], inputs["v_old"], inputs["v_target"], inputs["r"],
                inputs["sigma"], 1.0, space == "x0")
        return lambda: native.nft_loss_fwd(*args)
    loss_fn = _reduced_reference(reference.nft_loss, reduction)
    if contender == "compile":
        loss_fn = torch.compile(loss_fn, dynamic=False)
    return lambda: _loss_and_grad(loss_fn, inputs, space)


def _record(benchmark, group: str, contender: str) -> None:
    """Remember this contender's median; the native entry stores its speedups."""
    if benchmark.stats is None:  # --benchmark-disable: run once, nothing timed
        return
    _MEDIANS[(group, contender)] = benchmark.stats.stats.median
    if contender not in ("public", "native"):
        return
    for base in ("eager", "compile"):
        if (group, base) in _MEDIANS:
            speedup = _MEDIANS[(group, base)] / _MEDIANS[(group, contender)]
            benchmark.extra_info[f"speedup_vs_{base}"] = round(speedup, 2)


@pytest.fixture(scope="module", params=NFT_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def nft_inputs(request):
    b, d = request.param
    gen = torch.Generator().manual_seed(0)
    make = lambda: torch.randn(b, d, generator=gen)
    return {"v_theta": make(), "v_old": make(), "v_target": make(),
            "r": torch.rand(b, generator=gen), "sigma": torch.rand(b, generator=gen)}


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("space", SPACES)
def test_nft_loss_and_grad(benchmark, nft_inputs, space, reduction, contender):
    b, d = nft_inputs["v_theta"].shape
    group = f"nft_loss+grad fp32 {b}x{d} {space} {reduction}"
    benchmark.group = group
    fn = _nft_callable(contender, nft_inputs, space, reduction)
    result = fn()  # warm-up outside the timed region (compiles the torch.compile contender)
    if contender in ("compile", "public"):  # agree with eager before being timed
        want = _nft_callable("eager", nft_inputs, space, reduction)()
        for got, expected in zip(result, want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    benchmark.pedantic(fn, rounds=10, warmup_rounds=1)
    _record(benchmark, group, contender)


@pytest.fixture(scope="module")
def flow_inputs():
    s, k, d = FLOW_SHAPE
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(s, d, generator=gen), torch.rand(s, k, generator=gen),
            torch.randn(s * k, d, generator=gen))


@pytest.mark.parametrize("contender", ("eager", "compile", "native"))
def test_flow_noise(benchmark, flow_inputs, contender):
    s, k, d = FLOW_SHAPE
    group = f"flow_noise fp32 S={s} K={k} D={d}"
    benchmark.group = group
    fn = {"eager": reference.flow_noise,
          "compile": torch.compile(reference.flow_noise, dynamic=False),
          "native": native.flow_noise}[contender]
    fn(*flow_inputs)  # warm-up outside the timed region
    benchmark.pedantic(fn, args=flow_inputs, rounds=30, warmup_rounds=2)
    _record(benchmark, group, contender)
