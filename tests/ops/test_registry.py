"""The registration machinery the fused ops share (``wc_kernels._registry``), and the ops
together: which kernel each registered op runs, ``torch.compile`` of both elementwise ops in one
graph, and the native extension's instruction-set switch.

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
from test_flow_noise_ops import _flow_args
from test_nft_loss_ops import _nft_args

from wc_kernels import _backend, _registry, flow_noise, nft_loss
from wc_kernels.ops.flow_noise import library as flow_ops
from wc_kernels.ops.flow_noise.triton import flow_noise as launch_flow
from wc_kernels.ops.nft_loss import library as nft_ops
from wc_kernels.ops.nft_loss.triton import nft_loss_fwd as launch_nft

ROOT = Path(__file__).resolve().parents[2]
NATIVE = _backend.native_built()
GPU = pytest.mark.gpu
BACKENDS = ["reference", "triton"] + (["native"] if NATIVE else [])
NFT_LOSS, FLOW_NOISE = nft_ops.NFT_LOSS, flow_ops.FLOW_NOISE


def test_registration_table():
    assert NFT_LOSS in nft_ops.OPS and FLOW_NOISE in flow_ops.OPS
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert _registry.op_for(NFT_LOSS, "triton", cpu, nft_ops.OPS) is \
        nft_ops.OPS[NFT_LOSS + "_triton"]
    assert _registry.op_for(NFT_LOSS, "triton", cuda, nft_ops.OPS) is nft_ops.OPS[NFT_LOSS]
    assert _registry.op_for(FLOW_NOISE, "native", cpu, flow_ops.OPS) is \
        flow_ops.OPS[FLOW_NOISE]
    assert torch.ops.wc_fast.nft_loss_fwd.default._schema.arguments[4].type.str() == "Tensor?"


def test_cpu_kernels_are_native_when_built_else_triton():
    """The main ops run the native kernel on CPU when it is built; the twins always Triton."""
    nft, flow = _nft_args(grad=False), _flow_args(grad=False)
    main_nft = nft_ops.OPS[NFT_LOSS](*nft)
    main_flow = flow_ops.OPS[FLOW_NOISE](*flow)
    if NATIVE:
        from wc_kernels import _native

        want_nft, want_flow = _native.nft_loss_fwd(*nft), _native.flow_noise(*flow)
    else:
        want_nft, want_flow = launch_nft(*nft), launch_flow(*flow)
    for got, want in zip((*main_nft, *main_flow), (*want_nft, *want_flow), strict=True):
        assert torch.equal(got, want)
    twin_nft = nft_ops.OPS[NFT_LOSS + "_triton"](*nft)
    for got, want in zip(twin_nft, launch_nft(*nft), strict=True):
        assert torch.equal(got, want)


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



_TRACE_SCRIPT = """
import torch
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from wc_kernels import _backend, nft_loss
from wc_kernels.ops.flow_noise.library import FLOW_NOISE, OPS as FLOW_OPS
from wc_kernels.ops.nft_loss.library import NFT_LOSS, OPS as NFT_OPS

def kernels_in(op, args):
    gm = make_fx(dispatch_functionalize(op), tracing_mode="fake")(*args)
    return gm.code.count("triton_kernel_wrapper_functional(")

b, d = 3, 40
t = [torch.randn(b, d) for _ in range(3)] + [torch.rand(b), torch.rand(b)]
flow = (torch.randn(2, d), torch.rand(2, 3), torch.randn(6, d))
twin_nft = NFT_OPS[NFT_LOSS + "_triton"]
twin_flow = FLOW_OPS[FLOW_NOISE + "_triton"]
print("twin_x0", kernels_in(lambda *a: twin_nft(*a, 1.0, True), t))
print("twin_velocity", kernels_in(lambda *a: twin_nft(*a[:4], None, 1.0, False), t))
print("twin_flow", kernels_in(twin_flow, flow))
main = NFT_OPS[NFT_LOSS]
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


def test_set_isa_rejects_unknown_names():
    native = pytest.importorskip("wc_kernels._native", reason="the native extension is not built")
    with pytest.raises(RuntimeError, match="unknown or unsupported instruction set"):
        native.set_isa("sse9")
