"""The native C++ ``flow_noise`` kernel (``wc_kernels._native``) against the plain-PyTorch
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


def make_flow_inputs(samples: int, sigmas: int, cols: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(5)
    x0 = torch.randn(samples, cols, generator=gen).to(dtype)
    sig = torch.rand(samples, sigmas, generator=gen)
    sig[0, 0] = 0.0
    sig[-1, -1] = 1.0
    noise = torch.randn(samples * sigmas, cols, generator=gen).to(dtype)
    return x0, sig, noise


@pytest.fixture(params=("plain", "streaming"))
def stores(request):
    """Both ways the kernel writes its outputs: plain stores (the default below 32 MiB of
    outputs) and streaming stores (threshold 0), which copy each block out with an unaligned
    head and tail around the aligned non-temporal stores."""
    default = native.set_stream_min_bytes(0 if request.param == "streaming" else 1 << 62)
    yield request.param
    native.set_stream_min_bytes(default)


@pytest.mark.parametrize("shape", ((1, 1), (3, 5)), ids=("S1K1", "S3K5"))
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flow_noise_matches_reference(isa, stores, dtype, cols, shape):
    x0, sig, noise = make_flow_inputs(*shape, cols, dtype)
    x_t, v_target = native.flow_noise(x0, sig, noise)
    ref_x_t, ref_v = reference.flow_noise(x0, sig, noise)
    for actual, expected in ((x_t, ref_x_t), (v_target, ref_v)):
        assert actual.dtype == dtype
        torch.testing.assert_close(actual, expected)


def test_stream_threshold_is_set_and_returned():
    default = native.set_stream_min_bytes(123)
    try:
        assert default == 32 << 20
        assert native.set_stream_min_bytes(0) == 123
        with pytest.raises(RuntimeError, match="bytes must be >= 0"):
            native.set_stream_min_bytes(-1)
    finally:
        native.set_stream_min_bytes(default)


def test_freed_large_outputs_are_reused_within_the_cache_limit():
    x0, sig, noise = make_flow_inputs(1, 2, 1 << 20, torch.float32)  # two 8 MiB outputs
    previous = native.set_output_cache_bytes(0)  # start empty
    try:
        assert previous == 1 << 30  # the default limit
        native.set_output_cache_bytes(1 << 30)
        x_t, v_target = native.flow_noise(x0, sig, noise)
        first = {x_t.data_ptr(), v_target.data_ptr()}
        del x_t, v_target
        assert native.cached_output_bytes() == 2 * (8 << 20)
        x_t, v_target = native.flow_noise(x0, sig, noise)  # the same blocks, already faulted in
        assert {x_t.data_ptr(), v_target.data_ptr()} == first
        assert native.cached_output_bytes() == 0
        torch.testing.assert_close(x_t, reference.flow_noise(x0, sig, noise)[0])
        native.set_output_cache_bytes(8 << 20)  # room for one block: the other is freed
        del x_t, v_target
        assert native.cached_output_bytes() == 8 << 20
        small = native.flow_noise(x0[:, :1000].contiguous(), sig,  # below 4 MiB: not cached
                                  noise[:, :1000].contiguous())
        del small
        assert native.cached_output_bytes() == 8 << 20
        assert native.set_output_cache_bytes(0) == 8 << 20
        assert native.cached_output_bytes() == 0
        with pytest.raises(RuntimeError, match="bytes must be >= 0"):
            native.set_output_cache_bytes(-1)
    finally:
        native.set_output_cache_bytes(previous)


def flow_bad_inputs():
    x0, sig, noise = make_flow_inputs(3, 5, 8, torch.float32)
    return [
        pytest.param((x0, sig[:2], noise), "sigmas must have shape", id="sigmas-rows"),
        pytest.param((x0, sig, noise[:-1]), "noise must have shape", id="noise-rows"),
        pytest.param((x0, sig, noise.half()), "noise must have the dtype of x0",
                     id="noise-dtype"),
        pytest.param((x0, sig, noise.t().contiguous().t()), "noise must be contiguous",
                     id="noise-strides"),
        pytest.param((x0, sig.to(torch.int32), noise), "sigmas must be float32 or float64",
                     id="sigmas-dtype"),
    ]


@pytest.mark.parametrize(("args", "message"), flow_bad_inputs())
def test_flow_noise_rejects_bad_inputs(args, message):
    with pytest.raises(RuntimeError, match=message):
        native.flow_noise(*args)


def test_public_flow_noise_native_backend():
    op = public_module("flow_noise").flow_noise
    x0, sig, noise = make_flow_inputs(3, 5, 1000, torch.float32)
    x_t, v_target = op(x0.reshape(3, 10, 100), sig, noise.reshape(15, 10, 100),
                       backend="native")
    ref_x_t, ref_v = reference.flow_noise(x0, sig, noise)
    torch.testing.assert_close(x_t.reshape(15, 1000), ref_x_t)
    torch.testing.assert_close(v_target.reshape(15, 1000), ref_v)
