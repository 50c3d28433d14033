"""``prefix_attention`` on inputs with no query row and with a non-finite ``scale``.

Every CPU backend runs (``triton`` under ``TRITON_INTERPRET=1``, set by conftest). An empty
batch once killed the interpreter with SIGFPE in the ``split`` path, so each empty case runs
in a child process first: a crash fails the test instead of the whole session.
"""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import wc_kernels
from wc_kernels import reference

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("reference", "split", "flex", "triton")
EMPTY = [(0, 5), (2, 0), (0, 0)]  # (B, L): no query row


def _inputs(b: int, lq: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(b * 10 + lq)
    shapes = ((b, 2, lq, 8), (b, 2, 3, 8), (b, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    return [torch.randn(*s, generator=g).requires_grad_(True) for s in shapes]


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_query_row_gives_an_empty_output_in_a_child_process(backend):
    code = textwrap.dedent(f"""
        import torch, wc_kernels
        for b, lq in {EMPTY}:
            shapes = ((b, 2, lq, 8), (b, 2, 3, 8), (b, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8))
            out = wc_kernels.prefix_attention(*(torch.randn(*s) for s in shapes),
                                              backend="{backend}")
            print(tuple(out.shape))
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"
    shapes = [line for line in done.stdout.splitlines() if line.startswith("(")]
    assert shapes == [str((b, 2, lq, 8)) for b, lq in EMPTY]


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
