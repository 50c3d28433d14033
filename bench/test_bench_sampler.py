"""Sampler throughput: eager vs torch.compile (CPU); eager vs CUDA graph vs compile (GPU).

Run: ``python -m pytest --benchmark-only bench/test_bench_sampler.py --benchmark-group-by=group``.
``extra_info["steps_per_s"]`` is sampler steps per second (each step = one G-candidate forward).
"""

from __future__ import annotations

import pytest
import torch

from wc_fast.config import ModelConfig, preset
from wc_fast.models import TinyWorldDiT
from wc_fast.rl.sampler import ClipSampler

STEPS = 10
ROUNDS = 10  # timed rounds per mode: a median and a spread a reviewer can read
CUDA = torch.cuda.is_available()
G = 16 if CUDA else 8


def _model(cfg: ModelConfig, device: torch.device) -> TinyWorldDiT:
    torch.manual_seed(0)
    model = TinyWorldDiT(cfg).to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.02)
    return model


def _setup(cfg: ModelConfig):
    device = torch.device("cuda" if CUDA else "cpu")
    model = _model(cfg, device)
    frames = torch.randn(1, 1 + 2 * cfg.clip_frames, cfg.channels, cfg.resolution,
                         cfg.resolution, device=device)
    actions = torch.randint(0, 81, (1, frames.shape[1]), device=device)
    with torch.no_grad():
        cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
    noise = torch.randn(G, cfg.clip_frames, cfg.channels, cfg.resolution, cfg.resolution,
                        device=device)
    return model, cache, actions[0, 1:1 + cfg.clip_frames], noise


def _bench(benchmark, cfg: ModelConfig, capture: str) -> None:
    model, cache, actions, noise = _setup(cfg)
    sampler = ClipSampler(model, steps=STEPS, capture=capture)

    def run():
        out = sampler.sample(cache, actions, num=G, noise=noise).clips
        if CUDA:
            torch.cuda.synchronize()
        return out

    run()  # compile / capture outside the timed rounds
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    benchmark.extra_info["steps_per_s"] = STEPS / benchmark.stats.stats.mean
    benchmark.extra_info["G"] = G


EMBEDDED = preset("cpu").model
LARGE = ModelConfig(resolution=64, clip_frames=4, patch=4, dim=768, depth=12, heads=12)
CPU_MODES = ["eager", "compile"]
GPU_MODES = ["eager", "cuda_graph", "compile"]


@pytest.mark.benchmark(group="sampler-embedded")
@pytest.mark.parametrize("capture", GPU_MODES if CUDA else CPU_MODES)
def test_sampler_embedded(benchmark, capture):
    _bench(benchmark, EMBEDDED, capture)


@pytest.mark.skipif(not CUDA, reason="large-model sampler benchmark needs a GPU")
@pytest.mark.benchmark(group="sampler-large")
@pytest.mark.parametrize("capture", GPU_MODES)
def test_sampler_large(benchmark, capture):
    _bench(benchmark, LARGE, capture)
