"""Optimizers: ``torch.optim.Muon`` for hidden 2-D weights, AdamW for everything else.

Muon orthogonalises matrix updates, so it only applies to 2-D weights of hidden layers; the
input/output projections, embeddings, biases and norm gains go to AdamW, as in the official
WorldCompass code and common Muon practice.
"""

from __future__ import annotations

from torch import nn
from torch.optim import AdamW, Muon, Optimizer

from wc_fast.config import OptimConfig

ADAMW_ONLY = ("patch_embed", "action_embed", "out.", "final_modulation")


def uses_muon(name: str, param: nn.Parameter) -> bool:
    """A hidden 2-D weight (not an embedding, the input patch projection or the output head)."""
    return param.ndim == 2 and not any(name.startswith(prefix) for prefix in ADAMW_ONLY)


def build_optimizers(model: nn.Module, cfg: OptimConfig) -> list[Optimizer]:
    """``[Muon, AdamW]`` (``muon``, ``muon_adamw``) or ``[AdamW]`` (``adamw``)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return [AdamW([p for _, p in named], lr=cfg.lr, weight_decay=cfg.weight_decay)]
    matrices = [p for n, p in named if uses_muon(n, p)]
    rest = [p for n, p in named if not uses_muon(n, p)]
    optimizers: list[Optimizer] = []
    if matrices:
        optimizers.append(Muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay,
                               adjust_lr_fn="match_rms_adamw"))
    if rest:
        optimizers.append(AdamW(rest, lr=cfg.lr, weight_decay=cfg.weight_decay))
    return optimizers
