"""``std="global"`` across ranks equals the single-process computation over all groups."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from wc_fast.nft import group_advantages

SCORES = torch.tensor([[0.0, 2.0, 5.0], [10.0, 14.0, 11.0]], dtype=torch.float64)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        local = SCORES[rank : rank + 1]
        results[rank] = group_advantages(local, std="global", process_group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def test_two_rank_global_std_equals_single_process():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(2, _free_port(), results), nprocs=2, join=True)
    gathered = torch.cat([results[0], results[1]])
    torch.testing.assert_close(gathered, group_advantages(SCORES, std="global"))
