"""The native C++ ``nft_loss_fwd`` kernel (``wc_kernels._native``) against the plain-PyTorch
reference.

The pybind function is called directly, and through the public op with ``backend="native"``.
Every test runs with output poisoning on: outputs start as NaN, so an element the kernel
forgets to write fails the comparison.
"""

from __future__ import annotations

import pytest
import torch
from native_cases import COLS, DTYPES, public_module

from wc_kernels import reference

native = pytest.importorskip(
    "wc_kernels._native",
    reason="the native extension is not built (pip install --no-build-isolation -e .)",
)
pytestmark = pytest.mark.usefixtures("poison_outputs", "one_thread_per_test")

SPACES = ("velocity", "x0")
# Optimality r per row: the extremes and values between; sigma 0 and 1e-6 exercise the
# x0 weight floor (w = max(mean|e|, 1e-5)).
BATCHES = {
    "r0": ([0.0], [0.7]),
    "r1": ([1.0], [0.4]),
    "r_mid": ([0.3], [1.0]),
    "rows5": ([0.0, 1.0, 0.25, 0.5, 0.9], [0.0, 1e-6, 0.5, 1.0, 0.2]),
}
# Relative tolerance of a gradient element, by output dtype (a few units of the last place).
GRAD_RTOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2,
             torch.float64: 1e-12}



def make_nft_inputs(batch: str, cols: int, dtype: torch.dtype, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    r, sigma = BATCHES[batch]
    rows = len(r)
    make = lambda: torch.randn(rows, cols, generator=gen).to(dtype)
    return {"v_theta": make(), "v_old": make(), "v_target": make(),
            "r": torch.tensor(r), "sigma": torch.tensor(sigma)}


def call_native(inputs: dict, beta: float, space: str):
    return native.nft_loss_fwd(inputs["v_theta"], inputs["v_old"], inputs["v_target"],
                               inputs["r"], inputs["sigma"], beta, space == "x0")


def reference_loss_and_weighted_grad(inputs: dict, beta: float, space: str, weights):
    """Reference per-sample loss, and the autograd gradient of sum_i weights_i * L_i."""
    v_theta = inputs["v_theta"].clone().requires_grad_()
    loss = reference.nft_loss(v_theta, inputs["v_old"], inputs["v_target"], inputs["r"],
                              beta=beta, sigma=inputs["sigma"], space=space)
    (grad,) = torch.autograd.grad((loss * weights.to(loss.dtype)).sum(), v_theta)
    return loss.detach(), grad


def assert_grad_close(grad, weights, expected) -> None:
    """``weights[:, None] * grad`` equals ``expected``, relative to the gradient's scale."""
    acc = reference.compute_dtype(grad.dtype)
    rtol = GRAD_RTOL[grad.dtype]
    actual = grad.to(acc) * weights.to(acc)[:, None]
    expected = expected.to(acc)
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale + 1e-30)


def assert_loss_close(loss, expected) -> None:
    rtol = 1e-12 if loss.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(loss, expected, rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("beta", (1.0, 0.5))
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nft_loss_matches_reference(dtype, cols, beta, space):
    for batch in BATCHES:
        inputs = make_nft_inputs(batch, cols, dtype)
        loss, grad = call_native(inputs, beta, space)
        assert loss.dtype == reference.compute_dtype(dtype) and loss.shape == inputs["r"].shape
        assert grad.dtype == dtype and grad.shape == inputs["v_theta"].shape
        weights = torch.rand(len(inputs["r"]), generator=torch.Generator().manual_seed(1)) + 0.5
        ref_loss, ref_grad = reference_loss_and_weighted_grad(inputs, beta, space, weights)
        assert_loss_close(loss, ref_loss)
        assert_grad_close(grad, weights, ref_grad)


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("cols", (3, 65537))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nft_loss_every_instruction_set(isa, dtype, cols, space):
    inputs = make_nft_inputs("rows5", cols, dtype, seed=2)
    loss, grad = call_native(inputs, 0.5, space)
    weights = torch.ones(len(inputs["r"]))
    ref_loss, ref_grad = reference_loss_and_weighted_grad(inputs, 0.5, space, weights)
    assert_loss_close(loss, ref_loss)
    assert_grad_close(grad, weights, ref_grad)


def test_nft_loss_ignores_sigma_in_velocity_space():
    inputs = make_nft_inputs("rows5", 100, torch.float32)
    with_sigma = call_native(inputs, 1.0, "velocity")
    without = native.nft_loss_fwd(inputs["v_theta"], inputs["v_old"], inputs["v_target"],
                                  inputs["r"], None, 1.0, False)
    for a, b in zip(with_sigma, without, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_nft_loss_long_row_is_accurate():
    """One row of 16M fp32 elements: loss within 1e-6 of the float64 value, both spaces."""
    cols = 1 << 24
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(1, cols, generator=gen) for _ in range(3)]
    r, sigma = torch.tensor([0.3]), torch.tensor([0.6])
    for space in SPACES:
        loss, _ = native.nft_loss_fwd(*inputs, r, sigma, 0.5, space == "x0")
        exact = reference.nft_loss(*(x.double() for x in inputs), r.double(), beta=0.5,
                                   sigma=sigma.double(), space=space)
        assert abs(float(loss) / float(exact) - 1.0) < 1e-6, space


@pytest.mark.parametrize("space", SPACES)
def test_nft_loss_is_deterministic_across_thread_counts(space):
    inputs = make_nft_inputs("rows5", 300_007, torch.float32, seed=4)
    serial = call_native(inputs, 1.0, space)  # one thread (fixture one_thread_per_test)
    torch.set_num_threads(2)
    parallel = call_native(inputs, 1.0, space)
    for a, b in zip(serial, parallel, strict=True):
        assert torch.equal(a, b)


def nft_bad_inputs():
    good = make_nft_inputs("rows5", 8, torch.float32)
    x = good["v_theta"]

    def case(message, **changes):
        return pytest.param({**good, **changes}, message, id=message.split(" ")[0])

    return [
        case("v_theta must be contiguous", v_theta=torch.randn(8, 5).t()),
        case("v_theta must be 2-D", v_theta=x.flatten()),
        case("v_theta must be float32, float16, bfloat16 or float64",
             v_theta=x.to(torch.int32)),
        case("v_old must have the shape of v_theta", v_old=torch.randn(5, 9)),
        case("v_target must have the dtype of v_theta", v_target=x.double()),
        case("rows must be non-empty", v_theta=x[:, :0], v_old=x[:, :0], v_target=x[:, :0]),
        case("r must have shape", r=torch.rand(4)),
        case("r must be float32 or float64", r=torch.ones(5, dtype=torch.int64)),
        case("sigma must be contiguous", sigma=torch.rand(10)[::2]),
    ]


@pytest.mark.parametrize(("inputs", "message"), nft_bad_inputs())
def test_nft_loss_rejects_bad_inputs(inputs, message):
    with pytest.raises(RuntimeError, match=message):
        call_native(inputs, 1.0, "x0")


def test_nft_loss_x0_requires_sigma():
    inputs = make_nft_inputs("rows5", 8, torch.float32)
    with pytest.raises(RuntimeError, match="sigma .* is required for the x0 space"):
        native.nft_loss_fwd(inputs["v_theta"], inputs["v_old"], inputs["v_target"],
                            inputs["r"], None, 1.0, True)


def test_nft_loss_rejects_non_finite_beta():
    inputs = make_nft_inputs("rows5", 8, torch.float32)
    with pytest.raises(RuntimeError, match="beta must be finite"):
        call_native(inputs, float("nan"), "velocity")


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_public_nft_loss_native_backend(dtype, space):
    op = public_module("nft_loss").nft_loss
    inputs = make_nft_inputs("rows5", 1000, dtype)
    inputs["v_theta"] = inputs["v_theta"].reshape(5, 10, 100)  # [B, ...] rows are flattened
    weights = torch.rand(5, generator=torch.Generator().manual_seed(6)) + 0.5
    v_theta = inputs["v_theta"].clone().requires_grad_()
    loss = op(v_theta, inputs["v_old"].reshape(5, 10, 100),
              inputs["v_target"].reshape(5, 10, 100), inputs["r"], sigma=inputs["sigma"],
              space=space, reduction="none", backend="native")
    (grad,) = torch.autograd.grad((loss * weights).sum(), v_theta)
    ref_loss, ref_grad = reference_loss_and_weighted_grad(inputs, 1.0, space, weights)
    assert_loss_close(loss.detach(), ref_loss)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=GRAD_RTOL[dtype],
                               atol=GRAD_RTOL[dtype] * float(ref_grad.float().abs().max()))
