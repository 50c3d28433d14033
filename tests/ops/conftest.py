"""Fixtures of the kernel tests, shared by the ops' test modules (which opt in with
``pytestmark = pytest.mark.usefixtures(...)``)."""

import pytest
import torch

from wc_kernels import _backend


def _native_module():
    if not _backend.native_built():
        return None
    from wc_kernels import _native

    return _native


NATIVE = _native_module()


@pytest.fixture
def poison_outputs():
    """Fill the Triton and native kernels' output buffers with NaN before they run, so an
    element a kernel forgets to write fails the comparison."""
    from wc_kernels import _triton

    hooks = [_triton.set_poison_outputs] + ([NATIVE.set_poison_outputs] if NATIVE else [])
    for hook in hooks:
        hook(True)
    yield
    for hook in hooks:
        hook(False)


@pytest.fixture
def one_thread_per_test():
    """Run on one thread: on a shared 2-core machine every parallel op (of the reference and
    of torch.testing) can wait milliseconds for a busy second core. The native kernels split
    work the same way for any thread count, which
    test_nft_loss_is_deterministic_across_thread_counts checks on two threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=NATIVE.available_isas() if NATIVE else [])
def isa(request):
    """Run a test with the native kernels' inner loops of each instruction set this CPU
    supports."""
    default = NATIVE.isa()
    NATIVE.set_isa(request.param)
    yield request.param
    NATIVE.set_isa(default)
