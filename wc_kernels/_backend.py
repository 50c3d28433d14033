"""Backend selection for the drop-in ops.

``reference`` is plain PyTorch (the spec), ``triton`` the fused Triton kernels (CUDA, or CPU
tensors under ``TRITON_INTERPRET=1``), ``native`` the C++ CPU extension built from ``csrc/``.
Attention only: ``split`` (two fused partial attentions merged by LSE, CPU), the same on
SDPA's CUDA kernels (``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``; by name only),
``replicated`` (SDPA over the prefix copied per row: what plain batching does, a baseline),
``flex``
(FlexAttention with a block mask; CUDA, forward-only on CPU), and the optional libraries
``flash_attn`` and ``xformers`` (partials merged by LSE; CUDA, when installed) and
``prefix_grouper`` (PrefixGrouper's attention, the prefix copied per row; CPU or CUDA, when
installed), never chosen by ``auto``, whose CUDA order is the project's own kernels.
``auto`` takes the first implemented and runnable backend in :data:`AUTO_ORDER` for the device
(``prefix_attention`` first tries the backend its per-device table lists for the shape).
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

BACKENDS = ("auto", "reference", "triton", "native", "split", "flex", "flash_attn", "xformers",
            "prefix_grouper", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "replicated")
# the split path on SDPA's own CUDA kernels (attention only; chosen by name until their GPU
# parity tests have passed on a device)
SDPA_BACKENDS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
# optional attention libraries: backend name -> (module to import, pip requirement)
LIBRARIES = {"flash_attn": ("flash_attn", "flash-attn"), "xformers": ("xformers.ops", "xformers"),
             "prefix_grouper": ("prefix_grouper", "prefix-grouper")}
# the libraries whose kernels run on CUDA tensors only (prefix-grouper is plain PyTorch)
CUDA_LIBRARIES = ("flash_attn", "xformers")
AUTO_ORDER = {"cuda": ("triton", "flex"), "cpu": ("native", "split")}


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def native_built() -> bool:
    """Whether the optional C++ extension ``wc_kernels._native`` was built and loads."""
    return _importable("wc_kernels._native")


def unavailable_reason(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run on ``device`` (None when it can)."""
    if backend in ("reference", "replicated"):
        return None
    if backend == "triton":
        if not _importable("triton"):
            return "triton is not installed (pip install triton)"
        if device.type == "cuda" or (device.type == "cpu" and triton_interpreting()):
            return None
        if device.type == "cpu":
            return ("Triton on CPU tensors needs TRITON_INTERPRET=1 in the environment before "
                    "wc_kernels is imported")
        return f"Triton kernels run on CUDA devices, not {device.type}"
    if backend == "native":
        if device.type != "cpu":
            return f"the native backend runs on CPU tensors, not {device.type}"
        if not native_built():
            return ("the native extension wc_kernels._native is not built; reinstall with "
                    "pip install --no-build-isolation -e . (without WC_FAST_NO_NATIVE=1)")
        return None
    if backend == "split":
        return None if device.type == "cpu" else f"split runs on CPU tensors, not {device.type}"
    if backend in SDPA_BACKENDS:
        return None if device.type == "cuda" else f"{backend} runs on CUDA tensors, not " \
            f"{device.type} (on CPU, 'split' runs the same path on the CPU flash kernels)"
    if backend in LIBRARIES:
        module, requirement = LIBRARIES[backend]
        if backend in CUDA_LIBRARIES and device.type != "cuda":
            return f"{backend} runs on CUDA tensors, not {device.type}"
        if not _importable(module):
            return f"{requirement} is not installed (pip install {requirement})"
        return None
    if backend == "flex":
        if not _importable("torch.nn.attention.flex_attention"):
            return "this torch has no FlexAttention (torch >= 2.5 needed)"
        return None
    return f"unknown backend {backend!r}; expected one of {BACKENDS}"


@torch.compiler.assume_constant_result
def resolve(op: str, backend: str, device: torch.device, implemented: tuple[str, ...],
            preferred: tuple[str, ...] = ()) -> str:
    """The concrete backend ``op`` uses for tensors on ``device``; raises if it cannot run.

    ``auto`` tries ``preferred`` (a device's measured choice) before :data:`AUTO_ORDER`.
    A trace-time constant under ``torch.compile`` (dynamo cannot trace the import probes).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        for candidate in (*preferred, *AUTO_ORDER.get(device.type, ()), "reference"):
            if candidate in implemented and unavailable_reason(candidate, device) is None:
                return candidate
        return "reference"
    if backend not in implemented:
        raise ValueError(f"{op} has no {backend!r} backend; available: {implemented}")
    reason = unavailable_reason(backend, device)
    if reason is not None:
        raise RuntimeError(f"{op}: backend={backend!r} is unavailable: {reason}")
    return backend


def may_trace(*tensors: torch.Tensor | None) -> bool:
    """Whether anything may be tracing a call on ``tensors``: compiling, a dispatch mode
    (FakeTensorMode, a proxy mode), or an input that is a tensor subclass (FakeTensor,
    FunctionalTensor)."""
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or any(t is not None and type(t) is not torch.Tensor for t in tensors))
