"""``prefix_attention(backend="triton")`` against the reference: forward and all five gradients.

On CPU the kernels run under ``TRITON_INTERPRET=1`` (set by conftest), so sizes are small and
odd: tails in every tiled dimension (the interpreter tiles are 16..64 queries by 16..128 keys),
more than one query tile and key tile, head dims padded to a power of two, ``P = 0`` and
``L_k = 0``. Output buffers are NaN-poisoned before the kernels run, so an element a kernel
forgets to write fails the comparison. bf16 and the larger sizes run on a GPU only.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import wc_kernels
from wc_kernels import reference
from wc_kernels.ops.prefix_attention import IMPLEMENTED, _candidates
from wc_kernels.ops.prefix_attention import triton as tri

ROOT = Path(__file__).resolve().parents[2]
GPU = pytest.mark.gpu
pytestmark = pytest.mark.usefixtures("poison_outputs")
CASES = [  # (B, H, P, L, Lk, D)
    (1, 1, 1, 1, 1, 1),
    (3, 2, 0, 5, 5, 8),  # no prefix
    (2, 3, 7, 3, 0, 17),  # no own keys
    (4, 2, 37, 9, 11, 17),
    (1, 2, 130, 16, 16, 32),  # two prefix key tiles
    (5, 1, 3, 70, 11, 8),  # two query tiles
    (2, 1, 5, 3, 140, 32),  # two own-key tiles
]
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}
NAMES = ("q", "k", "v", "prefix_k", "prefix_v")


def _inputs(case, dtype, device="cpu", seed=0):
    b, h, p, lq, lk, d = case
    g = torch.Generator().manual_seed(seed + sum(case))

    def make(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    tensors = (make(b, h, lq, d), make(b, h, lk, d), make(b, h, lk, d), make(1, h, p, d),
               make(1, h, p, d))
    return [t.requires_grad_(True) for t in tensors]


def _check_against_reference(ins, dtype, scale=None, grad_scale=4.0):
    out = wc_kernels.prefix_attention(*ins, scale=scale, backend="triton")
    want = reference.prefix_attention(*ins, scale=scale)
    rtol, atol = TOL[dtype]
    assert out.dtype == dtype and out.shape == want.shape
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, ins, grad_out)
    want_grads = torch.autograd.grad(want, ins, grad_out)
    for name, got, exp in zip(NAMES, grads, want_grads, strict=True):
        assert got.shape == exp.shape and got.dtype == exp.dtype, name
        torch.testing.assert_close(got, exp, rtol=rtol * grad_scale, atol=atol * grad_scale,
                                   msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, dtype):
    _check_against_reference(_inputs(case, dtype), dtype)


def test_custom_scale():
    _check_against_reference(_inputs((2, 2, 5, 3, 4, 8), torch.float32), torch.float32,
                             scale=0.7)


def test_strided_inputs():
    """q, k, v as slices of one ``[B, L, 3, H, D]`` projection (no copy), the prefix a view
    with a head stride that is not ``P * D``."""
    b, h, lq, d, p = 3, 2, 6, 16, 9
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(b, lq, 3, h, d, generator=g).permute(2, 0, 3, 1, 4)
    q, k, v = (t.requires_grad_(True) for t in qkv.unbind(0))
    cache = torch.randn(2, 1, h, p + 4, d, generator=g)[..., 2:2 + p, :]
    pk, pv = cache[0].requires_grad_(True), cache[1].requires_grad_(True)
    assert not q.is_contiguous() and not pk.is_contiguous()
    _check_against_reference([q, k, v, pk, pv], torch.float32)


@pytest.mark.parametrize("case", [(2, 2, 0, 3, 5, 8), (2, 2, 6, 3, 0, 8), (2, 2, 6, 3, 5, 8)],
                         ids=["no-prefix", "no-own-keys", "both"])
def test_lse_is_the_natural_log_sum_exp(case):
    """The forward's second output: ``log sum exp(scale q k^T)`` over prefix and own keys."""
    q, k, v, pk, pv = (t.detach() for t in _inputs(case, torch.float32))
    scale = 0.3
    out, lse = tri.prefix_attention_fwd(q, k, v, pk, pv, scale)
    keys = torch.cat([pk.expand(q.shape[0], -1, -1, -1), k], dim=2)
    scores = torch.einsum("bhld,bhmd->bhlm", q, keys) * scale
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, scores.logsumexp(dim=-1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, reference.prefix_attention(q, k, v, pk, pv, scale=scale))


@pytest.mark.parametrize("case", [(2, 1, 4, 0, 3, 8), (0, 1, 4, 2, 3, 8)], ids=["L=0", "B=0"])
def test_no_queries_give_zero_key_gradients(case):
    """No query sees any key, so dk, dv, dprefix_k, dprefix_v are zeros (written by the
    kernels, so poisoning would show a miss)."""
    ins = _inputs(case, torch.float32)
    out = wc_kernels.prefix_attention(*ins, backend="triton")
    assert out.shape == ins[0].shape
    grads = torch.autograd.grad(out, ins, torch.ones_like(out))
    for name, grad in zip(NAMES, grads, strict=True):
        assert not grad.any(), name


def test_lse_output_gets_no_gradient_and_out_is_contiguous():
    from wc_kernels.ops.prefix_attention.library import OPS, PREFIX_ATTENTION

    ins = _inputs((2, 2, 3, 4, 5, 8), torch.float32)
    out, lse = OPS[PREFIX_ATTENTION](*ins, 0.5)
    assert out.is_contiguous() and not lse.requires_grad and out.requires_grad


def test_registered_op_passes_opcheck():
    """Schema, fake kernel and autograd registration of the torch.library op."""
    from wc_kernels.ops.prefix_attention.library import OPS, PREFIX_ATTENTION

    ins = _inputs((2, 2, 3, 4, 5, 8), torch.float32)
    torch.library.opcheck(OPS[PREFIX_ATTENTION], (*ins, 0.5),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


def test_compile_fullgraph_matches_eager():
    """Under torch.compile (aot_eager; the op is opaque under the interpreter): same output and
    gradients as the reference."""
    ins = _inputs((2, 2, 4, 5, 3, 8), torch.float32)
    compiled = torch.compile(lambda *a: wc_kernels.prefix_attention(*a, backend="triton"),
                             fullgraph=True, backend="aot_eager")
    out = compiled(*ins)
    want = reference.prefix_attention(*ins)
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)
    grad_out = torch.randn_like(out)
    for name, got, exp in zip(NAMES, torch.autograd.grad(out, ins, grad_out),
                              torch.autograd.grad(want, ins, grad_out), strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-4, msg=name)


def test_rejects_float64_and_large_head_dims():
    ins = [t.detach() for t in _inputs((1, 1, 2, 2, 2, 8), torch.float64)]
    with pytest.raises(TypeError, match="float16, bfloat16, float32"):
        wc_kernels.prefix_attention(*ins, backend="triton")
    wide = [t.detach() for t in _inputs((1, 1, 2, 2, 2, 160), torch.float32)]
    with pytest.raises(TypeError, match="D <= 128"):
        wc_kernels.prefix_attention(*wide, backend="triton")
    with pytest.raises(TypeError, match="float16, bfloat16 and float32"):
        tri.prefix_attention_fwd(*ins, 1.0)


def test_auto_passes_over_triton_for_float64_and_large_head_dims():
    assert "triton" in _candidates(torch.empty(1, 1, 1, 8), "auto")
    assert "triton" not in _candidates(torch.empty(1, 1, 1, 8, dtype=torch.float64), "auto")
    assert "triton" not in _candidates(torch.empty(1, 1, 1, 160), "auto")
    assert "triton" in IMPLEMENTED


def test_aot_covers_every_kernel_dtype_and_head_block():
    seen = {(c.kernel.__name__, c.dtype, c.constexprs["BLOCK_D"]) for c in tri.aot_configs()}
    kernel_names = ("prefix_attn_fwd_kernel", "prefix_attn_bwd_dq_kernel",
                    "prefix_attn_bwd_dkdv_kernel")
    assert seen == {(k, dt, bd) for k in kernel_names for dt in ("fp16", "bf16", "fp32")
                    for bd in tri.GPU_HEAD_BLOCKS}


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tri._operand(x, tl.float32, "tf32"), mask=offs < n)


def test_tf32_operands_are_rounded_to_nearest_even():
    """Bit for bit: random values of every scale and sign, and exact ties (a 1 in the 13th
    dropped bit alone) both ways, which round to the even neighbour."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g) * torch.logspace(-20, 20, 1000)
    ties = torch.tensor([0x3F801000, 0x3F803000, -0x407FF000, 0x3F800FFF, 0x3F801001],
                        dtype=torch.int32).view(torch.float32)
    x = torch.cat([x, ties, torch.zeros(1)])
    y = torch.full_like(x, float("nan"))
    _round_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    want = tf32(x)
    assert torch.equal(y.view(torch.int32), want.view(torch.int32))
    assert torch.equal(want[-6:-1].view(torch.int32), torch.tensor(
        [0x3F800000, 0x3F804000, -0x40800000, 0x3F800000, 0x3F802000], dtype=torch.int32))
    assert ((x - want).abs() <= x.abs() * 2.0**-11).all()


@pytest.mark.parametrize("case", [(2, 2, 37, 9, 11, 17), (1, 1, 1, 1, 1, 1),
                                  (2, 1, 5, 3, 140, 32)], ids=str)
def test_tf32_path_error_is_that_of_tf32_matmuls(case, monkeypatch):
    """The GPU's fp32 path (TF32 operands) run under the interpreter, whose ``tl.dot`` is exact
    on the rounded operands: output and gradients within twice the error of TF32 matmuls."""
    monkeypatch.setattr(tri, "_dot_type", lambda dtype, device: (tl.float32, "tf32"))
    _check_against_float64(_inputs(case, torch.float32), tf32_operands=True)


# GPU ---------------------------------------------------------------------------------------

GPU_CASES = [  # (B, H, P, L, Lk, D): real tiles with tails, padded head dims
    (4, 3, 300, 200, 190, 32),
    (3, 2, 129, 257, 0, 64),
    (2, 2, 0, 130, 77, 128),
    (16, 2, 1856, 256, 256, 80),
    (1, 1, 1, 1, 1, 1),
]


def tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32) rounded to TF32 (10 mantissa bits), to nearest with ties to even."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + ((bits >> 13) & 1) + 0xFFF) & -0x2000).view(torch.float32)


class _Tf32Matmul(torch.autograd.Function):
    """``a @ b`` on TF32 operands with fp32 accumulation, the gradients' matmuls too: what a
    TF32 tensor-core matmul computes, on any device and whatever torch's TF32 flags say."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return tf32(a) @ tf32(b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = tf32(grad)
        return grad @ tf32(b).transpose(-1, -2), tf32(a).transpose(-1, -2) @ grad


def _same_precision_attention(q, k, v, prefix_k, prefix_v, tf32_operands=False):
    """The attention with every matmul in the inputs' dtype (on TF32 operands for fp32 when
    ``tf32_operands``, as the kernels' ``tl.dot`` on a GPU) and the softmax in fp32: what plain
    PyTorch at the kernels' precision gives, the yardstick of flash-attention's tests
    (``attention_ref(upcast=False)``)."""
    b, scale = q.shape[0], q.shape[-1] ** -0.5
    keys = torch.cat([prefix_k.expand(b, -1, -1, -1), k], dim=2)
    values = torch.cat([prefix_v.expand(b, -1, -1, -1), v], dim=2)
    matmul = _Tf32Matmul.apply if tf32_operands else torch.matmul
    scores = matmul(q, keys.transpose(-1, -2)) * scale
    weights = scores.float().softmax(dim=-1).to(q.dtype)
    return matmul(weights, values)


def _check_against_float64(ins, factor=2.0, tf32_operands=False, grad_seed=0):
    """Output and each gradient: the kernels' root-mean-square error against the float64
    reference is at most ``factor`` times that of plain PyTorch at the same precision, plus a
    floor of 1e-5 of the float64 value's scale (an exact baseline cannot set a bound of 0). The
    RMS, not the largest element, because the ratio of two maxima over a few hundred elements
    swings past 2 with the upstream gradient alone (measured: up to 2.75 for ``dprefix_k`` at
    ``P = 5``), while the RMS ratio stays under 1.8 for correct kernels and reaches 3-4 for the
    TF32 truncation this test exists to catch. An empty key set (``P = 0`` or ``L_k = 0``) has
    empty gradients: they must match in shape."""
    gold_ins = [t.detach().double().requires_grad_(True) for t in ins]
    base_ins = [t.detach().clone().requires_grad_(True) for t in ins]
    out = wc_kernels.prefix_attention(*ins, backend="triton")
    gold = reference.prefix_attention(*gold_ins)
    base = _same_precision_attention(*base_ins, tf32_operands=tf32_operands)
    assert out.dtype == ins[0].dtype and out.shape == gold.shape
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed))
    grad_out = grad_out.to(out)
    got = [out, *torch.autograd.grad(out, ins, grad_out)]
    want = [gold, *torch.autograd.grad(gold, gold_ins, grad_out.double())]
    yardstick = [base, *torch.autograd.grad(base, base_ins, grad_out)]
    for name, g, w, y in zip(("out", *NAMES), got, want, yardstick, strict=True):
        assert g.shape == w.shape and g.dtype == ins[0].dtype, name
        if not w.numel():
            continue
        error = _rms(g.double() - w)
        bound = factor * _rms(y.double() - w) + 1e-5 * _rms(w)
        assert error <= bound, f"{name}: RMS error {error:.3g} > bound {bound:.3g}"


def _rms(x: torch.Tensor) -> float:
    return x.square().mean().sqrt().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", [(3, 2, 9, 17, 0, 16), (2, 2, 0, 13, 7, 32),
                                  (4, 2, 37, 9, 11, 17)],
                         ids=["no-own-keys", "no-prefix", "both"])
def test_error_against_float64_is_that_of_pytorch_at_the_same_precision(case, dtype):
    """The GPU comparison on CPU (interpreter), empty key sets included."""
    _check_against_float64(_inputs(case, dtype))


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_cuda_matches_reference(case, dtype):
    """fp32 runs its matmuls on TF32 operands on the GPU, and so does the yardstick there."""
    _check_against_float64(_inputs(case, dtype, device="cuda"),
                           tf32_operands=dtype == torch.float32)


@GPU
def test_cuda_auto_uses_triton_and_compiles():
    from wc_kernels._backend import resolve

    assert resolve("prefix_attention", "auto", torch.device("cuda"), IMPLEMENTED) == "triton"
    ins = _inputs((4, 2, 100, 64, 64, 64), torch.bfloat16, device="cuda")
    compiled = torch.compile(lambda *a: wc_kernels.prefix_attention(*a, backend="triton"),
                             fullgraph=True)
    out = compiled(*ins)
    eager = wc_kernels.prefix_attention(*ins, backend="triton")
    torch.testing.assert_close(out, reference.prefix_attention(*ins), rtol=3e-2, atol=3e-2)
    # the compiled graph runs the same kernels: the eager op's output and gradients
    torch.testing.assert_close(out, eager)
    grad_out = torch.randn_like(out)
    compiled_grads = torch.autograd.grad(out, ins, grad_out)
    for name, got, want in zip(NAMES, compiled_grads, torch.autograd.grad(eager, ins, grad_out),
                               strict=True):
        torch.testing.assert_close(got, want, msg=name)


_TRACE_SCRIPT = """
import torch
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from wc_kernels.ops.prefix_attention.library import OPS, PREFIX_ATTENTION, PREFIX_ATTENTION_BWD

def kernels_in(op, args):
    gm = make_fx(dispatch_functionalize(op), tracing_mode="fake")(*args)
    return gm.code.count("triton_kernel_wrapper_functional(")

q, k, v = (torch.randn(2, 3, 5, 16) for _ in range(3))
pk, pv = torch.randn(1, 3, 7, 16), torch.randn(1, 3, 7, 16)
fwd = OPS[PREFIX_ATTENTION]
bwd = OPS[PREFIX_ATTENTION_BWD]
out, lse = torch.randn_like(q), torch.randn(2, 3, 5)
print("fwd", kernels_in(lambda *a: fwd(*a, 0.25), (q, k, v, pk, pv)))
print("bwd", kernels_in(lambda *a: bwd(*a, 0.25), (torch.randn_like(q), q, k, v, pk, pv, out, lse)))
"""


def test_triton_op_traces_without_interpreter():
    """Without TRITON_INTERPRET the ops are triton_ops whose kernels functionalization exposes
    (what Inductor compiles on a GPU): one forward kernel; dq, then dk/dv of each key set."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_TRACE_SCRIPT)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert dict(line.split() for line in proc.stdout.splitlines()) == {"fwd": "1", "bwd": "3"}
