"""A competent batched eager RL iteration: the baseline a reviewer accepts for our trainer.

What a careful PyTorch user writes without this project's kernels: the same
:class:`~wc_fast.rl.trainer.Trainer` loop (all G candidates in one batch per sampler step, the
old model resident on the device, the update in micro-batches), but

- attention through ``F.scaled_dot_product_attention`` over the history copied for every
  candidate (``prefix_attention`` backend ``replicated``), not one shared copy;
- the NFT loss, flow noising and GRPO's loss as their plain-PyTorch references (no custom op);
- the sampler loop run eagerly (no CUDA graph), ``torch.compile`` off.

:func:`batched_eager_trainer` builds it; :func:`plain_pytorch_ops` is the context its
iterations run in (it points the update rules at the reference ops).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator

import torch

from wc_fast.config import Config
from wc_fast.models import FrameCodec, WorldModel
from wc_fast.rl.trainer import Trainer
from wc_fast.rl.updates import grpo as grpo_rule
from wc_fast.rl.updates import nft as nft_rule

# the ops each update rule calls, by module
_OPS = {nft_rule: ("nft_loss", "flow_noise"), grpo_rule: ("grpo_sde_loss", "sde_log_prob")}


def batched_eager_trainer(cfg: Config, model: WorldModel, device: torch.device,
                          codec: FrameCodec | None = None) -> Trainer:
    """The baseline's trainer: ``cfg`` with eager sampling and no compile, ``model`` with
    replicated-prefix SDPA attention, ``codec`` as :class:`~wc_fast.rl.trainer.Trainer` takes it
    (a Wan model's VAE) (run its iterations under :func:`plain_pytorch_ops`)."""
    cfg = copy.deepcopy(cfg)
    cfg.rollout.capture = "eager"
    cfg.update.compile = False
    model.attention_backend = "replicated"
    return Trainer(cfg, model, device, codec=codec)


@contextlib.contextmanager
def plain_pytorch_ops() -> Iterator[None]:
    """The update rules' fused ops replaced by their references while active."""
    saved = {(module, name): getattr(module, name) for module, names in _OPS.items()
             for name in names}
    try:
        for (module, name), op in saved.items():
            setattr(module, name, functools.partial(op, backend="reference"))
        yield
    finally:
        for (module, name), op in saved.items():
            setattr(module, name, op)
