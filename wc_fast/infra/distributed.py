"""Process-group setup for ``torchrun`` (NCCL on GPUs, gloo on CPUs) and FSDP2 sharding."""

from __future__ import annotations

import datetime
import os
import warnings
from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor


@dataclass(slots=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    group: dist.ProcessGroup | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env(device_kind: str, timeout_s: float | None = None) -> DistInfo:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1), else a single rank.
    ``timeout_s``: how long a collective may wait for a peer before it fails (the backend's
    default when ``None``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo(0, 1, 0, None)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            # torchrun's agent serves one store to every attempt of the job: without a prefix
            # per attempt, a restarted rank reads the addresses its peers published in the
            # previous attempt and connects to ports no one listens on ("Connection refused")
            store, rank, world = next(dist.rendezvous(
                "env://", **({} if timeout is None else {"timeout": timeout})))
            dist.init_process_group(backend, store=dist.PrefixStore(f"attempt_{attempt}", store),
                                    rank=rank, world_size=world, timeout=timeout)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dist.group.WORLD)


def shutdown(info: DistInfo) -> None:
    """Leave the process group once every rank is done with it.

    The barrier matters: a gloo rank that destroys its group while a peer's last collective is
    still in flight can abort at exit ("terminate called without an active exception").
    """
    if info.world_size > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# Forward-like methods of both world models (TinyWorldDiT, WanWorldModel): FSDP2 gathers the
# parameters around these as it does around ``forward``.
FSDP_FORWARD_METHODS = ("velocity", "extend_cache", "teacher_forced_velocity",
                        "build_cache_parallel")


def shard_model(model: nn.Module, group: dist.ProcessGroup, device_type: str, *,
                mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard ``model`` across the ranks of ``group`` with FSDP2 (``fully_shard``), in place
    (``mesh``: the group's device mesh, when the caller has made it).

    Each of ``model.shard_units()`` (the transformer blocks, or their parts) is its own unit
    and the root holds the rest. The root's parameters are also
    resharded after every forward: the old model only ever runs without gradient, so no
    backward would reshard them. Gradients are summed, not averaged, over ranks: the trainer
    already divides each rank's loss by the global item count, exactly as the DDP path does.
    """
    # a block returns its keys/values (views) for the context cache, which only ever
    # concatenates them, never writes them in place: FSDP2's warning about views is moot here
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = DeviceMesh.from_group(group, device_type) if mesh is None else mesh
    for unit in model.shard_units():
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    for name in FSDP_FORWARD_METHODS:
        register_fsdp_forward_method(model, name)
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            # these settings are per unit, not inherited from the root
            unit.set_gradient_divide_factor(1.0)
            # gloo has no pre-multiplied sum; a plain sum is the same reduction at factor 1
            unit.set_force_sum_reduction_for_comms(True)
    return model


def shard_frozen_copy(structure: nn.Module, model: nn.Module, group: dist.ProcessGroup,
                      device: torch.device, *, mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard ``structure`` (a frozen copy of ``model`` made on the meta device before ``model``
    was sharded, :func:`wc_fast.rl.optim.frozen_copy` with ``on_meta``) as ``model`` is sharded,
    allocate only this rank's shards on ``device`` and fill them, and its buffers, from
    ``model``'s: the old and reference models of a sharded run without a whole copy on any rank
    (whole copies made before sharding would double a rank's setup peak)."""
    shard_model(structure, group, device.type, mesh=mesh)
    structure.to_empty(device=device)
    with torch.no_grad():
        for mine, theirs in zip(structure.parameters(), model.parameters(), strict=True):
            _local(mine).copy_(_local(theirs))
        for mine, theirs in zip(structure.buffers(), model.buffers(), strict=True):
            mine.copy_(theirs)
    return structure


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def full_state_dict(model: nn.Module, keys: Collection[str] | None = None
                    ) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors; with ``keys``, only those state-dict
    entries (copied alone, unless the model is sharded).

    For an FSDP2 model this is a collective (every rank must call it) and only rank 0 gets the
    tensors; the others get an empty dict.
    """
    if is_sharded(model):
        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
        return weights if keys is None else {k: v for k, v in weights.items() if k in keys}
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
            if keys is None or k in keys}


def load_full_state_dict(model: nn.Module, weights: dict[str, torch.Tensor], *,
                         partial: bool = False) -> None:
    """Load whole-model weights (as :func:`full_state_dict` returns them) on every rank.

    ``partial``: ``weights`` may leave out some of the model's entries, which keep their values;
    it may still hold none the model lacks (``RuntimeError`` naming them).
    """
    if is_sharded(model):
        result = set_model_state_dict(model, weights, options=StateDictOptions(
            full_state_dict=True, strict=not partial))
    else:
        device = next(model.parameters()).device
        result = model.load_state_dict({k: v.to(device) for k, v in weights.items()},
                                       strict=not partial)
    if result.unexpected_keys:
        raise RuntimeError(f"weights the model lacks: {sorted(result.unexpected_keys)[:8]}")


def optimizer_state(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> object:
    """The optimizers' state for a checkpoint: their ``state_dict()`` list, or for an FSDP2
    model one full (unsharded) state keyed by parameter name (a collective; rank 0 gets it)."""
    if is_sharded(model):
        return get_optimizer_state_dict(model, optimizers, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
    return [opt.state_dict() for opt in optimizers]


def load_optimizer_state(model: nn.Module, optimizers: list[torch.optim.Optimizer],
                         state: object) -> None:
    """Restore what :func:`optimizer_state` returned, on every rank."""
    if is_sharded(model):
        set_optimizer_state_dict(model, optimizers, state,
                                 options=StateDictOptions(full_state_dict=True))
        return
    for opt, saved in zip(optimizers, state, strict=True):
        opt.load_state_dict(saved)
