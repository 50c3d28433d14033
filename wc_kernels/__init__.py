"""Drop-in ops for video-RL training: ``nft_loss``, ``flow_noise``, ``prefix_attention``,
``grpo_sde_loss`` and ``sde_log_prob``; DiffusionNFT's and the official WorldCompass code's
losses through ``nft_loss`` (``diffusion_nft_loss``, ``worldcompass_nft_loss``, in
:mod:`wc_kernels.adapters`).

Each op has a plain-PyTorch reference in :mod:`wc_kernels.reference` (the spec) and fast backends
chosen with ``backend=`` (see :mod:`wc_kernels._backend`). This package imports nothing from
``wc_fast``.

Each op is a subpackage of :mod:`wc_kernels.ops` named after it, ``wc_kernels/ops/<op>/``: the
public function (its ``__init__``), its reference (``naive``), its Triton kernels (``triton``),
its native binding (``native``), its ``torch.library`` registration (``library``) and, for
``prefix_attention``, the attention library backends (``split``, ``flex``, ``flash_attn``,
``xformers``). The function is exported here (``wc_kernels.nft_loss``) and the modules live
under ``ops``, so neither hides the other: ``import wc_kernels.ops.nft_loss.naive`` works.

Needs torch >= 2.11 (the floor in ``pyproject.toml``: the oldest torch tested, the GPU
image's); an older torch fails here, at import, with both versions named.
"""

import re

import torch

TORCH_MIN = (2, 11)


def check_torch_version(version: str) -> None:
    """Raise ImportError if ``version`` (a ``torch.__version__``) is below :data:`TORCH_MIN`;
    pre-releases and local builds of the floor itself (``2.11.0a0+git...``) pass."""
    parts = re.match(r"(\d+)\.(\d+)", version)
    if parts is None or (int(parts[1]), int(parts[2])) < TORCH_MIN:
        need = ".".join(map(str, TORCH_MIN))
        raise ImportError(f"wc_kernels (wc_fast) needs torch >= {need}, the oldest version it is "
                          f"tested with; installed: torch {version}. Upgrade with "
                          f'pip install "torch>={need}"')


check_torch_version(torch.__version__)

from wc_kernels.adapters import (  # noqa: E402 - after the version check, which names the fix
    advantages_to_optimality,
    diffusion_nft_loss,
    worldcompass_nft_loss,
)
from wc_kernels.ops.flow_noise import flow_noise  # noqa: E402
from wc_kernels.ops.grpo_sde_loss import grpo_sde_loss, sde_log_prob  # noqa: E402
from wc_kernels.ops.nft_loss import nft_loss  # noqa: E402
from wc_kernels.ops.prefix_attention import prefix_attention  # noqa: E402

__all__ = ["nft_loss", "flow_noise", "prefix_attention", "grpo_sde_loss", "sde_log_prob",
           "diffusion_nft_loss", "worldcompass_nft_loss", "advantages_to_optimality"]
