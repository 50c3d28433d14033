"""Drop-in ops for video-RL training: ``nft_loss``, ``flow_noise``, ``prefix_attention``.

Each op has a plain-PyTorch reference in :mod:`kernels.reference` (the spec) and fast backends
chosen with ``backend=`` (see :mod:`kernels._backend`). This package imports nothing from
``wc_fast``.
"""

from kernels.flow_noise import flow_noise
from kernels.nft_loss import nft_loss
from kernels.prefix_attention import prefix_attention

__all__ = ["nft_loss", "flow_noise", "prefix_attention"]
