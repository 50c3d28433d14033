"""Drop-in ops for video-RL training: ``nft_loss``, ``flow_noise``, ``prefix_attention``,
``grpo_sde_loss`` and ``sde_log_prob``; DiffusionNFT's and the official WorldCompass code's
losses through ``nft_loss`` (``diffusion_nft_loss``, ``worldcompass_nft_loss``, in
:mod:`wc_kernels.adapters`).

The import name is ``wc_kernels``; this folder, ``kernels/``, is its source, which the build
maps to that name (``setup.py``). The folder's own name is not an import name: ``kernels`` is
also a PyPI package (the hub kernel loader that diffusers and transformers use), so a package
of that name would shadow it or be shadowed by it. Imported as anything but ``wc_kernels`` (as
``kernels``, with a checkout's root on ``sys.path``) this package is inert: it registers no
``torch.library`` op (that would register each twice), has no submodules, and every attribute
lookup raises AttributeError naming ``wc_kernels``. Inert rather than an ImportError because
libraries probe for the PyPI package by importing it (transformers reads ``kernels.__version__``
whenever the name is found on the path): they then see no usable ``kernels``, and a run
started from a checkout's root keeps working.

Each op has a plain-PyTorch reference in :mod:`wc_kernels.reference` (the spec) and fast backends
chosen with ``backend=`` (see :mod:`wc_kernels._backend`). This package imports nothing from
``wc_fast``.

Each op is a subpackage of :mod:`wc_kernels.ops` named after it, ``kernels/ops/<op>/``: the
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

_NOT_THIS_NAME = (
    f"{__path__[0]} is the source of wc_fast's ops package, whose import name is wc_kernels, "
    f"not {__name__!r}: import wc_kernels instead (pip install -e . maps the folder to that "
    f"name). If you meant the PyPI package {__name__!r}: this folder shadows it because its "
    f"parent directory is on sys.path (python -c and python -m put the current directory "
    f"there); run from another directory.")

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


if __name__ == "wc_kernels":
    check_torch_version(torch.__version__)

    from wc_kernels.adapters import (
        advantages_to_optimality,
        diffusion_nft_loss,
        worldcompass_nft_loss,
    )
    from wc_kernels.ops.flow_noise import flow_noise
    from wc_kernels.ops.grpo_sde_loss import grpo_sde_loss, sde_log_prob
    from wc_kernels.ops.nft_loss import nft_loss
    from wc_kernels.ops.prefix_attention import prefix_attention

    __all__ = ["nft_loss", "flow_noise", "prefix_attention", "grpo_sde_loss", "sde_log_prob",
               "diffusion_nft_loss", "worldcompass_nft_loss", "advantages_to_optimality"]
else:
    __path__ = []  # no submodule under this name: importing one would register its ops twice

    def __getattr__(name: str) -> None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: {_NOT_THIS_NAME}",
                             name=name)
