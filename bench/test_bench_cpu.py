"""CPU throughput of the fused ops: eager reference vs torch.compile(reference) vs native C++.

Run with ``pytest --benchmark-only bench/test_bench_cpu.py --benchmark-group-by=group``.
Every contender produces the same results: the NFT loss under one reduction and its gradient
with respect to ``v_theta`` through autograd (fp32, 16M elements per call; the ``native``
entry is the bare extension call, per-sample loss and gradient), or ``flow_noise``'s two
outputs, or the GRPO SDE loss (with a reference output and KL term) and its gradient with
respect to ``model_output`` (fp32, 8M elements per tensor). The public and native entries
record their speedups over the eager and compiled entries of the same group in ``extra_info``
(see ``--benchmark-json``). torch.compile is warmed up before timing.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from wc_kernels import flow_noise, reference

native = pytest.importorskip("wc_kernels._native", reason="the native extension is not built")

NFT_SHAPES = ((4, 1 << 22), (1, 1 << 24))  # 16M elements as 4 rows and as one row
SPACES = ("velocity", "x0")
REDUCTIONS = ("mean", "sum", "none")
# "public" is wc_kernels.nft_loss(backend="native") with autograd, when that backend is wired;
# "native" (last: it reads the others' times) calls the extension directly.
CONTENDERS = ("eager", "compile", "public", "native")
# S, K, D: 6 clean latents at 20 sigmas (2M elements per output, which stay in a 32 MiB
# cache), and 6 latents of one Wan 480p clip (4 latent frames x 16 channels x 60 x 104) at
# NFT's 5 sigmas (12M elements per output, written with streaming stores)
FLOW_SHAPES = ((6, 20, 16 * 4 * 16 * 16), (6, 5, 4 * 16 * 60 * 104))
GRPO_SHAPE = (8, 1 << 20)  # 8 samples of 1M latent elements
GRPO_KW = {"noise_level": 0.7, "clip_range": 0.2, "adv_clip_max": 5.0, "sigma_max": 0.98,
           "kl_beta": 0.04}

# Every (shape, space, reduction) group compiles the same reference function anew: without a
# higher limit, dynamo stops compiling it after 8 and the later groups time eager code.
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.fail_on_recompile_limit_hit = True

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
    module = importlib.import_module("wc_kernels.nft_loss")
    if "native" not in module.IMPLEMENTED:
        pytest.skip("wc_kernels.nft_loss has no native backend yet")
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


@pytest.fixture(scope="module", params=FLOW_SHAPES, ids=lambda shape: f"S{shape[0]}K{shape[1]}")
def flow_inputs(request):
    s, k, d = request.param
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(s, d, generator=gen), torch.rand(s, k, generator=gen),
            torch.randn(s * k, d, generator=gen))


@pytest.mark.parametrize("contender", ("eager", "compile", "public", "native"))
def test_flow_noise(benchmark, flow_inputs, contender):
    (s, k), d = flow_inputs[1].shape, flow_inputs[0].shape[1]
    group = f"flow_noise fp32 S={s} K={k} D={d}"
    benchmark.group = group
    fn = {"eager": reference.flow_noise,
          "compile": torch.compile(reference.flow_noise, dynamic=False),
          "public": lambda *a: flow_noise(*a, backend="native"),
          "native": native.flow_noise}[contender]
    result = fn(*flow_inputs)  # warm-up outside the timed region
    if contender in ("compile", "public"):  # agree with eager before being timed
        for got, expected in zip(result, reference.flow_noise(*flow_inputs), strict=True):
            torch.testing.assert_close(got, expected)
    benchmark.pedantic(fn, args=flow_inputs, rounds=30, warmup_rounds=2)
    _record(benchmark, group, contender)


@pytest.fixture(scope="module")
def grpo_inputs():
    b, d = GRPO_SHAPE
    gen = torch.Generator().manual_seed(0)
    make = lambda: torch.randn(b, d, generator=gen)
    model_output, sample, ref_output = make(), make(), make()
    sigma = torch.linspace(1.0, 0.2, b)
    sigma_next = sigma - 0.05
    prev_sample = sample - 0.05 * model_output + 0.1 * make()
    old_log_prob = reference.sde_log_prob(model_output, sample, prev_sample, sigma, sigma_next,
                                          noise_level=0.7, sigma_max=0.98)
    old_log_prob = old_log_prob + 0.1 * torch.randn(b, generator=gen)
    return (model_output, sample, prev_sample, sigma, sigma_next, old_log_prob,
            torch.randn(b, generator=gen), ref_output)


def _grpo_callable(contender: str, inputs: tuple):
    """The loss and its gradient w.r.t. model_output through autograd."""
    model_output, *rest, ref_output = inputs
    if contender == "public":
        from wc_kernels import grpo_sde_loss

        loss_fn = lambda *a, **kw: grpo_sde_loss(*a, **kw, backend="native")
    else:
        loss_fn = lambda *a, **kw: reference.grpo_sde_loss(*a, **kw)[0]
        if contender == "compile":
            loss_fn = torch.compile(loss_fn, dynamic=False)

    def run():
        leaf = model_output.detach().requires_grad_()
        loss = loss_fn(leaf, *rest, ref_output=ref_output, **GRPO_KW)
        (grad,) = torch.autograd.grad(loss, leaf)
        return loss.detach(), grad

    return run


@pytest.mark.parametrize("contender", ("eager", "compile", "public"))
def test_grpo_sde_loss_and_grad(benchmark, grpo_inputs, contender):
    b, d = GRPO_SHAPE
    group = f"grpo_sde_loss+grad fp32 {b}x{d} with ref"
    benchmark.group = group
    fn = _grpo_callable(contender, grpo_inputs)
    result = fn()  # warm-up outside the timed region (compiles the torch.compile contender)
    if contender != "eager":  # agree with eager before being timed
        want = _grpo_callable("eager", grpo_inputs)()
        for got, expected in zip(result, want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    benchmark.pedantic(fn, rounds=10, warmup_rounds=1)
    _record(benchmark, group, contender)


def _host_cost_call(op: str, route: str):
    """One call of ``op``'s native fused op with its backward at 8 x 64 fp32, through the
    direct eager route or the registered ``torch.library`` op."""
    from wc_kernels.ops.flow_noise.library import FLOW_NOISE
    from wc_kernels.ops.flow_noise.library import FUSED as FLOW
    from wc_kernels.ops.grpo_sde_loss.library import FUSED as GRPO
    from wc_kernels.ops.grpo_sde_loss.library import GRPO_LOSS
    from wc_kernels.ops.nft_loss.library import FUSED as NFT
    from wc_kernels.ops.nft_loss.library import NFT_LOSS

    gen = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    leaf = make(8, 64).requires_grad_()
    if op == "nft_loss":
        fused, args = NFT[NFT_LOSS], (leaf, make(8, 64), make(8, 64), torch.rand(8), None, 1.0,
                                      False, 0.125, True)
    elif op == "flow_noise":
        leaf = make(2, 64).requires_grad_()
        fused, args = FLOW[FLOW_NOISE], (leaf, torch.rand(2, 4), make(8, 64))
    else:
        sigma = torch.linspace(0.9, 0.2, 8)
        fused, args = GRPO[GRPO_LOSS], (leaf, make(8, 64), make(8, 64), sigma, sigma - 0.05,
                                        make(8) - 60.0, make(8), None, 0.7, 0.98, 0.2, 2.0, 0.0)
    call = fused.direct if route == "direct" else fused.registered

    def run():
        out = call(*args)
        return torch.autograd.grad(out[0], leaf, torch.ones_like(out[0]))

    return run


@pytest.mark.parametrize("route", ["direct", "registered"])
@pytest.mark.parametrize("op", ["nft_loss", "flow_noise", "grpo_sde_loss"])
def test_host_cost(benchmark, op, route):
    """Host time of one fused call with its backward at a size where the call is nearly all
    host cost: the direct eager route against the registered op (the same native kernels)."""
    benchmark.group = f"host cost {op} 8x64 fp32 native"
    run = _host_cost_call(op, route)
    run()
    benchmark(run)
    _record(benchmark, benchmark.group, route)
