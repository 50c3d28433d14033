"""Optimizers: ``torch.optim.Muon`` for hidden 2-D weights, AdamW for everything else.

Muon orthogonalises matrix updates, so it only applies to 2-D weights of hidden layers; the
input/output projections, embeddings, biases and norm gains go to AdamW, as in the official
WorldCompass code and common Muon practice.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import AdamW, Muon, Optimizer

# torch's own Muon math for one tensor (private, pinned with torch): ShardedMuon reuses it
# rather than restating the Newton-Schulz step
from torch.optim._muon import _single_tensor_muon

from wc_fast.config import OptimConfig

ADAMW_ONLY = ("patch_embed", "action_embed", "out.", "final_modulation")


def uses_muon(name: str, param: nn.Parameter) -> bool:
    """A hidden 2-D weight (not an embedding, the input patch projection or the output head)."""
    return param.ndim == 2 and not any(name.startswith(prefix) for prefix in ADAMW_ONLY)


class ShardedMuon(Muon):
    """``torch.optim.Muon`` for FSDP2-sharded (DTensor) matrices, equal to unsharded Muon.

    Newton-Schulz needs the whole matrix. ``Muon`` run directly on DTensors orthogonalises
    through bf16 partial sums across ranks (measured 3% off unsharded Muon on a random 192x32
    gradient, 23% on a nearly rank-4 one). Here each matrix, its gradient and its momentum are
    gathered, torch's own single-tensor Muon step updates the full copies, and every rank
    keeps its shard of the result. Every rank repeats the Newton-Schulz work; the state layout
    is Muon's, so checkpoints are interchangeable.
    """

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                full = [t.full_tensor() if isinstance(t, DTensor) else t.clone()
                        for t in (p.detach(), p.grad, buf)]
                _single_tensor_muon([full[0]], [full[1]], [full[2]], lr=group["lr"],
                                    weight_decay=group["weight_decay"],
                                    momentum=group["momentum"], nesterov=group["nesterov"],
                                    ns_coefficients=group["ns_coefficients"],
                                    ns_steps=group["ns_steps"], eps=group["eps"],
                                    adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
                for target, value in ((p.detach(), full[0]), (buf, full[2])):
                    if isinstance(target, DTensor):
                        value = distribute_tensor(value, target.device_mesh, target.placements,
                                                  src_data_rank=None).to_local()
                        target = target.to_local()
                    target.copy_(value)
        return loss


def build_optimizers(model: nn.Module, cfg: OptimConfig) -> list[Optimizer]:
    """``[Muon, AdamW]`` (``muon``, ``muon_adamw``) or ``[AdamW]`` (``adamw``)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return [AdamW([p for _, p in named], lr=cfg.lr, weight_decay=cfg.weight_decay)]
    matrices = [p for n, p in named if uses_muon(n, p)]
    rest = [p for n, p in named if not uses_muon(n, p)]
    optimizers: list[Optimizer] = []
    if matrices:
        muon = ShardedMuon if any(isinstance(p, DTensor) for p in matrices) else Muon
        optimizers.append(muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay,
                               adjust_lr_fn="match_rms_adamw"))
    if rest:
        optimizers.append(AdamW(rest, lr=cfg.lr, weight_decay=cfg.weight_decay))
    return optimizers
