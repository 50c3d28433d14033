"""Motion latents: three noise directions carry a clip's speed, turn rate and onset."""

import pytest
import torch

from wc_fast import world
from wc_fast.config import preset
from wc_fast.models import TinyWorldDiT
from wc_fast.models.motion_latent import (
    FACTOR_RANGES,
    LATENTS,
    factor_latents,
    noise_latents,
    with_latents,
)
from wc_fast.pretrain import flow_matching_loss


def test_with_latents_sets_the_latent_elements_and_keeps_the_rest():
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(5, 4, 3, 8, 8, generator=gen, dtype=torch.float64)
    want = torch.randn(5, LATENTS, generator=gen, dtype=torch.float64)
    out = with_latents(noise, want)
    torch.testing.assert_close(noise_latents(out), want)
    changed = (out != noise).any(dim=0)
    assert changed.sum() == LATENTS and changed[0, :, 0, 0].all()
    with pytest.raises(ValueError, match="C >= 3"):
        noise_latents(torch.zeros(2, 4, 1, 8, 8))


def test_uniform_factors_give_standard_normal_latents():
    gen = torch.Generator().manual_seed(1)
    lo = torch.tensor([r[0] for r in FACTOR_RANGES])
    hi = torch.tensor([r[1] for r in FACTOR_RANGES])
    factors = lo + (hi - lo) * torch.rand(20000, 3, generator=gen)
    g = factor_latents(factors)
    assert g.mean(0).abs().max() < 0.05 and (g.std(0) - 1).abs().max() < 0.05
    # monotone: a faster clip has a larger latent
    assert bool((factor_latents(lo[None] + 0.3 * (hi - lo)) <
                 factor_latents(lo[None] + 0.6 * (hi - lo))).all())
    # the noise of a standard normal clip projects to a standard normal as well
    proj = noise_latents(torch.randn(4000, 4, 3, 8, 8, generator=gen))
    assert proj.mean(0).abs().max() < 0.06 and (proj.std(0) - 1).abs().max() < 0.06


def test_world_reports_the_factors_it_drew():
    seq = world.sample_sequences(4, num_clips=2, seed=3)
    assert seq.motion_factors.shape == (4, 2, 3)
    for k, (lo, hi) in enumerate(FACTOR_RANGES):
        assert float(seq.motion_factors[..., k].min()) >= lo - 1e-6
        assert float(seq.motion_factors[..., k].max()) <= hi + 1e-6


def test_a_motion_latent_model_needs_the_factors():
    cfg = preset("smoke").model
    cfg.motion_latent = True
    model = TinyWorldDiT(cfg)
    seq = world.sample_sequences(2, num_clips=2, seed=3, resolution=cfg.resolution,
                                 clip_frames=cfg.clip_frames)
    gen = torch.Generator().manual_seed(0)
    loss = flow_matching_loss(model, seq.frames, seq.actions, shift=5.0, gen=gen,
                              motion_factors=seq.motion_factors)
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="motion_factors"):
        flow_matching_loss(model, seq.frames, seq.actions, shift=5.0, gen=gen)
