"""The optional library backends of ``prefix_attention``: ``flash_attn``, ``xformers`` and
``prefix_grouper``.

On CPU each CUDA library is replaced by a small stand-in with its API, layout and LSE
contract, computed in plain PyTorch: that checks everything this project adds (row folding,
layout transposes, the LSE merge, feeding the merged output and LSE to the backward, keyword
matching across flash-attn versions). ``prefix-grouper`` is plain PyTorch, so the real library
runs on CPU when installed. On a CUDA machine with a library installed, the real kernels are
checked against the reference.
"""

import sys
import types

import pytest
import torch
from test_prefix_attention import CASES, TOL, _inputs

import wc_kernels
from wc_kernels import _backend, reference
from wc_kernels.ops.prefix_attention import _FAST, flash_attn, prefix_grouper
from wc_kernels.ops.prefix_attention.flash_attn import FlashAttnKernels
from wc_kernels.ops.prefix_attention.split import split_prefix_attention

NAMES = ("q", "k", "v", "prefix_k", "prefix_v")


def _check(fn, ins, rtol=2e-5, atol=2e-5):
    out = fn(*ins)
    want = reference.prefix_attention(*ins)
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol)
    grad_out = torch.randn_like(out)
    # an empty prefix or empty own keys may go unused: their (empty) gradient is then zeros
    got_grads = torch.autograd.grad(out, ins, grad_out, materialize_grads=True)
    for name, got, exp in zip(NAMES, got_grads, torch.autograd.grad(want, ins, grad_out),
                              strict=True):
        torch.testing.assert_close(got, exp, rtol=rtol, atol=atol, msg=name)


# -- stand-ins ------------------------------------------------------------------------------

def _scores(q, k, scale):
    """``[B, L, H, D]`` x ``[B, M, H, D]`` -> scaled scores ``[B, H, L, M]`` in fp32."""
    return torch.einsum("blhd,bmhd->bhlm", q.float(), k.float()) * scale


class _FlashInterface:
    """flash-attn 2.7's ``flash_attn_interface`` API in plain PyTorch, inputs ``[B, L, H, D]``.

    Like the real backward, it rebuilds the probabilities from the ``out`` and
    ``softmax_lse`` it is given instead of recomputing them.
    """

    @staticmethod
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        return_attn_probs=False):
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        assert return_attn_probs and dropout_p == 0.0 and not causal
        s = _scores(q, k, softmax_scale)
        lse = s.logsumexp(-1)
        out = torch.einsum("bhlm,bmhd->blhd", (s - lse[..., None]).exp(), v.float())
        return out.to(q.dtype), lse, None

    @staticmethod
    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                             softmax_scale, causal, window_size_left, window_size_right,
                             softcap, alibi_slopes, deterministic, rng_state=None):
        assert (dropout_p, causal, window_size_left, window_size_right, softcap) == (
            0.0, False, -1, -1, 0.0)
        assert softmax_lse.dtype == torch.float32 and softmax_lse.is_contiguous()
        p = (_scores(q, k, softmax_scale) - softmax_lse[..., None]).exp()
        do = dout.float()
        dv.copy_(torch.einsum("bhlm,blhd->bmhd", p, do))
        dp = torch.einsum("blhd,bmhd->bhlm", do, v.float())
        delta = (do * out.float()).sum(-1).transpose(1, 2)[..., None]
        ds = p * (dp - delta) * softmax_scale
        dq.copy_(torch.einsum("bhlm,bmhd->blhd", ds, k.float()))
        dk.copy_(torch.einsum("bhlm,blhd->bmhd", ds, q.float()))


class _FlashInterface26(_FlashInterface):
    """flash-attn 2.5's backward keywords: one ``window_size`` tuple and no ``softcap``."""

    @staticmethod
    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                             softmax_scale, causal, window_size, alibi_slopes, deterministic,
                             rng_state=None):
        assert window_size == (-1, -1)
        _FlashInterface._flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv,
                                             dropout_p, softmax_scale, causal, -1, -1, 0.0,
                                             alibi_slopes, deterministic)


class _Partial:
    """xformers' ``merge_training.Partial``: output ``[B, M, H, K]`` and LSE ``[B, H, M]``."""

    def __init__(self, attn, lse):
        self.attn, self.lse = attn, lse

    def apply(self, fn):
        lse = fn(self.lse.permute(0, 2, 1).unsqueeze(-1)).squeeze(-1).permute(0, 2, 1)
        return _Partial(fn(self.attn), lse)


def _xformers_modules():
    """Module objects standing in for ``xformers.ops.fmha.merge_training`` (autograd by
    plain PyTorch: exact gradients of the merged attention)."""

    def partial(query, key, value, attn_bias=None, p=0.0, scale=None):
        assert attn_bias is None and p == 0.0
        s = _scores(query, key, scale)
        lse = s.logsumexp(-1)
        attn = torch.einsum("bhlm,bmhd->blhd", (s - lse[..., None]).exp(), value.float())
        return _Partial(attn, lse)

    def merge(*partials):
        lse = torch.logsumexp(torch.stack([p.lse for p in partials]), dim=0)
        return sum(p.attn * (p.lse - lse).exp().transpose(1, 2)[..., None] for p in partials)

    merge_training = types.ModuleType("xformers.ops.fmha.merge_training")
    merge_training.memory_efficient_attention_partial_autograd = partial
    merge_training.merge_attentions_autograd = merge
    names = ("xformers", "xformers.ops", "xformers.ops.fmha")
    return {**{n: types.ModuleType(n) for n in names}, merge_training.__name__: merge_training}


# -- CPU: the glue against the reference ----------------------------------------------------

@pytest.mark.parametrize("interface", [_FlashInterface, _FlashInterface26])
@pytest.mark.parametrize("case", CASES)
def test_flash_attn_split_matches_reference(case, interface):
    kernels_ = FlashAttnKernels(interface)
    _check(lambda *a: split_prefix_attention(*a, a[0].shape[-1] ** -0.5, kernels_),
           _inputs(case, torch.float32))


def test_flash_attn_backend_loads_the_installed_library(monkeypatch):
    package = types.ModuleType("flash_attn")
    package.flash_attn_interface = _FlashInterface
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    flash_attn.flash_attn_kernels.cache_clear()
    try:
        ins = _inputs(CASES[3], torch.float32)
        out = _FAST["flash_attn"](*ins, 0.3)
        torch.testing.assert_close(out, reference.prefix_attention(*ins, scale=0.3),
                                   rtol=2e-5, atol=2e-5)
        assert flash_attn.flash_attn_kernels().interface is _FlashInterface
    finally:
        flash_attn.flash_attn_kernels.cache_clear()


@pytest.mark.parametrize("case", CASES)
def test_xformers_partials_match_reference(case, monkeypatch):
    for name, module in _xformers_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    _check(lambda *a: _FAST["xformers"](*a, a[0].shape[-1] ** -0.5),
           _inputs(case, torch.float32))


@pytest.mark.parametrize("backend", ["flash_attn", "xformers"])
def test_library_backends_need_cuda(backend):
    ins = [t.detach() for t in _inputs(CASES[0], torch.bfloat16)]
    with pytest.raises(RuntimeError, match=f"{backend} runs on CUDA tensors"):
        wc_kernels.prefix_attention(*ins, backend=backend)


def test_flash_attn_rejects_float32_and_wide_heads():
    with pytest.raises(TypeError, match="flash_attn.*float16, bfloat16"):
        wc_kernels.prefix_attention(*[t.detach() for t in _inputs(CASES[0], torch.float32)],
                                 backend="flash_attn")
    wide = [t.detach() for t in _inputs((1, 1, 2, 2, 2, 264), torch.bfloat16)]
    with pytest.raises(TypeError, match="D <= 256"):
        wc_kernels.prefix_attention(*wide, backend="flash_attn")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CASES)
def test_prefix_grouper_matches_reference_on_cpu(case, dtype):
    pytest.importorskip("prefix_grouper", reason="prefix-grouper is not installed "
                        "(pip install 'wc_fast[dev]')")
    rtol, atol = TOL[dtype]
    _check(lambda *a: wc_kernels.prefix_attention(*a, backend="prefix_grouper"),
           _inputs(case, dtype), rtol=rtol, atol=atol)
    # the key mask the library would pass is all true: leaving it out changes nothing
    b, _, p, _, lk, _ = case
    assert prefix_grouper._grouper(p, lk, b, torch.device("cpu")).suffix_attn_mask.all()


def test_prefix_grouper_missing_names_its_package(monkeypatch):
    monkeypatch.setattr(_backend, "_importable", lambda module: module != "prefix_grouper")
    ins = [t.detach() for t in _inputs(CASES[0], torch.float32)]
    with pytest.raises(RuntimeError, match=r"prefix-grouper is not installed"):
        wc_kernels.prefix_attention(*ins, backend="prefix_grouper")


def test_auto_never_picks_a_library_backend():
    for device in ("cpu", "cuda"):
        assert not set(_backend.AUTO_ORDER[device]) & set(_backend.LIBRARIES)


# -- CUDA: the real libraries ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flash_attn", "xformers", "prefix_grouper"])
@pytest.mark.parametrize("case", [(16, 6, 1792, 256, 256, 32), (3, 2, 37, 9, 9, 64),
                                  (2, 3, 0, 5, 5, 32), (2, 3, 7, 3, 0, 32)])
def test_cuda_library_matches_reference(backend, case):
    if _backend.unavailable_reason(backend, torch.device("cuda")) is not None:
        pytest.skip(_backend.unavailable_reason(backend, torch.device("cuda")))
    _check(lambda *a: wc_kernels.prefix_attention(*a, backend=backend),
           _inputs(case, torch.bfloat16, device="cuda"), rtol=2e-2, atol=2e-2)
