"""``prefix_attention`` on zero-size inputs and with a non-finite ``scale``.

Every CPU backend runs (``triton`` under ``TRITON_INTERPRET=1``, set by conftest). An empty
batch once killed the interpreter with SIGFPE in the ``split`` path, and zero heads did too, so
the zero-size matrix runs in a child process first: a crash fails the test instead of the whole
session.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import wc_kernels
from wc_kernels import reference

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("reference", "split", "flex", "triton", "replicated")
EMPTY = [(0, 5), (2, 0), (0, 0)]  # (B, L): no query row


def _inputs(b: int, lq: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(b * 10 + lq)
    shapes = ((b, 2, lq, 8), (b, 2, 3, 8), (b, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    return [torch.randn(*s, generator=g).requires_grad_(True) for s in shapes]


# (B, H, L, Lk, P, D) -> what every CPU backend must do: "empty" (the empty output),
# "defined" (attention over the side that has keys; equal to the reference), or the argument a
# ValueError names
ZERO_SIZE = {
    (0, 2, 5, 3, 4, 8): "empty",
    (2, 2, 0, 3, 4, 8): "empty",
    (0, 2, 0, 3, 4, 8): "empty",
    (0, 2, 5, 0, 4, 8): "empty",
    (2, 2, 5, 0, 4, 8): "defined",
    (2, 2, 5, 3, 0, 8): "defined",
    (1, 2, 1, 0, 1, 8): "defined",
    (2, 0, 5, 3, 4, 8): "q",
    (0, 0, 0, 0, 0, 8): "q",
    (2, 2, 5, 3, 4, 0): "q",
    (2, 0, 5, 3, 4, 0): "q",
    (2, 2, 5, 0, 0, 8): "k and prefix_k",
    (0, 2, 5, 0, 0, 8): "k and prefix_k",
}

ZERO_SIZE_CHILD = """
import sys, torch, wc_kernels
from wc_kernels import reference
backend, cases = sys.argv[1], eval(sys.argv[2])
for b, h, lq, lk, p, d in cases:
    g = torch.Generator().manual_seed(0)
    shapes = ((b, h, lq, d), (b, h, lk, d), (b, h, lk, d), (1, h, p, d), (1, h, p, d))
    ins = [torch.randn(*s, generator=g) for s in shapes]
    try:
        out = wc_kernels.prefix_attention(*ins, backend=backend)
    except ValueError as exc:
        print("ValueError", str(exc).replace(chr(10), " "), flush=True)
        continue
    want = reference.prefix_attention(*ins)
    equal = out.shape == want.shape and torch.allclose(out, want, rtol=2e-5, atol=2e-5)
    print("empty" if out.numel() == 0 else "defined" if equal else f"WRONG {out.shape}",
          flush=True)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_matrix_in_a_child_process(backend):
    """Every zero-size shape on every CPU backend, in a child process whose exit status is
    checked: no SIGFPE, no division by zero; empty where the output is empty, the reference's
    values where attention is defined, a ``ValueError`` naming the argument where it is not."""
    cases = list(ZERO_SIZE)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", ZERO_SIZE_CHILD, backend, repr(cases)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"
    lines = done.stdout.splitlines()
    assert len(lines) == len(cases), done.stdout
    for case, line in zip(cases, lines, strict=True):
        want = ZERO_SIZE[case]
        if want in ("empty", "defined"):
            assert line == want, (case, line)
        else:  # the message starts with the argument it names
            assert line.startswith(f"ValueError {want} "), (case, line)


@pytest.mark.parametrize("backend", ("reference", "split", "triton", "replicated"))
@pytest.mark.parametrize(("lk", "p"), [(0, 4), (3, 0)])
def test_one_empty_key_side_has_the_references_gradients(backend, lk, p):
    """``Lk = 0`` or ``P = 0``: the gradients equal the reference's, and the empty side's are
    empty tensors of its shape."""
    g = torch.Generator().manual_seed(lk * 10 + p)
    shapes = ((2, 2, 5, 8), (2, 2, lk, 8), (2, 2, lk, 8), (1, 2, p, 8), (1, 2, p, 8))
    ins = [torch.randn(*s, generator=g).requires_grad_(True) for s in shapes]
    out = wc_kernels.prefix_attention(*ins, backend=backend)
    up = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, ins, up)
    want = torch.autograd.grad(reference.prefix_attention(*ins), ins, up)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("b", "lq"), EMPTY)
def test_no_query_row_has_zero_gradients(backend, b, lq):
    ins = _inputs(b, lq)
    out = wc_kernels.prefix_attention(*ins, backend=backend)
    assert out.shape == (b, 2, lq, 8) and out.dtype == ins[0].dtype
    grads = torch.autograd.grad(out.sum(), ins)
    for t, g in zip(ins, grads, strict=True):
        assert g.shape == t.shape
        assert not g.any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_non_finite_scale_is_refused(backend, scale):
    with pytest.raises(ValueError, match="scale"):
        wc_kernels.prefix_attention(*_inputs(2, 3), scale=scale, backend=backend)


@pytest.mark.parametrize("scale", ["0.5", True, torch.tensor(0.5)])
def test_scale_of_another_type_is_refused(scale):
    with pytest.raises(TypeError, match="scale"):
        wc_kernels.prefix_attention(*_inputs(2, 3), scale=scale, backend="reference")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_finite_scale_still_matches_the_reference(backend):
    ins = [t.detach() for t in _inputs(2, 3)]  # flex on CPU has no backward
    got = wc_kernels.prefix_attention(*ins, scale=0.3, backend=backend)
    want = reference.prefix_attention(*ins, scale=0.3)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
