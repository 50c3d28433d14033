"""Optimizers: Muon (``torch.optim.Muon``, batched) for hidden 2-D weights, AdamW for the rest.

Muon orthogonalises matrix updates, so it only applies to 2-D weights of hidden layers; the
input/output projections, embeddings, biases and norm gains go to AdamW, as in the official
WorldCompass code and common Muon practice. The model says which weights are hidden
(``model.hidden_matrices()``), by role rather than by parameter name.
"""

from __future__ import annotations

import copy
import functools
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import AdamW, Muon, Optimizer

# torch's own Muon learning-rate adjustment (private, pinned with torch)
from torch.optim._muon import _adjust_lr

from wc_fast.config import OptimConfig
from wc_fast.models.protocol import WorldModel

# the param-group entries of torch's Muon that :func:`grouped_muon_step` takes
MUON_HYPERPARAMETERS = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients",
                        "ns_steps", "eps", "adjust_lr_fn")


def newton_schulz(updates: Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> Tensor:
    """Orthogonalise a stack of same-shaped matrices ``[N, A, B]`` at once.

    The quintic Newton-Schulz iteration of ``torch.optim.Muon`` (bf16, each matrix scaled to
    unit Frobenius norm, wide orientation), with batched matmuls: torch's Muon runs it one
    matrix at a time (its ``foreach`` path is not implemented), and for a small model's
    192-wide matrices those separate products leave most of the machine idle.
    """
    a, b, c = coefficients
    tall = updates.size(-2) > updates.size(-1)
    x = (updates.mT if tall else updates).to(torch.bfloat16, memory_format=torch.contiguous_format)
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def grouped_muon_step(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *,
                      lr: float, weight_decay: float, momentum: float, nesterov: bool,
                      ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float,
                      adjust_lr_fn: str | None) -> None:
    """One Muon update of ``params`` in place, with Newton-Schulz batched per matrix shape.

    Momentum, Nesterov, decoupled weight decay and the learning-rate adjustment are torch's
    ``Muon``'s, so the result equals it up to bf16 rounding in the orthogonalisation.
    """
    by_shape: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(params):
        by_shape[(tuple(p.shape), p.dtype, p.device)].append(i)
    for (shape, _, _), index in by_shape.items():
        ps = [params[i] for i in index]
        gs = [grads[i] for i in index]
        ms = [bufs[i] for i in index]
        torch._foreach_lerp_(ms, gs, 1 - momentum)
        updates = torch._foreach_lerp(gs, ms, momentum) if nesterov else ms
        ortho = newton_schulz(torch.stack(updates), ns_coefficients, ns_steps, eps)
        torch._foreach_mul_(ps, 1 - lr * weight_decay)
        torch._foreach_add_(ps, [o.to(p.dtype) for o, p in zip(ortho.unbind(0), ps,
                                                                  strict=True)],
                            alpha=-_adjust_lr(lr, adjust_lr_fn, torch.Size(shape)))


class GroupedMuon(Muon):
    """``torch.optim.Muon`` with Newton-Schulz batched over matrices of the same shape.

    Same hyperparameters, state layout (checkpoints are interchangeable) and update as
    ``Muon``, up to bf16 rounding; a transformer has one matrix of each shape per block, so
    the per-shape stacks turn ``steps * 3`` small products per matrix into that many batched
    products per shape.
    """

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            self._update(params, grads, bufs, group)
        return loss

    def _update(self, params: list[Tensor], grads: list[Tensor], bufs: list[Tensor],
                group: dict) -> None:
        """Apply one group's update to ``params`` and ``bufs`` in place."""
        grouped_muon_step(params, grads, bufs, **{k: group[k] for k in MUON_HYPERPARAMETERS})


class ShardedMuon(GroupedMuon):
    """:class:`GroupedMuon` for FSDP2-sharded (DTensor) matrices, equal to it on whole ones.

    Newton-Schulz needs the whole matrix. ``Muon`` run directly on DTensors orthogonalises
    through bf16 partial sums across ranks (measured 3% off unsharded Muon on a random 192x32
    gradient, 23% on a nearly rank-4 one). Here each matrix, its gradient and its momentum are
    gathered, the grouped Muon step updates the full copies, and every rank keeps its shard of
    the result. Every rank repeats the Newton-Schulz work; the state layout is Muon's, so
    checkpoints are interchangeable. The matrices are gathered in runs of at most
    ``gather_bytes`` of whole weights (a single larger matrix alone), each run's copies freed
    before the next is gathered: gathering all at once held three whole copies of every
    matrix (WorldPlay-8B: 61 GiB per rank at its step).
    """

    gather_bytes = 2**30

    def _update(self, params: list[Tensor], grads: list[Tensor], bufs: list[Tensor],
                group: dict) -> None:
        for run in self._runs(params):
            self._update_whole([params[i] for i in run], [grads[i] for i in run],
                               [bufs[i] for i in run], group)

    def _runs(self, params: list[Tensor]) -> list[list[int]]:
        """Consecutive indices of ``params`` in runs of at most :attr:`gather_bytes` whole."""
        runs: list[list[int]] = [[]]
        size = 0
        for i, p in enumerate(params):
            nbytes = p.numel() * p.element_size()
            if runs[-1] and size + nbytes > self.gather_bytes:
                runs.append([])
                size = 0
            runs[-1].append(i)
            size += nbytes
        return [run for run in runs if run]

    def _update_whole(self, params: list[Tensor], grads: list[Tensor], bufs: list[Tensor],
                      group: dict) -> None:
        full = [[t.full_tensor() if isinstance(t, DTensor) else t.clone() for t in ts]
                for ts in (params, grads, bufs)]
        super()._update(*full, group)
        for targets, values in ((params, full[0]), (bufs, full[2])):
            for target, value in zip(targets, values, strict=True):
                target = target.detach()
                if isinstance(target, DTensor):
                    value = distribute_tensor(value, target.device_mesh, target.placements,
                                              src_data_rank=None).to_local()
                    target = target.to_local()
                target.copy_(value)


def freeze_untrained(model: WorldModel, trainable: str) -> None:
    """Turn off the gradient of every weight ``optim.trainable`` leaves out (``all``: none;
    ``conditioning``: all but ``model.conditioning_parameters()``)."""
    if trainable == "all":
        return
    if trainable != "conditioning":
        raise ValueError(f"trainable must be 'all' or 'conditioning', got {trainable!r}")
    keep = {id(p) for p in model.conditioning_parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def hold_frozen_matrices_in(model: WorldModel, dtype: torch.dtype) -> int:
    """Cast every frozen ``nn.Linear`` of the transformer blocks (``model.shard_units()``:
    their attention and MLP layers, a LoRA adapter's base layer, and in a frozen copy such as
    the KL's reference its adapters and conditioning layers too) to ``dtype``, the model's
    autocast dtype, in place; returns how many were cast.

    The blocks run under ``torch.autocast`` to ``dtype``, where a linear layer casts an fp32
    weight to ``dtype`` on every call: holding the frozen ones in ``dtype`` gives the same bits
    with half their memory (most of a LoRA run's model). Trained layers keep fp32 masters, and
    layers outside the blocks (embedders that may run outside autocast) stay as they are."""
    cast = 0
    for unit in model.shard_units():
        for module in unit.modules():
            if (isinstance(module, torch.nn.Linear) and module.weight.dtype != dtype
                    and not any(p.requires_grad for p in module.parameters(recurse=False))):
                module.to(dtype)
                cast += 1
    return cast


def frozen_copy(model: WorldModel, *, share_untrained: bool = True,
                on_meta: bool = False) -> WorldModel:
    """A copy of ``model`` that does not train (eval mode, no gradients): the old model of an
    update, the reference of a KL.

    With ``share_untrained`` it holds its own copy of only the weights ``model`` trains
    (``requires_grad``) and shares every other parameter with ``model`` (the same tensors),
    so a run that trains a subset (LoRA adapters, the conditioning pathway) keeps its frozen
    base once however many such copies it has; buffers are copied. Without it the copy is
    whole. ``on_meta`` makes every parameter and buffer a meta tensor instead (no storage):
    the structure FSDP2 shards before the copy's values are filled in shard by shard
    (:func:`wc_fast.infra.distributed.shard_frozen_copy`), so no rank holds a whole copy.
    """
    if on_meta:
        memo = {id(t): _on_meta(t) for t in (*model.parameters(), *model.buffers())}
    else:
        memo = {id(p): p for p in model.parameters() if share_untrained and not p.requires_grad}
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


def policy_copies(model: WorldModel, dtype: torch.dtype,
                  reference: Callable[[WorldModel, Callable[[WorldModel], WorldModel]],
                                      WorldModel | None],
                  *, on_meta: bool = False) -> tuple[WorldModel, WorldModel | None]:
    """The old (rollout) model and the KL's reference (``None`` without a KL) of a run that
    trains ``model``, whose untrained weights are already frozen: each a :func:`frozen_copy`
    (its own copies of the trained weights over the model's frozen ones); ``reference`` is the
    update rule's (:meth:`wc_fast.rl.updates.Update.reference`). The reference, frozen whole,
    holds its copies of the trained matrices in ``dtype`` too (:func:`hold_frozen_matrices_in`).
    ``on_meta``: structures on the meta device, which FSDP2 shards and fills shard by shard
    (:func:`wc_fast.infra.distributed.shard_frozen_copy`). One place for the trainer and the
    memory study, so the study measures what the trainer builds."""
    copy_ = functools.partial(frozen_copy, on_meta=on_meta)
    old, ref = copy_(model), reference(model, copy_)
    if ref is not None and not on_meta:
        hold_frozen_matrices_in(ref, dtype)
    return old, ref


def _on_meta(t: Tensor) -> Tensor:
    empty = torch.empty_like(t, device="meta")
    return torch.nn.Parameter(empty, requires_grad=False) if isinstance(t, torch.nn.Parameter) \
        else empty


def build_optimizers(model: WorldModel, cfg: OptimConfig, *, grouped: bool = True
                     ) -> list[Optimizer]:
    """``[Muon, AdamW]`` (``muon``) or ``[AdamW]`` (``adamw``).

    The Muon is :class:`GroupedMuon` (:class:`ShardedMuon` for DTensor weights); ``grouped=False``
    takes torch's one-matrix-at-a-time ``Muon`` instead, as the official code does.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return [AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)]
    hidden = {id(p) for p in model.hidden_matrices()}
    matrices = [p for p in params if id(p) in hidden]
    rest = [p for p in params if id(p) not in hidden]
    optimizers: list[Optimizer] = []
    if matrices:
        if any(isinstance(p, DTensor) for p in matrices):
            muon = ShardedMuon
        else:
            muon = GroupedMuon if grouped else Muon
        optimizers.append(muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay,
                               adjust_lr_fn="match_rms_adamw"))
    if rest:
        optimizers.append(AdamW(rest, lr=cfg.lr, weight_decay=cfg.weight_decay))
    return optimizers
