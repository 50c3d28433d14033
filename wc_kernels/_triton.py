"""Fused Triton kernels of the drop-in ops, and the launch configurations they share.

The kernels and their launchers live beside each op, in :mod:`wc_kernels.ops.nft_loss.triton`,
:mod:`wc_kernels.ops.flow_noise.triton`, :mod:`wc_kernels.ops.grpo_sde_loss.triton` and
:mod:`wc_kernels.ops.prefix_attention.triton`; importing this module imports ``triton``.

On CUDA the block size and warp count are fixed per kernel (so ``python -m wc_kernels.aot`` can
compile exactly the configurations that run), and long rows are split into chunks so that a
batch of a few huge rows still fills every SM. Under ``TRITON_INTERPRET=1`` every program
instance costs milliseconds, so blocks are as large as the rows allow, capped to keep numpy
temporaries small; rows longer than a few blocks are still split, so the CPU tests exercise the
split path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from wc_kernels._backend import may_trace

INTERPRET_MAX_BLOCK = 1 << 14
INTERPRET_BLOCKS_PER_CHUNK = 4
PROGRAMS_PER_SM = 4

_poison_outputs = False


@dataclass(frozen=True)
class RowSplit:
    """Grid ``(rows, n_splits)``: program ``(i, c)`` handles ``chunk`` elements of row ``i``."""

    block: int
    chunk: int
    n_splits: int
    num_warps: int


@dataclass(frozen=True)
class AotConfig:
    """One CUDA launch configuration of a kernel, as ``python -m wc_kernels.aot`` compiles it.

    ``aligned`` names the pointer arguments (16-byte aligned) and integer arguments (multiples
    of 16) that Triton's run-time specialization marks as such in the usual launches.
    """

    kernel: Any
    dtype: str
    variant: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    aligned: tuple[str, ...] = ()
    num_stages: int = 3  # Triton's CUDA default

    def with_unit(self, name: str) -> AotConfig:
        """This configuration with integer argument ``name`` equal to 1, which Triton compiles
        as a constant at run time."""
        return replace(self, variant=f"{self.variant}, {name}=1".lstrip(", "),
                       signature={**self.signature, name: "constexpr"},
                       constexprs={**self.constexprs, name: 1},
                       aligned=tuple(a for a in self.aligned if a != name))


def set_poison_outputs(on: bool) -> None:
    """Fill new output buffers with NaN before the kernels run, so tests catch unwritten
    elements (mirrors ``wc_kernels._native.set_poison_outputs``)."""
    global _poison_outputs
    _poison_outputs = on


def new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized buffer the kernels fill completely (NaN-filled while poisoning)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    return out.fill_(float("nan")) if _poison_outputs else out


def check_operand(op: str, name: str, t: torch.Tensor, shape: tuple[int, ...], ref_name: str,
                  ref: torch.Tensor, *, same_dtype: bool) -> None:
    """``t`` has ``shape`` and ``ref``'s device (and dtype when ``same_dtype``)."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}")
    if same_dtype and t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} must have the dtype of {ref_name} ({ref.dtype}), "
                        f"got {t.dtype}")


def launchable(kernel: Any, *tensors: torch.Tensor | None) -> Any:
    """``kernel`` to launch (``launchable(k, x, y)[grid](x, y, ...)``): ``wrap_triton(kernel)``
    when anything :func:`may_trace` the launch, where it must show up in the graph; else the
    kernel itself. In eager, wrap_triton's higher-order-op dispatch costs tens of microseconds
    of host time per launch (flash-attention#2818), more than a small kernel runs; the launch
    itself is the same."""
    return wrap_triton(kernel) if may_trace(*tensors) else kernel


def tl_acc(dtype: torch.dtype) -> tl.dtype:
    """Triton accumulation dtype (:func:`wc_kernels._dtypes.compute_dtype`)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def interpret_block(n: int) -> int:
    """Block size for ``n`` elements under the interpreter: a power of two, 16 to 2**14."""
    return min(INTERPRET_MAX_BLOCK, max(16, triton.next_power_of_2(n)))


def row_split(rows: int, d: int, device: torch.device, gpu_block: int, gpu_warps: int) -> RowSplit:
    """Split ``rows`` rows of ``d`` elements into chunks of whole blocks (see module doc)."""
    if device.type == "cuda":
        block = gpu_block
        target = PROGRAMS_PER_SM * _sm_count(device.index or 0)
        splits = max(1, min(triton.cdiv(target, rows), triton.cdiv(d, block)))
        chunk = triton.cdiv(triton.cdiv(d, splits), block) * block
    else:
        block = interpret_block(d)
        chunk = min(triton.cdiv(d, block), INTERPRET_BLOCKS_PER_CHUNK) * block
    return RowSplit(block, chunk, triton.cdiv(d, chunk), gpu_warps)
