"""Fast backends of ``flow_noise`` against ``backend="reference"``.

Every fast backend available here runs: ``triton`` (under ``TRITON_INTERPRET=1`` on CPU, set by
conftest) and ``native`` when ``wc_kernels._native`` is built. Outputs are NaN-poisoned before the
kernels run, so an element a kernel forgets to write fails the comparison. Sizes are odd and
small (65537 elements per row also crosses the chunk split of the row), since every
interpreted Triton program costs milliseconds.
"""

import pytest
import torch
from triton_cases import CASES, DTYPES, assert_matches

from wc_kernels import flow_noise

pytestmark = pytest.mark.usefixtures("poison_outputs")


@pytest.mark.parametrize("backend,device", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,k,shape", [(1, 1, (1,)), (3, 2, (3,)), (2, 5, (10, 100)),
                                       (1, 2, (65537,)), (2, 3, (2, 3, 5))], ids=str)
def test_flow_noise_matches_reference(backend, device, dtype, s, k, shape):
    """Outputs and gradients w.r.t. x0, sigmas and noise (each rounded once) within 1 ulp."""
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn((s, *shape), generator=g).to(device, dtype)
    sigmas = torch.rand(s, k, generator=g).to(device)
    sigmas[0, 0] = 1.0
    if k > 1:
        sigmas[0, 1] = 0.0
    noise = torch.randn((s * k, *shape), generator=g).to(device, dtype)
    g_xt, g_v = (torch.randn((s * k, *shape), generator=g).to(device, dtype) for _ in range(2))

    def run(name):
        leaves = [t.detach().clone().requires_grad_() for t in (x0, sigmas, noise)]
        x_t, v = flow_noise(*leaves, backend=name)
        torch.autograd.backward((x_t, v), (g_xt, g_v))
        return x_t.detach(), v.detach(), *(t.grad for t in leaves)

    out, ref = run(backend), run("reference")
    assert out[0].shape == (s * k, *shape) and out[0].dtype == dtype
    for got, want in zip(out, ref, strict=True):
        assert_matches(got, want)


@pytest.mark.parametrize("backend,device", CASES)
def test_flow_noise_non_contiguous_and_generated_noise(backend, device):
    g = torch.Generator().manual_seed(6)
    x0 = torch.randn(5, 7, 3, generator=g).to(device).transpose(1, 2)[::2]
    sigmas = torch.rand(4, 3, generator=g).to(device).t()
    noise = torch.randn(12, 7, 3, generator=g).to(device).transpose(1, 2)
    assert not (x0.is_contiguous() or sigmas.is_contiguous() or noise.is_contiguous())
    for got, want in zip(flow_noise(x0, sigmas, noise, backend=backend),
                         flow_noise(x0, sigmas, noise, backend="reference"), strict=True):
        assert_matches(got, want)
    gen = torch.Generator(device).manual_seed(7)
    x_t, v = flow_noise(x0, sigmas, generator=gen, backend=backend)
    eps = v + x0.repeat_interleave(4, dim=0)
    torch.testing.assert_close(x_t, (1 - sigmas.reshape(-1, 1, 1)) * x0.repeat_interleave(4, 0)
                               + sigmas.reshape(-1, 1, 1) * eps)


@pytest.mark.parametrize("backend,device", CASES)
def test_flow_noise_bad_inputs_rejected(backend, device):
    x0, sigmas, noise = torch.randn(2, 4), torch.rand(2, 3), torch.randn(6, 4)
    x0, sigmas, noise = x0.to(device), sigmas.to(device), noise.to(device)
    for exc, match, args in [
        (ValueError, "sigmas must have shape", (x0, sigmas[:1], noise)),
        (ValueError, "noise must have shape", (x0, sigmas, noise[:5])),
        (TypeError, "noise must have the dtype", (x0, sigmas, noise.double())),
        (ValueError, "sigmas is on", (x0, sigmas.to("meta"), noise)),
        (ValueError, "sigmas must lie in", (x0, sigmas * 3, noise)),
    ]:
        with pytest.raises(exc, match=match):
            flow_noise(*args, backend=backend)


def test_launcher_rejects_bad_operands():
    """The Triton launcher checks shapes, dtypes and devices itself (for direct op users)."""
    from wc_kernels.ops.flow_noise.triton import flow_noise as launch_flow

    vt, vs = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(ValueError, match="noise must have shape"):
        launch_flow(vt, torch.rand(2, 2), vs)
