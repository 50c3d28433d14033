"""``std="global"`` across ranks equals the single-process computation over all groups."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import spawn_ranks

from wc_fast.rl.advantages import group_advantages

SCORES = torch.tensor([[0.0, 2.0, 5.0], [10.0, 14.0, 11.0]], dtype=torch.float64)


def _worker(rank: int, results) -> None:
    local = SCORES[rank : rank + 1]
    results[rank] = group_advantages(local, std="global", process_group=dist.group.WORLD)


def test_two_rank_global_std_equals_single_process(tmp_path):
    manager = mp.Manager()
    results = manager.dict()
    spawn_ranks(_worker, (results,), tmp_path)
    gathered = torch.cat([results[0], results[1]])
    torch.testing.assert_close(gathered, group_advantages(SCORES, std="global"))
