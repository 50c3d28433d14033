"""torch.library registration of the fused ops: opcheck, gradcheck, torch.compile.

On CPU the Triton kernels run under the interpreter, where they cannot be traced: there the
ops are opaque custom ops (compile uses their fake kernels), and ``torch.compile`` is tested
with the ``aot_eager`` backend (Inductor's C++ compile alone takes ~30 s on 2 cores). The
``triton_op`` decomposition that Inductor sees on a GPU is checked on CPU by tracing it in a
subprocess without ``TRITON_INTERPRET`` (tracing needs no driver), and run for real by the
GPU-marked tests.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from wc_kernels import _backend, _ops, flow_noise, nft_loss
from wc_kernels._triton.flow_noise import flow_noise as launch_flow
from wc_kernels._triton.nft_loss import nft_loss_fwd as launch_nft

ROOT = Path(__file__).resolve().parents[1]
NATIVE = _backend.native_built()
GPU = pytest.mark.gpu
ALL_OPS = sorted(_ops.OPS)
BACKENDS = ["reference", "triton"] + (["native"] if NATIVE else [])


def _nft_args(b=3, d=20, dtype=torch.float32, device="cpu", x0=True, grad=True,
              grad_scale=None):
    g = torch.Generator().manual_seed(0)
    vt, vo, vs = (torch.randn(b, d, generator=g, dtype=dtype).to(device) for _ in range(3))
    r, sigma = torch.rand(b, generator=g).to(device), torch.rand(b, generator=g).to(device)
    scale = () if grad_scale is None else (grad_scale,)
    return (vt.requires_grad_(grad), vo, vs, r, sigma if x0 else None, 0.5, x0, *scale)


def _flow_args(s=2, k=3, d=10, dtype=torch.float32, device="cpu", grad=True):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(s, d, generator=g, dtype=dtype).to(device).requires_grad_(grad)
    sigmas = torch.rand(s, k, generator=g).to(device)
    noise = torch.randn(s * k, d, generator=g, dtype=dtype).to(device).requires_grad_(grad)
    return x0, sigmas, noise


def _args_for(name, **kw):
    return _nft_args(**kw) if name.startswith(_ops.NFT_LOSS) else _flow_args(**kw)


def test_registration_table():
    assert {_ops.NFT_LOSS, _ops.FLOW_NOISE} <= set(_ops.OPS)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert _ops.op_for(_ops.NFT_LOSS, "triton", cpu) is _ops.OPS[_ops.NFT_LOSS + "_triton"]
    assert _ops.op_for(_ops.NFT_LOSS, "triton", cuda) is _ops.OPS[_ops.NFT_LOSS]
    assert _ops.op_for(_ops.FLOW_NOISE, "native", cpu) is _ops.OPS[_ops.FLOW_NOISE]
    assert torch.ops.wc_fast.nft_loss_fwd.default._schema.arguments[4].type.str() == "Tensor?"


def test_cpu_kernels_are_native_when_built_else_triton():
    """The main ops run the native kernel on CPU when it is built; the twins always Triton."""
    nft, flow = _nft_args(grad=False), _flow_args(grad=False)
    main_nft = _ops.OPS[_ops.NFT_LOSS](*nft)
    main_flow = _ops.OPS[_ops.FLOW_NOISE](*flow)
    if NATIVE:
        from wc_kernels import _native

        want_nft, want_flow = _native.nft_loss_fwd(*nft), _native.flow_noise(*flow)
    else:
        want_nft, want_flow = launch_nft(*nft), launch_flow(*flow)
    for got, want in zip((*main_nft, *main_flow), (*want_nft, *want_flow), strict=True):
        assert torch.equal(got, want)
    twin_nft = _ops.OPS[_ops.NFT_LOSS + "_triton"](*nft)
    for got, want in zip(twin_nft, launch_nft(*nft), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ALL_OPS)
def test_opcheck(name):
    variants = [{}]
    if name.startswith(_ops.NFT_LOSS):
        variants = [{"x0": True}, {"x0": False, "dtype": torch.float16},
                    {"x0": True, "grad_scale": -0.25}]
    for kw in variants:
        torch.library.opcheck(_ops.OPS[name], _args_for(name, **kw))


@pytest.mark.parametrize("name", ALL_OPS)
def test_gradcheck_float64(name):
    """The registered backward against finite differences: w.r.t. v_theta in velocity space
    (x0 space detaches its weights, so its gradient is not the derivative), x0 and noise."""
    op = _ops.OPS[name]
    if name.startswith(_ops.NFT_LOSS):
        for grad_scale in (None, 0.3):
            vt, *rest = _nft_args(b=2, d=3, dtype=torch.float64, x0=False,
                                  grad_scale=grad_scale)
            assert torch.autograd.gradcheck(lambda v, rest=rest: op(v, *rest)[0], (vt,))
    else:
        x0, sigmas, noise = _flow_args(s=2, k=2, d=3, dtype=torch.float64)
        assert torch.autograd.gradcheck(lambda a, n: op(a, sigmas, n), (x0, noise))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph(backend):
    """Public ops under torch.compile(fullgraph=True): same loss and gradients as eager."""
    vt, vo, vs, r, sigma, _, _ = _nft_args(b=4, d=33)
    x0, sigmas, noise = _flow_args()

    def step(vt, vo, vs, r, sigma, x0, sigmas, noise):
        x_t, v = flow_noise(x0, sigmas, noise, backend=backend)
        loss = nft_loss(vt, vo, vs, r, sigma=sigma, space="x0", backend=backend)
        loss = loss + nft_loss(vt, vo, vs, r, beta=0.5, reduction="sum", backend=backend)
        return loss + (x_t * v).mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (step, compiled):
        leaves = [t.detach().clone().requires_grad_() for t in (vt, x0, sigmas, noise)]
        loss = fn(leaves[0], vo, vs, r, sigma, *leaves[1:])
        loss.backward()
        results.append([loss.detach(), *(t.grad for t in leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not NATIVE, reason="the native extension is not built")
def test_native_only_registration_without_triton(monkeypatch):
    """Without triton installed the ops are plain CPU custom ops over the native kernels."""
    monkeypatch.setattr(_ops, "HAVE_TRITON", False)
    nft = _ops._define_nft("wc_fast_test::nft_loss_fwd_native_only", native=True)
    flow = _ops._define_flow("wc_fast_test::flow_noise_native_only", native=True)
    torch.library.opcheck(nft, _nft_args())
    torch.library.opcheck(flow, _flow_args())


def test_unavailable_backend_under_compile_raises():
    def f(vt, vo, vs, r):
        return nft_loss(vt, vo, vs, r, backend="native")

    vt, vo, vs, r, *_ = _nft_args(x0=False)
    if NATIVE:
        pytest.skip("the native backend is built here")
    with pytest.raises(Exception, match="native extension wc_kernels._native is not built"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(vt, vo, vs, r)


_TRACE_SCRIPT = """
import torch
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from wc_kernels import _backend, _ops, nft_loss

def kernels_in(op, args):
    gm = make_fx(dispatch_functionalize(op), tracing_mode="fake")(*args)
    return gm.code.count("triton_kernel_wrapper_functional(")

b, d = 3, 40
t = [torch.randn(b, d) for _ in range(3)] + [torch.rand(b), torch.rand(b)]
flow = (torch.randn(2, d), torch.rand(2, 3), torch.randn(6, d))
twin_nft = _ops.OPS[_ops.NFT_LOSS + "_triton"]
twin_flow = _ops.OPS[_ops.FLOW_NOISE + "_triton"]
print("twin_x0", kernels_in(lambda *a: twin_nft(*a, 1.0, True), t))
print("twin_velocity", kernels_in(lambda *a: twin_nft(*a[:4], None, 1.0, False), t))
print("twin_flow", kernels_in(twin_flow, flow))
main = _ops.OPS[_ops.NFT_LOSS]
print("main_x0_cpu", kernels_in(lambda *a: main(*a, 1.0, True), t))
if _backend.native_built():
    vt = t[0].clone().requires_grad_()
    f = lambda vt, vo, vs, r, s: nft_loss(vt, vo, vs, r, sigma=s, space="x0", backend="native")
    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(vt, *t[1:])
    loss.backward()
    ref = t[0].clone().requires_grad_()
    f(ref, *t[1:]).backward()
    print("native_compiled_ok", bool(torch.allclose(vt.grad, ref.grad)))
"""


def test_triton_op_traces_without_interpreter():
    """Without TRITON_INTERPRET the ops are triton_ops: functionalization exposes their Triton
    kernels (what Inductor compiles on a GPU) for the Triton-only twins, while the main ops
    stay whole on CPU tensors when the native kernel owns the CPU key (and then compile and run
    natively)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_TRACE_SCRIPT)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = dict(line.split() for line in proc.stdout.splitlines())
    assert out["twin_x0"] == "2" and out["twin_velocity"] == "1" and out["twin_flow"] == "1"
    if NATIVE:
        assert out["main_x0_cpu"] == "0" and out["native_compiled_ok"] == "True"
    else:
        assert out["main_x0_cpu"] == "2"


@GPU
@pytest.mark.parametrize("name", [_ops.NFT_LOSS, _ops.FLOW_NOISE])
def test_opcheck_cuda(name):
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(_ops.OPS[name], _args_for(name, dtype=dtype, device="cuda"))


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_inductor_cuda(dtype):
    """Inductor compiles the Triton kernels of both ops into the graph: same as eager."""
    g = torch.Generator(device="cuda").manual_seed(0)
    s, k, d = 3, 4, 1 << 16
    x0 = torch.randn(s, d, device="cuda", generator=g, dtype=dtype)
    sigmas = torch.rand(s, k, device="cuda", generator=g)
    noise = torch.randn(s * k, d, device="cuda", generator=g, dtype=dtype)
    vt = torch.randn(s * k, d, device="cuda", generator=g, dtype=dtype)
    r = torch.rand(s * k, device="cuda", generator=g)

    def step(vt, x0, sigmas, noise, r):
        x_t, v = flow_noise(x0, sigmas, noise)
        v_old = x_t.detach() * 0.5
        return nft_loss(vt, v_old, v, r, sigma=sigmas.reshape(-1), space="x0")

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaf = vt.clone().requires_grad_()
        loss = fn(leaf, x0, sigmas, noise, r)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=0)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-2 if dtype != torch.float32
                               else 1e-5, atol=1e-6)
