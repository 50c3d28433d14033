"""ShardedMuon on FSDP2-style sharded matrices equals GroupedMuon on the whole matrices."""

import pytest
import torch
from gloo_ranks import spawn_ranks

from wc_fast.rl.optim import GroupedMuon

SHAPES = [(97, 33), (97, 33), (40, 33)]  # a batched pair and a lone matrix


def _gradients() -> list[list[torch.Tensor]]:
    """Three steps of gradients for the matrices of ``SHAPES``."""
    gen = torch.Generator().manual_seed(0)
    # nearly rank 4: Newton-Schulz amplifies the small directions, so partial-sum rounding
    # across ranks would show
    return [[torch.randn(m, 4, generator=gen) @ torch.randn(4, n, generator=gen)
             + 1e-4 * torch.randn(m, n, generator=gen) for m, n in SHAPES] for _ in range(3)]


def _starts() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(*shape, generator=gen) for shape in SHAPES]


def _rank(rank: int, out: str, gather_bytes: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from wc_fast.rl.optim import ShardedMuon

    mesh = init_device_mesh("cpu", (2,))
    params = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) for t in _starts()]
    opt = ShardedMuon(params, lr=0.05, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    opt.gather_bytes = gather_bytes
    for grads in _gradients():
        for param, grad in zip(params, grads, strict=True):
            param.grad = distribute_tensor(grad, mesh, [Shard(0)])
        opt.step()
    result = [p.detach().full_tensor() for p in params]
    momentum = [opt.state[p]["momentum_buffer"].full_tensor() for p in params]
    if rank == 0:
        torch.save({"params": result, "momentum": momentum}, out)


@pytest.mark.parametrize("gather_bytes", [2**30, 97 * 33 * 4])
def test_sharded_muon_equals_grouped_muon_on_the_whole_matrices(tmp_path, gather_bytes):
    """All matrices gathered at once, or one at a time (the batched pair split)."""
    out = str(tmp_path / "sharded.pt")
    spawn_ranks(_rank, (out, gather_bytes), tmp_path)
    sharded = torch.load(out)
    params = [torch.nn.Parameter(t) for t in _starts()]
    opt = GroupedMuon(params, lr=0.05, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    for grads in _gradients():
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad
        opt.step()
    for i, param in enumerate(params):
        torch.testing.assert_close(sharded["params"][i], param.detach(), rtol=0, atol=0)
        torch.testing.assert_close(sharded["momentum"][i], opt.state[param]["momentum_buffer"],
                                   rtol=0, atol=0)


def test_sharded_muon_gathers_runs_of_at_most_gather_bytes():
    from wc_fast.rl.optim import ShardedMuon

    params = [torch.nn.Parameter(torch.zeros(*shape)) for shape in SHAPES]
    opt = ShardedMuon(params, lr=0.05)
    assert opt._runs(params) == [[0, 1, 2]]
    opt.gather_bytes = 2 * 97 * 33 * 4
    assert opt._runs(params) == [[0, 1], [2]]
    opt.gather_bytes = 1  # a matrix larger than the budget goes alone
    assert opt._runs(params) == [[0], [1], [2]]
