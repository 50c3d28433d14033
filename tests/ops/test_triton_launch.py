"""``wc_kernels._triton.launchable``: the raw kernel in plain eager execution (no
higher-order-op dispatch per launch), ``wrap_triton``'s traceable wrapper whenever anything may
be tracing, so that compiled and traced graphs still hold the launches (the ops' tracing tests,
e.g. ``test_prefix_attention_triton.py::test_triton_op_traces_without_interpreter``, check the
graphs)."""

import pytest
import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensorMode

from wc_kernels._triton import launchable, may_trace


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_plain_eager_launches_the_kernel_itself():
    x = torch.randn(37)
    y = torch.full_like(x, float("nan"))
    assert not may_trace(x, y, None)
    launcher = launchable(_copy_kernel, x, y)
    assert launcher is _copy_kernel
    launcher[(triton.cdiv(37, 16),)](x, y, 37, BLOCK=16)
    assert torch.equal(x, y)


def test_a_dispatch_mode_or_a_tensor_subclass_may_trace():
    x = torch.randn(4)
    with FakeTensorMode() as mode:
        assert may_trace(x)
        fake = mode.from_tensor(x)
    assert not may_trace(x) and may_trace(x, fake)


def test_compiling_may_trace(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert may_trace(torch.randn(4))


@pytest.mark.parametrize("op", ["flow_noise", "nft_loss", "grpo_sde_loss"])
def test_compiled_ops_still_match_eager(op):
    """Each fused op under ``torch.compile`` (aot_eager: the traced launches) equals its eager
    call, which launched the raw kernels."""
    import wc_kernels

    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 40, generator=g), torch.randn(6, 40, generator=g)
    sig = torch.rand(2, 3, generator=g)
    calls = {
        "flow_noise": lambda: wc_kernels.flow_noise(x0, sig, noise=noise, backend="triton"),
        "nft_loss": lambda: wc_kernels.nft_loss(
            x0, noise[:2], noise[2:4], torch.tensor([0.3, 0.8]), beta=1.0, backend="triton"),
        "grpo_sde_loss": lambda: wc_kernels.grpo_sde_loss(
            x0, noise[:2], noise[2:4], torch.tensor([0.9, 0.5]), torch.tensor([0.8, 0.4]),
            torch.zeros(2), torch.tensor([1.0, -1.0]), noise_level=0.7, clip_range=0.2,
            adv_clip_max=5.0, backend="triton"),
    }
    eager = calls[op]()
    compiled = torch.compile(calls[op], backend="aot_eager", fullgraph=True)()
    torch.testing.assert_close(compiled, eager)
