"""Test setup: Triton runs under its CPU interpreter when there is no GPU.

The variable must be set before any Triton kernel module is imported, hence here.

Triton's interpreter before 3.8 calls ``int()`` on one-element arrays, which NumPy 2.4 refuses
(``TypeError: only 0-dimensional arrays can be converted to Python scalars``; fixed in Triton
3.8, triton-lang/triton#9171; 3.7 was not checked). With such a pair a test that fails with
that error is reported as skipped, with the reason, rather than failed; the fix is
``pip install "numpy<2.4"``.

The tests import the ops package ``wc_kernels``; where it is not importable they stop here,
saying how to get it.
"""

import contextlib
import importlib.util
import os
import re

import pytest
import torch

if importlib.util.find_spec("wc_kernels") is None:
    raise ImportError(
        "wc_kernels (the ops package) is not importable: "
        'install the project (pip install --no-build-isolation -e ".[dev]") or, without '
        "installing, export PYTHONPATH=$(bash bench/pythonpath.sh)")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# two torch threads, shared out among pytest-xdist's workers when the suite runs under it
# (python -m pytest -n 2): each worker then keeps to its share of the cores
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

INTERPRETER_NUMPY_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


def _version(text: str) -> tuple[int, int]:
    major, minor = (re.findall(r"\d+", text) + ["0", "0"])[:2]
    return int(major), int(minor)


def interpreter_numpy_clash() -> str | None:
    """Why Triton's interpreter cannot run under this NumPy (None when it can)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    try:
        import numpy
        import triton
    except ImportError:
        return None
    if _version(triton.__version__) < (3, 8) and _version(numpy.__version__) >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter cannot run under NumPy "
                f"{numpy.__version__} (int() of a one-element array; fixed in Triton 3.8): "
                f'pip install "numpy<2.4"')
    return None


CLASH = interpreter_numpy_clash()


def pytest_report_header(config):
    if CLASH:
        return [f"interpreter tests failing with {INTERPRETER_NUMPY_ERROR!r} are skipped: "
                f"{CLASH}"]
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as exc:
        if CLASH and INTERPRETER_NUMPY_ERROR in str(exc):
            pytest.skip(CLASH)
        raise


def pytest_collection_modifyitems(config, items):
    # slow-marked tests first (a stable sort, the same order in every pytest-xdist worker):
    # under `pytest -n 2` the minutes-long ones then overlap the many short ones instead of
    # starting last and running alone
    items.sort(key=lambda item: "slow" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@contextlib.contextmanager
def _single_torch_thread():
    """One torch thread inside, the previous count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of small-tensor tests (faster than two on a busy
    2-core machine)."""
    with _single_torch_thread():
        yield


# Kernel test fixtures: the modules of tests/ops/ opt in with
# pytestmark = pytest.mark.usefixtures(...).

def _native_module():
    from wc_kernels import _backend

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
    with _single_torch_thread():
        yield


@pytest.fixture(params=NATIVE.available_isas() if NATIVE else [])
def isa(request):
    """Run a test with the native kernels' inner loops of each instruction set this CPU
    supports."""
    default = NATIVE.isa()
    NATIVE.set_isa(request.param)
    yield request.param
    NATIVE.set_isa(default)


@pytest.fixture(autouse=True)
def _seeded_global_rng():
    """Each test starts from one global RNG state, so what it draws without a generator of its
    own is the same alone, in the full suite, in any order and under pytest-xdist: a tolerance
    that holds here holds on CI."""
    torch.manual_seed(0)
