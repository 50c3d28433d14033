"""GroupedMuon (Newton-Schulz batched per matrix shape) against torch's one-at-a-time Muon."""

import pytest
import torch
from torch.optim import Muon

from wc_fast.config import preset
from wc_fast.models import TinyWorldDiT
from wc_fast.rl.optim import GroupedMuon, build_optimizers, newton_schulz


def _params(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]


def _grads(shapes, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=gen) for s in shapes] for _ in range(steps)]


# repeated shapes (batched), a tall and a wide matrix, a lone shape
SHAPES = [(48, 80), (48, 80), (48, 80), (96, 24), (96, 24), (7, 13)]


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_grouped_muon_matches_torch_muon(nesterov, adjust):
    ours, theirs = _params(SHAPES), _params(SHAPES)
    kw = dict(lr=0.02, weight_decay=0.05, nesterov=nesterov, adjust_lr_fn=adjust)
    opt_ours, opt_theirs = GroupedMuon(ours, **kw), Muon(theirs, **kw)
    start = [p.detach().clone() for p in theirs]
    for grads in _grads(SHAPES, 3):
        for p, q, g in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        opt_ours.step()
        opt_theirs.step()
    for p, q, s in zip(ours, theirs, start, strict=True):
        moved = (q.detach() - s).norm()
        assert moved > 0
        # both orthogonalise in bf16; batched products round differently
        assert (p.detach() - q.detach()).norm() < 2e-2 * moved
        torch.testing.assert_close(opt_ours.state[p]["momentum_buffer"],
                                   opt_theirs.state[q]["momentum_buffer"])


def test_newton_schulz_batch_equals_one_matrix_at_a_time():
    gen = torch.Generator().manual_seed(2)
    stack = torch.randn(5, 40, 24, generator=gen)
    coeffs = (3.4445, -4.7750, 2.0315)
    batched = newton_schulz(stack, coeffs, 5, 1e-7)
    for i in range(5):
        single = newton_schulz(stack[i:i + 1], coeffs, 5, 1e-7)[0]
        torch.testing.assert_close(batched[i], single, atol=2e-2, rtol=0)
    # orthogonalised: singular values near 1 (the quintic iteration leaves them in ~[0.7, 1.2])
    sv = torch.linalg.svdvals(batched.float())
    assert sv.min() > 0.5 and sv.max() < 1.5


def test_grouped_muon_state_loads_into_torch_muon():
    ours, theirs = _params(SHAPES), _params(SHAPES)
    opt = GroupedMuon(ours, lr=0.02)
    for p, g in zip(ours, _grads(SHAPES, 1)[0], strict=True):
        p.grad = g
    opt.step()
    other = Muon(theirs, lr=0.02)
    other.load_state_dict(opt.state_dict())
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(other.state[q]["momentum_buffer"],
                                   opt.state[p]["momentum_buffer"], rtol=0, atol=0)


def test_grouped_muon_rejects_a_vector():
    param = torch.nn.Parameter(torch.zeros(5))
    # refused at construction, by torch's Muon checks
    with pytest.raises(ValueError, match="2D parameters"):
        GroupedMuon([param], lr=0.1)


def test_build_optimizers_picks_grouped_or_torch_muon():
    model = TinyWorldDiT(preset("smoke").model)
    cfg = preset("smoke").optim
    assert type(build_optimizers(model, cfg)[0]) is GroupedMuon
    assert type(build_optimizers(model, cfg, grouped=False)[0]) is Muon


def test_muon_takes_exactly_the_hidden_matrices():
    """Parameter groups by role: the key embedding, the patch projection and every output
    head (including the affine flow head of a warp model) go to AdamW."""
    cfg = preset("cpu")
    cfg.optim.trainable = "all"
    model = TinyWorldDiT(cfg.model)
    muon, adamw = build_optimizers(model, cfg.optim)
    in_muon = {id(p) for group in muon.param_groups for p in group["params"]}
    in_adamw = {id(p) for group in adamw.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    for name in ("affine_flow.weight", "pose_flow.weight", "out.weight",
                 "final_modulation.weight", "key_embed.weight", "patch_embed.weight"):
        assert id(named[name]) in in_adamw, name
    assert id(named["blocks.0.attn.qkv.weight"]) in in_muon
    assert in_muon | in_adamw == {id(p) for p in model.parameters()}
    assert not in_muon & in_adamw


def test_adamw_only_needs_no_hidden_matrices():
    cfg = preset("smoke").optim
    cfg.optimizer = "adamw"
    assert len(build_optimizers(torch.nn.Linear(3, 3), cfg)) == 1
