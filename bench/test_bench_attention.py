"""GPU throughput of shared-prefix attention: B rows over one prefix KV plus their own keys.

Run::

    python -m pytest --benchmark-only bench/test_bench_attention.py \\
        --benchmark-group-by=group

Skipped without CUDA. Contenders, all computing ``prefix_attention(q, k, v, prefix_k,
prefix_v)`` in bf16:

- ``reference``: plain PyTorch with the prefix replicated per row (the spec);
- ``sdpa_replicated``: ``cat(prefix.expand(B), k)`` then ``F.scaled_dot_product_attention``
  (the backend SDPA picks; what naive batching does), and ``replicated_flash``,
  ``replicated_cudnn``, ``replicated_efficient``: the same with SDPA pinned to one backend
  (``torch.nn.attention.sdpa_kernel``), so the fastest is known by name;
- ``flex``: FlexAttention over one prefix copy with a block mask (``backend="flex"``);
- ``triton``: the fused Triton kernels (``backend="triton"``);
- ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``: the split path on SDPA's own kernels
  (one prefix copy, partials merged by log-sum-exp);
- ``flash_attn`` / ``xformers``: the optional libraries' partial attentions merged by LSE;
- ``prefix_grouper``: the ``prefix-grouper`` library's attention (PrefixGrouper, the GRPO
  shared-prefix utility verl merged), a peer contender: its suffix attention over the prefix
  copied per row (``backend="prefix_grouper"``). The optional libraries are skipped, naming
  the missing package, when not installed.

Modes: ``fwd`` (no grad) and ``fwd+bwd`` (gradients for all five inputs). One timed round is
``REPEAT`` calls and a ``torch.cuda.synchronize()``. ``extra_info``: time per call, TFLOP/s
counting the attention matmuls once (forward ``4 B H L (P + Lk) D``; backward 2.5 times that,
without the recomputation of the scores) and the peak CUDA memory of one call.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import wc_kernels
from wc_kernels import _backend, reference

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="GPU benchmarks need a CUDA device")

REPEAT = 5
ROUNDS = 10
SHAPES = {  # name: (B, H, L, Lk, P, D); L = Lk = one clip's tokens, P = the history's
    "G16-D32": (16, 6, 256, 256, 1856, 32),
    "G16-D64": (16, 8, 256, 256, 1856, 64),
    "G16-D128": (16, 8, 256, 256, 1856, 128),
}
PINNED = {"replicated_flash": SDPBackend.FLASH_ATTENTION,
          "replicated_cudnn": SDPBackend.CUDNN_ATTENTION,
          "replicated_efficient": SDPBackend.EFFICIENT_ATTENTION}
CONTENDERS = ("triton", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_replicated",
              *PINNED, "prefix_grouper", "reference", "flex", "flash_attn", "xformers")
# ours first and the compiled FlexAttention late: a step cut short by time keeps the former
MODES = ("fwd", "fwd+bwd")
DTYPE = torch.bfloat16


def _sdpa_replicated(q, k, v, prefix_k, prefix_v):
    b = q.shape[0]
    keys = torch.cat([prefix_k.expand(b, -1, -1, -1), k], dim=2)
    values = torch.cat([prefix_v.expand(b, -1, -1, -1), v], dim=2)
    return F.scaled_dot_product_attention(q, keys, values)


def _pinned(backend: SDPBackend):
    def attention(*ins):
        with sdpa_kernel(backend):
            return _sdpa_replicated(*ins)

    return attention


def _attention(contender: str):
    if contender == "reference":
        return reference.prefix_attention
    if contender == "sdpa_replicated":
        return _sdpa_replicated
    if contender in PINNED:
        return _pinned(PINNED[contender])
    return lambda *ins: wc_kernels.prefix_attention(*ins, backend=contender)


@pytest.fixture(scope="module", params=list(SHAPES))
def inputs(request):
    b, h, lq, lk, p, d = SHAPES[request.param]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(DTYPE)

    tensors = (make(b, h, lq, d), make(b, h, lk, d), make(b, h, lk, d), make(1, h, p, d),
               make(1, h, p, d))
    return request.param, tensors


def _call(attention, tensors, mode: str):
    """A no-argument callable running one forward (and backward) on fresh leaves."""
    if mode == "fwd":
        def forward():
            with torch.no_grad():
                return attention(*tensors)

        return forward
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    grad_out = torch.randn_like(tensors[0])

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        out = attention(*leaves)
        out.backward(grad_out)
        return out

    return forward_backward


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("mode", MODES)
def test_prefix_attention(benchmark, inputs, mode, contender):
    if contender in _backend.LIBRARIES:
        missing = _backend.unavailable_reason(contender, torch.device("cuda"))
        if missing:
            pytest.skip(missing)
    name, tensors = inputs
    b, h, lq, lk, p, d = SHAPES[name]
    benchmark.group = f"prefix_attention {mode} bf16 {name} B={b} H={h} L={lq} P={p} D={d}"
    fn = _call(_attention(contender), tensors, mode)
    out = fn()  # warm-up (compiles) and a check against the reference
    want = reference.prefix_attention(*tensors)
    torch.testing.assert_close(out.detach(), want, rtol=3e-2, atol=3e-2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base

    def one_round():
        for _ in range(REPEAT):
            fn()
        torch.cuda.synchronize()

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    per_call = benchmark.stats.stats.median / REPEAT
    flops = 4 * b * h * lq * (p + lk) * d * (3.5 if mode == "fwd+bwd" else 1.0)
    benchmark.extra_info.update(
        calls_per_round=REPEAT,
        us_per_call=round(per_call * 1e6, 1),
        tflop_per_s=round(flops / per_call / 1e12, 1),
        peak_mib=round(peak / 2**20, 1),
    )
