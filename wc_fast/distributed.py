"""Process-group setup for ``torchrun``: NCCL on GPUs, gloo on CPUs."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(slots=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    group: dist.ProcessGroup | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env(device_kind: str) -> DistInfo:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1), else a single rank."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo(0, 1, 0, None)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dist.group.WORLD)


def shutdown(info: DistInfo) -> None:
    if info.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
