"""``torch.library`` registration machinery shared by the fused ops.

Each op's ``library`` module (:mod:`wc_kernels.ops.nft_loss.library`,
:mod:`wc_kernels.ops.flow_noise.library`, :mod:`wc_kernels.ops.grpo_sde_loss.library`,
:mod:`wc_kernels.ops.prefix_attention.library`) registers its ops when imported, with their
fake kernels and autograd; the public ops import it when they first use a fast backend. An op
with a native kernel comes as a pair (:func:`define_with_twin`):

- the main op (``wc_fast::nft_loss_fwd``, ...): Triton on CUDA; on CPU the native kernel
  (``wc_kernels._native``) when it is built, else Triton under ``TRITON_INTERPRET=1``;
- its twin, the same name plus :data:`TRITON_TWIN`: Triton on every device, so that
  ``backend="triton"`` reaches the Triton kernels on CPU tensors even when the native kernel
  owns the CPU dispatch key of the main op.

Both ops of a pair get the same fake kernel and the same autograd formula. The Triton
implementations are ``torch.library.triton_op`` so ``torch.compile`` sees (and Inductor can
compile) the kernels; under the interpreter they are opaque custom ops. Without ``triton``
installed only the native CPU kernels are registered; with neither, no op is.

Each op is a :class:`FusedOp`: in plain eager execution (nothing compiling or tracing, see
:func:`~wc_kernels._backend.may_trace`) it calls its implementation directly under a
``torch.autograd.Function`` with the same autograd formula, skipping the ``torch.library``
dispatcher's host cost; under ``torch.compile``, export or a dispatch mode it calls the
registered op, which those see as one node. Both routes run the same kernels on the same
arguments, so they give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from wc_kernels._backend import may_trace, native_built, triton_interpreting

try:
    import triton  # noqa: F401
except ImportError:
    HAVE_TRITON = False
else:
    HAVE_TRITON = True

NATIVE = native_built()
TRITON_TWIN = "_triton"


@dataclass(frozen=True)
class FusedOp:
    """A registered op (``registered``) and the same implementation for direct eager calls
    (``direct``: under a ``torch.autograd.Function`` with the registered autograd formula for
    an op with a gradient, a plain call for a backward op)."""

    registered: Any
    direct: Callable

    def __call__(self, *args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if may_trace(*tensors):
            return self.registered(*args)
        return self.direct(*args)


def _direct_function(name: str, impl: Callable[[torch.device], Callable], setup_context: Any,
                     backward: Any) -> type[torch.autograd.Function]:
    """An autograd function running ``impl(device)`` of its first tensor argument's device,
    with the registered op's ``setup_context`` and ``backward``."""

    def forward(*args: Any) -> Any:
        return impl(args[0].device)(*args)

    return type(f"Direct[{name}]", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward)})


def define(name: str, launch: Any, native_impl: Any, native: bool) -> Any:
    """Op ``name`` running the Triton ``launch`` (on CPU: ``native_impl`` when ``native``).

    Under ``TRITON_INTERPRET=1`` the kernels are plain Python that cannot be traced, so the op
    is an opaque ``custom_op`` there (compiled graphs call it and use its fake kernel).
    """
    if not HAVE_TRITON:
        return torch.library.custom_op(name, native_impl, mutates_args=(), device_types="cpu")
    interpreting = triton_interpreting()
    register = torch.library.custom_op if interpreting else torch.library.triton_op
    op = register(name, launch, mutates_args=())
    if native:
        op.register_kernel("cpu", native_impl)
        if not interpreting:
            _opaque_on_cpu(op)
    return op


def fuse(name: str, launch: Any, native_impl: Any, native: bool, *, fake: Any,
         setup_context: Any = None, backward: Any = None) -> FusedOp:
    """Op ``name`` (:func:`define`) with its ``fake`` kernel and, given ``backward``, its
    autograd (``setup_context``, ``backward``), and its direct eager route: the implementation
    the op dispatches to for a device, under the same autograd when it has one."""
    op = define(name, launch, native_impl, native)
    op.register_fake(fake)

    def impl(device: torch.device) -> Callable:
        return native_impl if device.type == "cpu" and (native or not HAVE_TRITON) else launch

    if backward is None:
        return FusedOp(op, lambda *args: impl(args[0].device)(*args))
    op.register_autograd(backward, setup_context=setup_context)
    return FusedOp(op, _direct_function(name, impl, setup_context, backward).apply)


def _opaque_on_cpu(op: Any) -> None:
    """Keep a ``triton_op`` whole for CPU tensors when torch.compile functionalizes it.

    A ``triton_op`` decomposes into its Triton kernels under ``FunctionalTensorMode`` whatever
    the device; CPU tensors run the native kernel instead, so for them the op stays one node.
    """
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    decompose = op._torch_dispatch_fns[FunctionalTensorMode]

    def dispatch(mode: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        first = args[0] if args else next(iter(kwargs.values()))
        if first.device.type == "cpu":
            return mode.__torch_dispatch__(func, types, args, kwargs)
        return decompose(mode, func, types, args, kwargs)

    op.register_torch_dispatch(FunctionalTensorMode, dispatch)


def define_with_twin(define_ops: Callable[[str, bool], dict[str, Any]]) -> dict[str, Any]:
    """The ops ``define_ops(suffix, native)`` registers, by name: the main ones (suffix ``""``,
    native on CPU when the extension is built) and their Triton twins (suffix
    :data:`TRITON_TWIN`), as far as triton and the native extension are there."""
    ops: dict[str, Any] = {}
    if HAVE_TRITON or NATIVE:
        ops.update(define_ops("", NATIVE))
    if HAVE_TRITON:
        ops.update(define_ops(TRITON_TWIN, False))
    return ops


def op_for(name: str, backend: str, device: torch.device, ops: dict[str, Any]) -> Any:
    """The op of ``ops`` (an op's registration table) that runs ``backend`` ("triton" or
    "native") for ``device`` tensors."""
    twin = backend == "triton" and device.type == "cpu"
    return ops[name + TRITON_TWIN if twin else name]
