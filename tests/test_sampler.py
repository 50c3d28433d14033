"""The clip sampler: exact integration, replay by noise, SDE variant, compiled and graph paths."""

import dataclasses

import pytest
import torch
from torch import nn

from wc_fast.config import ModelConfig
from wc_fast.models import ContextCache, TinyWorldDiT
from wc_fast.models.tiny.dit import warp
from wc_fast.rl.sampler import ClipSampler, sigma_schedule

CFG = ModelConfig(resolution=8, channels=3, clip_frames=2, patch=4, dim=32, depth=2, heads=2)


class PointMassFlow(nn.Module):
    """Exact velocity of the flow whose data is the single clip ``target``: (x - target) / s."""

    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.clip_frames = CFG.clip_frames  # the WorldModel protocol, nothing more
        self.clip_shape = (CFG.clip_frames, CFG.channels, CFG.resolution, CFG.resolution)
        self.motion_latent = False
        self.target = nn.Parameter(target, requires_grad=False)

    def velocity(self, x, sigma, actions, cache):
        return (x - self.target) / sigma.reshape(-1, 1, 1, 1, 1)


def _tiny_model(device="cpu") -> TinyWorldDiT:
    torch.manual_seed(0)
    model = TinyWorldDiT(CFG).to(device)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.2)
    return model.eval()


def _cache(model, device="cpu"):
    frames = torch.randn(1, 3, 3, 8, 8, generator=torch.Generator().manual_seed(3)).to(device)
    with torch.no_grad():
        return model.extend_cache(model.empty_cache(), frames, torch.zeros(1, 3, dtype=torch.long,
                                                                         device=device), sigma=0.0)


def test_linear_flow_is_integrated_exactly():
    target = torch.randn(1, 2, 3, 8, 8, dtype=torch.float64)
    model = PointMassFlow(target)
    for steps, shift in ((40, 5.0), (7, 1.0)):
        out = ClipSampler(model, steps=steps, shift=shift).sample(
            ContextCache(), torch.zeros(2, dtype=torch.long), num=4,
            noise=torch.randn(4, 2, 3, 8, 8, dtype=torch.float64))
        torch.testing.assert_close(out.clips, target.expand(4, -1, -1, -1, -1), rtol=1e-12,
                                   atol=1e-12)


def test_same_noise_same_clip_and_different_noise_different_clip():
    model = _tiny_model()
    cache = _cache(model)
    sampler = ClipSampler(model, steps=4)
    actions = torch.tensor([9, 1])
    a = sampler.sample(cache, actions, num=3, generator=torch.Generator().manual_seed(1))
    b = sampler.sample(cache, actions, num=3, noise=a.noise)
    c = sampler.sample(cache, actions, num=3, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a.clips, b.clips, rtol=0, atol=0)
    assert not torch.allclose(a.clips, c.clips)
    assert not torch.allclose(a.clips[0], a.clips[1]), "candidates start from their own noise"


def test_sde_shares_initial_noise_and_replays():
    model = _tiny_model()
    cache = _cache(model)
    sampler = ClipSampler(model, steps=4, candidate_noise="sde", sde_noise=0.7)
    actions = torch.tensor([9, 1])
    a = sampler.sample(cache, actions, num=3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.noise[0], a.noise[2]), "one shared initial noise"
    assert a.step_noise.shape == (3, 3, 2, 3, 8, 8)
    assert not torch.allclose(a.clips[0], a.clips[1]), "step noise makes candidates differ"
    b = sampler.sample(cache, actions, num=3, noise=a.noise, step_noise=a.step_noise)
    torch.testing.assert_close(a.clips, b.clips, rtol=0, atol=0)


def test_sde_with_zero_noise_level_is_the_ode():
    model = _tiny_model()
    cache = _cache(model)
    actions = torch.tensor([9, 1])
    noise = torch.randn(1, 2, 3, 8, 8).expand(2, -1, -1, -1, -1).contiguous()
    ode = ClipSampler(model, steps=4).sample(cache, actions, num=2, noise=noise)
    sde = ClipSampler(model, steps=4, candidate_noise="sde", sde_noise=0.0).sample(
        cache, actions, num=2, noise=noise, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ode.clips, sde.clips, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_compiled_cpu_path_equals_eager():
    model = _tiny_model()
    cache = _cache(model)
    actions = torch.tensor([9, 1])
    noise = torch.randn(2, 2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    eager = ClipSampler(model, steps=3, capture="eager").sample(cache, actions, num=2,
                                                                 noise=noise)
    compiled = ClipSampler(model, steps=3, capture="compile").sample(cache, actions, num=2,
                                                                      noise=noise)
    torch.testing.assert_close(compiled.clips, eager.clips, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("candidate_noise", ["independent", "sde"])
def test_candidates_sampled_in_chunks_are_those_of_one_batch(candidate_noise):
    """Chunks of candidates over the one shared cache draw the group's noise as one batch
    does, and give each chunk exactly what sampling that chunk alone from its noise gives.
    Against one batch of all five, the clips agree to float rounding: the CPU's fp32 matmul
    kernels pick their summation order by the batch's shape (a single candidate's velocity
    differs from its row of a batch of five by up to 3e-6 at values up to 24; after 4 steps
    the clips by up to 5e-6)."""
    model = _tiny_model()
    cache = _cache(model)
    actions = torch.tensor([[9, 1], [0, 3], [2, 2], [5, 0], [1, 1]])
    offsets = {"action_offset": torch.randn(5, 8, generator=torch.Generator().manual_seed(4))}

    def sampler(chunk: int) -> ClipSampler:
        return ClipSampler(model, steps=4, candidate_noise=candidate_noise,
                           candidate_chunk=chunk)

    whole = sampler(0).sample(cache, actions, num=5, offsets=offsets,
                              generator=torch.Generator().manual_seed(1))
    for chunk in (1, 2, 5, 8):
        run = sampler(chunk).sample(cache, actions, num=5, offsets=offsets,
                                    generator=torch.Generator().manual_seed(1))
        assert torch.equal(run.noise, whole.noise)
        for i in range(0, 5, chunk):
            rows = slice(i, i + chunk)
            alone = sampler(0).sample(
                cache, actions[rows], num=len(actions[rows]), noise=whole.noise[rows],
                step_noise=None if whole.step_noise is None else whole.step_noise[:, rows],
                offsets={k: t[rows] for k, t in offsets.items()})
            assert torch.equal(run.clips[rows], alone.clips)
        torch.testing.assert_close(run.clips, whole.clips, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(whole.clips[0], whole.clips[1])


def test_a_wan_model_samples_its_candidates_in_chunks_as_in_one_batch():
    from test_wan_world_model import latents, tiny_model

    model = tiny_model()
    with torch.no_grad():
        cache = model.build_cache_parallel(latents(1, 5), torch.zeros(1, 5, dtype=torch.long),
                                           sigma=0.0)
    actions = torch.zeros(model.clip_frames, dtype=torch.long)
    whole, chunked = (ClipSampler(model, steps=3, candidate_chunk=chunk).sample(
        cache, actions, num=3, generator=torch.Generator().manual_seed(2)) for chunk in (0, 2))
    assert torch.equal(chunked.noise, whole.noise)
    torch.testing.assert_close(chunked.clips, whole.clips, rtol=1e-5, atol=1e-5)


def test_bad_options():
    model = _tiny_model()
    with pytest.raises(ValueError, match="capture"):
        ClipSampler(model, capture="graph")
    with pytest.raises(ValueError, match="candidate_noise"):
        ClipSampler(model, candidate_noise="beam")
    with pytest.raises(ValueError, match="candidate_chunk"):
        ClipSampler(model, candidate_chunk=-1)
    with pytest.raises(RuntimeError, match="CUDA device"):
        ClipSampler(model, capture="cuda_graph").sample(_cache(model), torch.tensor([0, 0]),
                                                        num=1)
    with pytest.raises(ValueError, match="noise must have shape"):
        ClipSampler(model).sample(_cache(model), torch.tensor([0, 0]), num=2,
                                  noise=torch.randn(3, 2, 3, 8, 8))


def test_schedule_is_the_sampler_grid():
    assert ClipSampler(_tiny_model(), steps=10).sigmas == sigma_schedule(10, 5.0).tolist()


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager_and_recaptures_on_new_shape():
    model = _tiny_model("cuda")
    cache = _cache(model, "cuda")
    actions = torch.tensor([9, 1], device="cuda")
    graph = ClipSampler(model, steps=5, capture="cuda_graph")
    eager = ClipSampler(model, steps=5, capture="eager")
    for num in (3, 3, 5):
        noise = torch.randn(num, 2, 3, 8, 8, device="cuda")
        torch.testing.assert_close(graph.sample(cache, actions, num=num, noise=noise).clips,
                                   eager.sample(cache, actions, num=num, noise=noise).clips,
                                   rtol=1e-4, atol=1e-4)
    assert len(graph._graphs) == 2
    longer = model.extend_cache(cache, torch.randn(1, 2, 3, 8, 8, device="cuda"),
                                torch.zeros(1, 2, dtype=torch.long, device="cuda"), sigma=0.0)
    noise = torch.randn(3, 2, 3, 8, 8, device="cuda")
    torch.testing.assert_close(graph.sample(longer, actions, num=3, noise=noise).clips,
                               eager.sample(longer, actions, num=3, noise=noise).clips,
                               rtol=1e-4, atol=1e-4)
    assert len(graph._graphs) == 3


@pytest.mark.gpu
def test_compile_does_not_recompile_on_replay():
    import torch._dynamo.utils as dynamo_utils

    model = _tiny_model("cuda")
    cache = _cache(model, "cuda")
    actions = torch.tensor([9, 1], device="cuda")
    sampler = ClipSampler(model, steps=5, capture="compile")
    sampler.sample(cache, actions, num=3)
    before = dict(dynamo_utils.counters["stats"])
    sampler.sample(cache, actions, num=3)
    assert dynamo_utils.counters["stats"].get("unique_graphs", 0) == before.get("unique_graphs", 0)


def test_the_warp_heads_final_parts_sum_to_the_sampled_clip():
    torch.manual_seed(0)
    model = TinyWorldDiT(dataclasses.replace(CFG, prediction="warp", reference_frame=True))
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.2)
    model.eval()
    cache = _cache(model)
    sampler = ClipSampler(model, steps=4, capture="eager")
    actions = torch.tensor([9, 1])
    noise = sampler.initial_noise(actions, num=3, generator=torch.Generator().manual_seed(1))
    sampled = sampler.sample(cache, actions, num=3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sampled.noise, noise)
    parts = sampler.final_parts(cache, actions, noise)
    assert parts.flow.shape == (3, 2, 2, 8, 8) and parts.residual.shape == (3, 2, 3, 8, 8)
    assert parts.flow.abs().amax() > 0.1
    # the last Euler step to sigma 0 returns the head's clip: warped reference plus residual
    torch.testing.assert_close(parts.warped + parts.residual, sampled.clips, rtol=1e-5,
                               atol=1e-5)
    reference = cache.last_frame[:, None].expand(3, 2, -1, -1, -1)
    torch.testing.assert_close(parts.warped, warp(reference, parts.flow))
    with pytest.raises(TypeError, match="warp head"):
        ClipSampler(PointMassFlow(torch.zeros(1, 2, 3, 8, 8))).final_parts(
            ContextCache(), actions, torch.zeros(1, 2, 3, 8, 8))
    with pytest.raises(ValueError, match="noise"):
        sampler.final_parts(cache, actions, noise[:, :1])
    with pytest.raises(ValueError, match="prediction='warp'"):
        _tiny_model().warp_parts(noise, torch.ones(3), actions, _cache(_tiny_model()))
