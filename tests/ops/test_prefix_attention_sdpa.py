"""The split path on SDPA's own CUDA kernels (``sdpa_flash``, ``sdpa_cudnn``,
``sdpa_efficient``): its algebra on CPU, its adapters on the meta device, its values on a GPU.

On CPU the same autograd function runs over the CPU flash kernels, with the folded prefix
backward split into row groups as on CUDA: float64 parity of the output and every gradient with
the replicated reference. On the meta device each SDPA adapter runs the whole forward and
backward through its ``aten`` ops' meta kernels, which checks the call signatures and the
log-sum-exp layouts (flash ``[B, H, L]``, cuDNN ``[B, H, L, 1]``, efficient padded to 32).
"""

import pytest
import torch

import wc_kernels
from wc_kernels import reference
from wc_kernels.ops.prefix_attention import sdpa
from wc_kernels.ops.prefix_attention.split import (
    CPUFlashKernels,
    fold_rows,
    split_prefix_attention,
    unfold_rows,
)

KINDS = ("flash", "cudnn", "efficient")
CASES = [  # (G, H, P, L, Lk, D): G candidates over one prefix
    (1, 2, 7, 5, 5, 8),
    (3, 2, 13, 5, 0, 8),
    (3, 1, 33, 7, 3, 16),
    (16, 2, 29, 3, 3, 8),
    (16, 3, 1, 1, 5, 4),
]


class GroupedCPUFlash(CPUFlashKernels):
    """The CPU flash kernels with the prefix backward in ``groups`` row groups."""

    def __init__(self, groups: int) -> None:
        self.groups = groups

    def prefix_groups(self, b: int, h: int, p: int, device: torch.device) -> int:
        return self.groups if b % self.groups == 0 else 1


def _inputs(case, dtype=torch.float64, device="cpu", seed=0):
    g, h, p, lq, lk, d = case
    gen = torch.Generator().manual_seed(seed + sum(case))
    make = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(device, dtype)  # noqa: E731
    tensors = (make(g, h, lq, d), make(g, h, lk, d), make(g, h, lk, d), make(1, h, p, d),
               make(1, h, p, d))
    return [t.requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
def test_fold_and_unfold_are_inverse(groups):
    x = torch.randn(12, 3, 5, 7)
    folded = fold_rows(x, groups)
    assert folded.shape == (groups, 3, 12 // groups * 5, 7)
    assert torch.equal(unfold_rows(folded, 12), x)
    # group r holds candidates r*B/groups .. (r+1)*B/groups - 1, rows in order
    assert torch.equal(folded[-1, :, -5:], x[-1])
    assert torch.equal(folded[0, :, :5], x[0])


@pytest.mark.parametrize("groups", [1, 3, 16])
@pytest.mark.parametrize("case", CASES)
def test_grouped_split_matches_the_reference_in_float64(case, groups):
    ins = _inputs(case)
    out = split_prefix_attention(*ins, case[-1] ** -0.5, GroupedCPUFlash(groups))
    want = reference.prefix_attention(*ins)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    got = torch.autograd.grad(out, ins, up)
    expected = torch.autograd.grad(want, ins, up)
    for name, a, b in zip(("q", "k", "v", "prefix_k", "prefix_v"), got, expected, strict=True):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize(("b", "h", "p", "sms", "want"), [
    (16, 16, 1856, 132, 1),   # 240 key blocks in one group: the device is full already
    (16, 2, 1856, 132, 4),
    (16, 8, 1856, 132, 1),
    (6, 2, 256, 132, 3),      # divisors only
    (1, 2, 256, 132, 1),
    (16, 64, 1856, 132, 1),
])
def test_group_count(b, h, p, sms, want):
    assert sdpa._groups_for(b, h, p, sms, sdpa.MAX_PREFIX_GROUPS) == want


class GroupedSdpa(sdpa.SdpaKernels):
    def __init__(self, kind: str, groups: int) -> None:
        super().__init__(kind)
        self.groups = groups

    def prefix_groups(self, b: int, h: int, p: int, device: torch.device) -> int:
        return self.groups


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lk", [0, 37])
def test_adapters_run_forward_and_backward_on_the_meta_device(kind, groups, lk):
    """Every ``aten`` call of the adapters through its meta kernel: the signatures hold and
    each log-sum-exp arrives in the layout its backward takes."""
    if kind == "efficient" and groups > 1:
        pytest.skip("the efficient backend keeps one group (stride-0 keys, pytorch#191937)")
    g, h, p, lq, d = 16, 2, 130, 33, 64
    make = lambda *s: torch.empty(*s, device="meta", dtype=torch.bfloat16,  # noqa: E731
                                  requires_grad=True)
    ins = [make(g, h, lq, d), make(g, h, lk, d), make(g, h, lk, d), make(1, h, p, d),
           make(1, h, p, d)]
    out = split_prefix_attention(*ins, 0.125, GroupedSdpa(kind, groups))
    assert out.shape == (g, h, lq, d) and out.device.type == "meta"
    grads = torch.autograd.grad(out, ins, torch.empty_like(out))
    assert [t.shape for t in grads] == [t.shape for t in ins]


@pytest.mark.parametrize("kind", KINDS)
def test_each_forward_gives_the_lse_as_b_h_l(kind):
    q = torch.empty(2, 3, 37, 64, device="meta", dtype=torch.float16)
    k = torch.empty(2, 3, 53, 64, device="meta", dtype=torch.float16)
    out, lse, _ = sdpa.SdpaKernels(kind).forward(q, k, k, 0.125)
    assert out.shape == q.shape and lse.shape == (2, 3, 37) and lse.dtype == torch.float32


@pytest.mark.parametrize("backend", list(sdpa.SDPA_KERNELS))
def test_sdpa_backends_refuse_cpu_tensors(backend):
    ins = _inputs(CASES[0], dtype=torch.float16)
    with pytest.raises(RuntimeError, match=f"{backend} runs on CUDA tensors"):
        wc_kernels.prefix_attention(*ins, backend=backend)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES + [(16, 4, 1856, 256, 256, 64)])
@pytest.mark.parametrize("backend", list(sdpa.SDPA_KERNELS))
def test_sdpa_backends_match_the_reference_on_cuda(backend, case, dtype):
    ins = _inputs(case, dtype=dtype, device="cuda")
    out = wc_kernels.prefix_attention(*ins, backend=backend)
    want = reference.prefix_attention(*ins)
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
    up = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, ins, up), torch.autograd.grad(want, ins, up),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)
