"""Run a function on several gloo ranks in spawned processes, without port races.

Ranks meet through a ``file://`` rendezvous in the test's temporary directory (no port is
bound, released and later reused), and each rank ends with a barrier before
``destroy_process_group``: a rank that tears gloo down while its peer still has collectives in
flight can abort at exit ("terminate called without an active exception"). A rank that
finished cleanly then leaves with ``os._exit(0)``: gloo's worker threads can still be alive
when the interpreter finalizes, and destroying them there aborts the process (SIGABRT) after
every check has passed, which made a passing test fail about once in a few hundred runs.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_rendezvous_ids = itertools.count()


def spawn_ranks(fn: Callable[..., None], args: tuple, tmp_path: Path, world: int = 2) -> None:
    """Call ``fn(rank, *args)`` on ``world`` gloo ranks; raises if any rank fails."""
    store = tmp_path / f"rendezvous-{os.getpid()}-{next(_rendezvous_ids)}"
    mp.spawn(_rank_entry, args=(fn, world, str(store), args), nprocs=world, join=True)


def _rank_entry(rank: int, fn: Callable[..., None], world: int, store: str, args: tuple) -> None:
    os.environ.update({"WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        fn(rank, *args)
    finally:
        if dist.is_initialized():
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
