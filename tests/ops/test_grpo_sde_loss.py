"""The fused GRPO SDE loss: Triton (interpreter on CPU) and the native kernel (when built)
against autograd of the float64 reference, torch.library registration (opcheck, gradcheck,
torch.compile) and the public functions' argument checks. Output buffers are NaN-poisoned so
an unwritten element shows."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from wc_kernels import _backend, _registry, grpo_sde_loss, reference, sde_log_prob
from wc_kernels.ops.grpo_sde_loss import library
from wc_kernels.ops.grpo_sde_loss.library import OPS, SDE_SUMS, SDE_SUMS_BWD

ROOT = Path(__file__).resolve().parents[2]
GPU = pytest.mark.gpu
pytestmark = pytest.mark.usefixtures("poison_outputs")
NATIVE = _backend.native_built()
FUSED = ["triton"] + (["native"] if NATIVE else [])
FORWARD_OPS = [n for n in (SDE_SUMS, SDE_SUMS + _registry.TRITON_TWIN) if n in OPS]
KW = {"noise_level": 0.7, "clip_range": 0.2, "adv_clip_max": 2.0, "sigma_max": 0.98}
STEP_KW = {"noise_level": 0.7, "sigma_max": 0.98}
SHAPES = [(1, 37), (5, 37), (1, 1000), (5, 1000), (2, 70001), (3, 4, 5, 7)]  # [B, ...]


def _inputs(shape, dtype=torch.float32, seed=0, with_ref=True):
    """A step whose ratios fall inside and outside the clip range, sigma == 1 in row 0."""
    g = torch.Generator().manual_seed(seed)
    b = shape[0]
    m, x, ref = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    sigma = torch.linspace(1.0, 0.1, b, dtype=torch.float64) if b > 1 else torch.ones(1).double()
    sigma_next = sigma - 0.02 - 0.08 * torch.rand(b, generator=g, dtype=torch.float64)
    std = reference.sde_std(sigma, 0.7, 0.98)
    view = (-1,) + (1,) * (len(shape) - 1)
    mean = reference.sde_step_mean(m, x, sigma, sigma_next, std)
    prev = mean + (std * (sigma - sigma_next).sqrt()).view(view) * torch.randn(
        shape, generator=g, dtype=torch.float64)
    lp = reference.sde_log_prob(m, x, prev, sigma, sigma_next, **STEP_KW)
    old = lp - 0.5 * torch.randn(b, generator=g, dtype=torch.float64)
    adv = 3.0 * torch.randn(b, generator=g, dtype=torch.float64)
    tensors = [t.to(dtype) for t in (m, x, prev)]
    return (*tensors, sigma.float(), sigma_next.float(), old.float(), adv.float(),
            ref.to(dtype) if with_ref else None)


def _reference_grad(m, x, prev, sigma, sigma_next, old, adv, ref, kl_beta):
    """Loss, stats and gradient in float64 through the reference (inputs rounded to their
    dtype first, as the kernels see them)."""
    leaf = m.double().requires_grad_()
    loss, lp, kl = reference.grpo_sde_loss(
        leaf, x.double(), prev.double(), sigma.double(), sigma_next.double(), old.double(),
        adv.double(), ref_output=None if ref is None else ref.double(), kl_beta=kl_beta, **KW)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), lp.detach(), kl.detach(), grad


def _tolerances(dtype):
    return (1e-4, 1e-5) if dtype == torch.float32 else (2e-2, 1e-3)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kl_beta", [0.0, 0.3])
@pytest.mark.parametrize("backend", FUSED)
def test_fused_matches_reference(shape, dtype, kl_beta, backend):
    m, x, prev, sigma, sigma_next, old, adv, ref = _inputs(shape, dtype, with_ref=kl_beta > 0)
    leaf = m.clone().requires_grad_()
    loss, lp, kl = grpo_sde_loss(leaf, x, prev, sigma, sigma_next, old, adv, ref_output=ref,
                                 kl_beta=kl_beta, return_stats=True, backend=backend, **KW)
    loss.backward()
    want_loss, want_lp, want_kl, want_grad = _reference_grad(m, x, prev, sigma, sigma_next,
                                                             old, adv, ref, kl_beta)
    rtol, atol = _tolerances(dtype)
    assert loss.dtype == lp.dtype == kl.dtype == torch.float32
    torch.testing.assert_close(lp.double(), want_lp, rtol=rtol, atol=atol)
    torch.testing.assert_close(kl.double(), want_kl, rtol=rtol, atol=atol)
    torch.testing.assert_close(loss.double(), want_loss, rtol=rtol, atol=atol)
    assert leaf.grad.dtype == dtype
    # one ulp of the stored dtype on top of the fp32 accumulation
    ulp = want_grad.abs() * (2**-7 if dtype == torch.bfloat16 else 2**-20)
    err = (leaf.grad.double() - want_grad).abs()
    assert bool((err <= ulp + 1e-4 * want_grad.abs().max() + 1e-9).all()), err.max()


@pytest.mark.parametrize("shape", [(1, 37), (5, 1000)], ids=str)
@pytest.mark.parametrize("backend", FUSED)
def test_sde_log_prob_matches_reference_with_gradient(shape, backend):
    m, x, prev, sigma, sigma_next, *_ = _inputs(shape)
    leaf = m.clone().requires_grad_()
    lp = sde_log_prob(leaf, x, prev, sigma, sigma_next, backend=backend, **STEP_KW)
    weights = torch.linspace(-1.0, 2.0, shape[0])
    (lp * weights).sum().backward()
    ref_leaf = m.double().requires_grad_()
    want = reference.sde_log_prob(ref_leaf, x.double(), prev.double(), sigma.double(),
                                  sigma_next.double(), **STEP_KW)
    (want * weights.double()).sum().backward()
    torch.testing.assert_close(lp.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaf.grad.double(), ref_leaf.grad, rtol=1e-4, atol=1e-6)


def test_stats_are_detached_and_kl_is_zero_without_ref():
    m, x, prev, sigma, sigma_next, old, adv, _ = _inputs((3, 16), with_ref=False)
    for backend in ("reference", *FUSED):
        loss, lp, kl = grpo_sde_loss(m.clone().requires_grad_(), x, prev, sigma, sigma_next,
                                     old, adv, return_stats=True, backend=backend, **KW)
        assert loss.requires_grad and not lp.requires_grad and not kl.requires_grad
        assert loss.shape == () and lp.shape == kl.shape == (3,)
        assert torch.equal(kl, torch.zeros(3))


def _sums_args(b=3, d=20, dtype=torch.float32, with_ref=True, device="cpu"):
    g = torch.Generator().manual_seed(1)
    m, x, p, r = (torch.randn(b, d, generator=g, dtype=dtype).to(device) for _ in range(4))
    coef = torch.randn(b, 2, generator=g, dtype=torch.float64 if dtype == torch.float64
                       else torch.float32).to(device)
    return m.requires_grad_(), x, p, r if with_ref else None, coef


def test_registration_table():
    cpu = torch.device("cpu")
    if NATIVE:
        assert _registry.op_for(SDE_SUMS, "native", cpu, OPS) is OPS[SDE_SUMS]
    assert _registry.op_for(SDE_SUMS, "triton", cpu, OPS) is \
        OPS[SDE_SUMS + _registry.TRITON_TWIN]
    assert torch.ops.wc_fast.sde_residual_sums.default._schema.arguments[3].type.str() == \
        "Tensor?"


@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("with_ref", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_opcheck(name, with_ref, dtype):
    torch.library.opcheck(OPS[name], _sums_args(dtype=dtype, with_ref=with_ref))
    m, x, p, r, coef = _sums_args(dtype=dtype, with_ref=with_ref)
    weights = torch.randn(3, 2, dtype=coef.dtype)
    backward = name.replace(SDE_SUMS, SDE_SUMS_BWD)
    torch.library.opcheck(OPS[backward], (weights, m.detach(), x, p, r, coef))


@pytest.mark.parametrize("name", FORWARD_OPS)
@pytest.mark.parametrize("with_ref", [True, False])
def test_gradcheck_float64(name, with_ref):
    op = OPS[name]
    m, x, p, r, coef = _sums_args(b=2, d=3, dtype=torch.float64, with_ref=with_ref)
    assert torch.autograd.gradcheck(lambda v: op(v, x, p, r, coef), (m,))


@pytest.mark.parametrize("backend", ["reference", *FUSED])
def test_compile_fullgraph_matches_eager(backend):
    m, x, prev, sigma, sigma_next, old, adv, ref = _inputs((4, 3, 11))

    def step(m, x, prev, sigma, sigma_next, old, adv, ref):
        loss = grpo_sde_loss(m, x, prev, sigma, sigma_next, old, adv, ref_output=ref,
                             kl_beta=0.2, backend=backend, **KW)
        lp = sde_log_prob(m, x, prev, sigma, sigma_next, backend=backend, **STEP_KW)
        return loss + 0.1 * lp.mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (step, compiled):
        leaf = m.clone().requires_grad_()
        loss = fn(leaf, x, prev, sigma, sigma_next, old, adv, ref)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


_TRACE_SCRIPT = """
import torch
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from wc_kernels._registry import TRITON_TWIN
from wc_kernels.ops.grpo_sde_loss.library import OPS, SDE_SUMS, SDE_SUMS_BWD

def kernels_in(op, args):
    gm = make_fx(dispatch_functionalize(op), tracing_mode="fake")(*args)
    return gm.code.count("triton_kernel_wrapper_functional(")

m, x, p, r = (torch.randn(3, 40) for _ in range(4))
coef = torch.randn(3, 2)
sums = OPS[SDE_SUMS + TRITON_TWIN]
bwd = OPS[SDE_SUMS_BWD + TRITON_TWIN]
print("sums", kernels_in(sums, (m, x, p, r, coef)))
print("sums_no_ref", kernels_in(lambda m, x, p, c: sums(m, x, p, None, c), (m, x, p, coef)))
print("bwd", kernels_in(bwd, (coef, m, x, p, r, coef)))
"""


def test_triton_op_traces_without_interpreter():
    """Without TRITON_INTERPRET the Triton twins are triton_ops whose kernel functionalization
    exposes (what Inductor compiles on a GPU); tracing needs no driver."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_TRACE_SCRIPT)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert dict(line.split() for line in proc.stdout.splitlines()) == {
        "sums": "1", "sums_no_ref": "1", "bwd": "1"}


@pytest.mark.skipif(not NATIVE, reason="the native extension is not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("cols", [1, 37, 513, 40000])
def test_native_every_instruction_set_matches_triton(dtype, cols):
    """Every instruction set's inner loops (block tails, chunked rows, fp16 via F16C) give the
    Triton kernels' sums and gradient."""
    from wc_kernels import _native
    from wc_kernels.ops.grpo_sde_loss.triton import sde_residual_sums, sde_residual_sums_bwd

    m, x, p, r, coef = _sums_args(b=3, d=cols, dtype=dtype)
    m = m.detach()
    weights = torch.randn(3, 2, dtype=coef.dtype)
    default = _native.isa()
    try:
        for isa in _native.available_isas():
            _native.set_isa(isa)
            for ref in (r, None):
                want = sde_residual_sums(m, x, p, ref, coef)
                got = _native.sde_residual_sums(m, x, p, ref, coef)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=isa)
                want = sde_residual_sums_bwd(weights, m, x, p, ref, coef).double()
                got = _native.sde_residual_sums_bwd(weights, m, x, p, ref, coef).double()
                ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10}.get(dtype, 1e-6)
                torch.testing.assert_close(got, want, rtol=ulp, atol=ulp, msg=isa)
    finally:
        _native.set_isa(default)


@pytest.mark.skipif(not NATIVE, reason="the native extension is not built")
def test_native_only_registration_without_triton(monkeypatch):
    """Without triton installed the ops are plain CPU custom ops over the native kernels."""
    monkeypatch.setattr(_registry, "HAVE_TRITON", False)
    op = library.define_ops("_native_only_test", native_cpu=True)[SDE_SUMS + "_native_only_test"]
    torch.library.opcheck(op, _sums_args())
    m, x, p, r, coef = _sums_args(b=2, d=3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda v: op(v, x, p, r, coef), (m,))


def _call(**overrides):
    m, x, prev, sigma, sigma_next, old, adv, ref = _inputs((3, 8))
    args = {"model_output": m, "sample": x, "prev_sample": prev, "sigma": sigma,
            "sigma_next": sigma_next, "old_log_prob": old, "advantage": adv, **KW}
    args.update(overrides)
    positional = [args.pop(k) for k in ("model_output", "sample", "prev_sample", "sigma",
                                        "sigma_next", "old_log_prob", "advantage")]
    return grpo_sde_loss(*positional, **args)


@pytest.mark.parametrize("overrides, error, match", [
    ({"sample": torch.zeros(3, 9)}, ValueError, "sample"),
    ({"prev_sample": torch.zeros(3, 8, dtype=torch.float64)}, TypeError, "prev_sample"),
    ({"sigma": torch.ones(2)}, ValueError, "sigma"),
    ({"advantage": torch.zeros(3, 1)}, ValueError, "advantage"),
    ({"old_log_prob": [0.0, 0.0, 0.0]}, TypeError, "old_log_prob"),
    ({"ref_output": torch.zeros(3, 8, dtype=torch.float16)}, TypeError, "ref_output"),
    ({"model_output": torch.zeros(3, 8, dtype=torch.int64)}, TypeError, "model_output"),
    ({"model_output": torch.zeros(0, 8)}, ValueError, "model_output"),
    ({"sigma_max": None}, ValueError, "sigma_max"),
    ({"sigma_max": 1.0}, ValueError, "sigma_max"),
    ({"sigma_next": torch.tensor([1.0, 0.5, 0.2])}, ValueError, "sigma_next must be < sigma"),
    ({"sigma": torch.tensor([1.0, 0.0, 0.1]), "sigma_next": torch.zeros(3)}, ValueError,
     "sigma must be > 0"),
    ({"sigma": torch.tensor([1.5, 0.5, 0.1])}, ValueError, "sigma"),
    ({"noise_level": 0.0}, ValueError, "noise_level"),
    ({"clip_range": float("nan")}, TypeError, "clip_range"),
    ({"adv_clip_max": -1.0}, ValueError, "adv_clip_max"),
    ({"kl_beta": 0.1}, ValueError, "ref_output"),
    ({"backend": "split"}, ValueError, "no 'split' backend"),
])
def test_bad_arguments_are_refused(overrides, error, match):
    with pytest.raises(error, match=match):
        _call(**overrides)


def test_nan_sigma_is_refused_as_not_finite():
    with pytest.raises(ValueError, match="sigma must be finite"):
        _call(sigma=torch.tensor([1.0, float("nan"), 0.1]))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_sigma_values_are_read_back_once(backend, monkeypatch):
    """Each host read waits for the device queue; the value checks of a valid call make one
    (a list read back), no per-condition ``bool()`` or ``item()``."""
    reads = []
    for name in ("tolist", "item", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    _call(backend=backend)
    assert reads == ["tolist"], reads


def test_sde_log_prob_checks_its_arguments():
    m, x, prev, sigma, sigma_next, *_ = _inputs((3, 8))
    with pytest.raises(ValueError, match="sigma_max"):
        sde_log_prob(m, x, prev, sigma, sigma_next, noise_level=0.7)
    with pytest.raises(ValueError, match="sample"):
        sde_log_prob(m, x[:2], prev, sigma, sigma_next, **STEP_KW)


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference_and_compiles(dtype):
    m, x, prev, sigma, sigma_next, old, adv, ref = (
        None if t is None else t.cuda() for t in _inputs((6, 3, 4096), dtype))
    torch.library.opcheck(OPS[SDE_SUMS],
                          _sums_args(dtype=dtype, device="cuda"))

    def step(leaf):
        return grpo_sde_loss(leaf, x, prev, sigma, sigma_next, old, adv, ref_output=ref,
                             kl_beta=0.2, **KW)

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaf = m.clone().requires_grad_()
        loss = fn(leaf)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    want = _reference_grad(*(None if t is None else t.cpu() for t in
                             (m, x, prev, sigma, sigma_next, old, adv, ref)), 0.2)
    rtol, atol = _tolerances(dtype)
    for loss, grad in results:
        torch.testing.assert_close(loss.cpu().double(), want[0], rtol=rtol, atol=atol)
        torch.testing.assert_close(grad.cpu().double(), want[3], rtol=rtol * 10, atol=atol)
