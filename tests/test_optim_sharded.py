"""ShardedMuon on FSDP2-style sharded matrices equals torch's Muon on the whole matrix."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.optim import Muon


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gradients() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    # nearly rank 4: Newton-Schulz amplifies the small directions, so partial-sum rounding
    # across ranks would show
    return [torch.randn(97, 4, generator=gen) @ torch.randn(4, 33, generator=gen)
            + 1e-4 * torch.randn(97, 33, generator=gen) for _ in range(3)]


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from wc_fast.optim import ShardedMuon

    mesh = init_device_mesh("cpu", (2,))
    start = torch.randn(97, 33, generator=torch.Generator().manual_seed(1))
    param = torch.nn.Parameter(distribute_tensor(start, mesh, [Shard(0)]))
    opt = ShardedMuon([param], lr=0.05, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    for grad in _gradients():
        param.grad = distribute_tensor(grad, mesh, [Shard(0)])
        opt.step()
    result = param.detach().full_tensor()
    momentum = opt.state[param]["momentum_buffer"].full_tensor()
    if rank == 0:
        torch.save({"param": result, "momentum": momentum}, out)
    dist.destroy_process_group()


def test_sharded_muon_equals_muon_on_the_whole_matrix(tmp_path):
    out = str(tmp_path / "sharded.pt")
    mp.spawn(_rank, args=(_free_port(), out), nprocs=2, join=True)
    sharded = torch.load(out)
    param = torch.nn.Parameter(torch.randn(97, 33, generator=torch.Generator().manual_seed(1)))
    opt = Muon([param], lr=0.05, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    for grad in _gradients():
        param.grad = grad
        opt.step()
    torch.testing.assert_close(sharded["param"], param.detach(), rtol=0, atol=0)
    torch.testing.assert_close(sharded["momentum"], opt.state[param]["momentum_buffer"],
                               rtol=0, atol=0)
