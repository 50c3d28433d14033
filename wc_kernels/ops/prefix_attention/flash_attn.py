"""Partial attentions from the ``flash-attn`` library (CUDA, fp16/bf16) for the split path.

``flash_attn_func(..., return_attn_probs=True)`` gives the output and its natural-log LSE; the
library's backward ``_flash_attn_backward`` recomputes the probabilities from the ``out`` and
``lse`` it is handed, so passing the MERGED ones gives the exact gradient of the merged
attention (see :mod:`wc_kernels.ops.prefix_attention.split`). The backward's keyword arguments
changed across flash-attn 2.x (``window_size`` became ``window_size_left/right``, ``softcap``
appeared), so they are matched by name against the installed version.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

# defaults meaning "plain non-causal attention without dropout" for every keyword the
# backward has had in flash-attn 2.x
_BACKWARD_DEFAULTS = {"dropout_p": 0.0, "causal": False, "window_size": (-1, -1),
                      "window_size_left": -1, "window_size_right": -1, "softcap": 0.0,
                      "alibi_slopes": None, "deterministic": False, "rng_state": None}


def _parameter_names(fn) -> tuple[str, ...]:
    """Argument names of a Python function or of a ``torch.library`` op."""
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return tuple(a.name for a in fn.default._schema.arguments)


class FlashAttnKernels:
    """:class:`wc_kernels.ops.prefix_attention.split.PartialKernels` over ``flash_attn``
    (``[B, L, H, D]``)."""

    def __init__(self, interface) -> None:
        self.interface = interface
        names = _parameter_names(interface._flash_attn_backward)
        self.backward_options = {k: v for k, v in _BACKWARD_DEFAULTS.items() if k in names}

    def forward(self, q: Tensor, k: Tensor, v: Tensor, scale: float
                ) -> tuple[Tensor, Tensor, tuple]:
        out, lse, _ = self.interface.flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
            return_attn_probs=True)
        return out.transpose(1, 2), lse[..., :q.shape[2]], ()

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor, aux: tuple, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        grads = [torch.empty_like(t) for t in (qt, kt, vt)]
        self.interface._flash_attn_backward(
            grad_out.transpose(1, 2), qt, kt, vt, out.transpose(1, 2),
            lse.to(torch.float32).contiguous(), *grads, softmax_scale=scale,
            **self.backward_options)
        return tuple(g.transpose(1, 2) for g in grads)

    def prefix_groups(self, b: int, h: int, p: int, device: torch.device) -> int:
        return 1


@functools.cache
def flash_attn_kernels() -> FlashAttnKernels:
    from flash_attn import flash_attn_interface

    return FlashAttnKernels(flash_attn_interface)
