"""GPU throughput of the fused Triton ops against eager and torch.compile references.

Run::

    python -m pytest --benchmark-only bench/test_bench_kernels.py \\
        --benchmark-group-by=group

Skipped without CUDA (the CPU contenders are in ``bench/test_bench_cpu.py``). In each group
every contender computes the same thing: the per-sample NFT loss and its gradient w.r.t.
``v_theta`` for 16M elements (4 rows of 4M), ``flow_noise``'s two outputs, or the GRPO SDE
loss (with a reference output) and its gradient w.r.t. ``model_output`` (the public
``grpo_sde_loss`` for ``triton``: a read-only forward pass, then the gradient pass). One timed round
is ``REPEAT`` calls and a ``torch.cuda.synchronize()``. ``extra_info`` holds the time per call,
the bandwidth over the bytes the fused kernels actually move (every pass counted: the x0 loss
reads its three inputs twice and writes the gradient, 7 row-sized transfers; the GRPO loss
reads four inputs forward and again backward and writes the gradient, 9), and that bandwidth
as a percentage of a measured device-to-device copy (bytes read + written); then the same bytes
over the device time alone (``device_us_per_call``, ``kernel_pct_of_copy``: kernels and copies
summed by ``torch.profiler`` over one round, without the host time between them), which tells
a slow kernel from a call bound by host time.
"""

from __future__ import annotations

import pytest
import torch

from studies.op_profile import device_seconds_per_call
from wc_kernels import reference

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="GPU benchmarks need a CUDA device")

REPEAT = 10
ROUNDS = 20
NFT_SHAPE = (4, 1 << 22)  # 16M elements
FLOW_SHAPE = (6, 20, 1 << 17)  # S, K, D: 15.7M noisy elements from 6 clean rows
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CONTENDERS = ("triton", "eager", "compile")  # ours first: a step cut short by time keeps it
GRPO_SHAPE = (8, 1 << 21)  # 16M elements per tensor
GRPO_KW = {"noise_level": 0.7, "clip_range": 0.2, "adv_clip_max": 5.0, "sigma_max": 0.98,
           "kl_beta": 0.04}


@pytest.fixture(scope="module")
def copy_bandwidth() -> float:
    """Bytes per second (read + write) of a 1 GiB device-to-device copy, median of 20."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.nbytes / sorted(times)[len(times) // 2]


def _bench(benchmark, fn, bytes_moved: int, copy_bw: float) -> None:
    """Time ``fn`` (already warmed up) and record bandwidth figures in ``extra_info``."""

    def one_round():
        for _ in range(REPEAT):
            fn()
        torch.cuda.synchronize()

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=2)
    per_call = benchmark.stats.stats.median / REPEAT
    device = device_seconds_per_call(fn, REPEAT, torch.device("cuda"))
    benchmark.extra_info.update(
        calls_per_round=REPEAT,
        us_per_call=round(per_call * 1e6, 1),
        bytes_per_call=bytes_moved,
        gb_per_s=round(bytes_moved / per_call / 1e9, 1),
        pct_of_copy=round(100 * bytes_moved / per_call / copy_bw, 1),
        copy_gb_per_s=round(copy_bw / 1e9, 1),
        device_us_per_call=round(device * 1e6, 1),
        kernel_pct_of_copy=round(100 * bytes_moved / device / copy_bw, 1),
    )


def _nft_loss_op():
    from wc_kernels.ops.nft_loss.library import FUSED, NFT_LOSS

    return FUSED[NFT_LOSS]


def _flow_noise_op():
    from wc_kernels.ops.flow_noise.library import FLOW_NOISE, FUSED

    return FUSED[FLOW_NOISE]


def _nft_contender(contender: str, inputs: tuple, space: str):
    """A no-argument callable returning (per-sample loss [B], dL_i/dv_theta [B, D])."""
    vt, vo, vs, r, sigma = inputs
    if contender == "triton":
        op = _nft_loss_op()
        return lambda: op(vt, vo, vs, r, sigma, 1.0, space == "x0")
    loss_fn = reference.nft_loss
    if contender == "compile":
        loss_fn = torch.compile(reference.nft_loss, dynamic=False)

    def loss_and_grad():
        leaf = vt.detach().requires_grad_()
        loss = loss_fn(leaf, vo, vs, r, sigma=sigma, space=space)
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
        return loss.detach(), grad

    return loss_and_grad


@pytest.fixture(scope="module", params=list(DTYPES))
def nft_inputs(request):
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, d = NFT_SHAPE
    dtype = DTYPES[request.param]
    make = lambda: torch.randn(b, d, device="cuda", generator=gen).to(dtype)
    inputs = (make(), make(), make(), torch.rand(b, device="cuda", generator=gen),
              torch.rand(b, device="cuda", generator=gen))
    return request.param, inputs


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("space", ["velocity", "x0"])
def test_nft_loss_and_grad(benchmark, nft_inputs, space, contender, copy_bandwidth):
    name, inputs = nft_inputs
    b, d = NFT_SHAPE
    benchmark.group = f"nft_loss+grad {name} {b}x{d} {space}"
    fn = _nft_contender(contender, inputs, space)
    loss, grad = fn()  # warm-up (compiles) and a check against eager
    want_loss, want_grad = _nft_contender("eager", inputs, space)()
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-2, atol=1e-2 * want_grad.abs().max())
    elem = inputs[0].element_size()
    _bench(benchmark, fn, (7 if space == "x0" else 4) * b * d * elem, copy_bandwidth)


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_flow_noise(benchmark, dtype, contender, copy_bandwidth):
    s, k, d = FLOW_SHAPE
    benchmark.group = f"flow_noise {dtype} S={s} K={k} D={d}"
    gen = torch.Generator(device="cuda").manual_seed(1)
    x0 = torch.randn(s, d, device="cuda", generator=gen).to(DTYPES[dtype])
    sigmas = torch.rand(s, k, device="cuda", generator=gen)
    noise = torch.randn(s * k, d, device="cuda", generator=gen).to(DTYPES[dtype])
    impl = {"eager": reference.flow_noise,
            "compile": torch.compile(reference.flow_noise, dynamic=False),
            "triton": _flow_noise_op()}[contender]
    got = impl(x0, sigmas, noise)  # warm-up (compiles) and a check against eager
    for out, want in zip(got, reference.flow_noise(x0, sigmas, noise), strict=True):
        torch.testing.assert_close(out, want)
    elem = x0.element_size()
    _bench(benchmark, lambda: impl(x0, sigmas, noise), (s * d + 3 * s * k * d) * elem,
           copy_bandwidth)


def _grpo_contender(contender: str, inputs: tuple):
    """A no-argument callable returning (loss, dloss/dmodel_output)."""
    from wc_kernels import grpo_sde_loss

    model_output, *rest, ref_output = inputs
    if contender == "triton":  # the sigmas are valid by construction: no host read
        loss_fn = lambda *a, **kw: grpo_sde_loss(*a, **kw, backend="triton", check_values=False)
    else:
        loss_fn = lambda *a, **kw: reference.grpo_sde_loss(*a, **kw)[0]
        if contender == "compile":
            loss_fn = torch.compile(loss_fn, dynamic=False)

    def loss_and_grad():
        leaf = model_output.detach().requires_grad_()
        loss = loss_fn(leaf, *rest, ref_output=ref_output, **GRPO_KW)
        (grad,) = torch.autograd.grad(loss, leaf)
        return loss.detach(), grad

    return loss_and_grad


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_grpo_sde_loss_and_grad(benchmark, dtype, contender, copy_bandwidth):
    b, d = GRPO_SHAPE
    benchmark.group = f"grpo_sde_loss+grad {dtype} {b}x{d} with ref"
    gen = torch.Generator(device="cuda").manual_seed(2)
    make = lambda: torch.randn(b, d, device="cuda", generator=gen).to(DTYPES[dtype])
    model_output, sample, ref_output = make(), make(), make()
    sigma = torch.linspace(1.0, 0.2, b, device="cuda")
    prev_sample = (sample.float() - 0.05 * model_output.float()).to(sample.dtype)
    old_log_prob = reference.sde_log_prob(model_output, sample, prev_sample, sigma,
                                          sigma - 0.05, noise_level=0.7, sigma_max=0.98)
    inputs = (model_output, sample, prev_sample, sigma, sigma - 0.05, old_log_prob,
              torch.randn(b, device="cuda", generator=gen), ref_output)
    fn = _grpo_contender(contender, inputs)
    loss, grad = fn()  # warm-up (compiles) and a check against eager
    want_loss, want_grad = _grpo_contender("eager", inputs)()
    torch.testing.assert_close(loss, want_loss, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1e-2, atol=1e-2 * want_grad.abs().max())
    # four inputs read forward and again backward, one gradient written
    _bench(benchmark, fn, 9 * b * d * model_output.element_size(), copy_bandwidth)
