"""The WorldModel protocol (wc_fast/models/protocol.py), checked on every backbone.

Each backbone is built small and random with nonzero action layers, so that the checks see
the actions. A new backbone joins by adding a builder to ``BACKBONES``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from diffusers import WanTransformer3DModel
from torch import nn

from wc_fast.config import ModelConfig
from wc_fast.models import TinyWorldDiT, WorldModel
from wc_fast.models.pretrained import new_world_model
from wc_fast.models.protocol import WORLD_MODEL_MEMBERS, check_world_model
from wc_fast.models.wan.model import WanWorldModel

TINY = ModelConfig(resolution=16, patch=8, dim=32, depth=2, heads=2, clip_frames=2)


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    """Every weight drawn at random (zero-initialised heads and gates would hide the
    conditioning)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def tiny(prediction: str = "velocity", **fields) -> Callable[[], WorldModel]:
    cfg = dataclasses.replace(TINY, prediction=prediction, **fields)
    return lambda: _randomise(TinyWorldDiT(cfg, attention_backend="reference"), 0)


def wan(history_window: int = 0) -> Callable[[], WorldModel]:
    def build() -> WorldModel:
        torch.manual_seed(0)
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
            out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
            rope_max_seq_len=32)
        model = WanWorldModel(transformer, clip_frames=2, latent_size=(4, 6),
                              attention_backend="reference", history_window=history_window)
        return _randomise(model, 1)

    return build


def wan_pixels(reference_frame: bool = False, **fields) -> Callable[[], WorldModel]:
    def build() -> WorldModel:
        cfg = dataclasses.replace(TINY, backbone="wan", patch=4, reference_frame=reference_frame,
                                  **fields)
        return _randomise(new_world_model(cfg), 3)

    return build


def worldplay() -> WorldModel:
    from test_worldplay_model import fixture_model

    return fixture_model()[0]


BACKBONES = {"tiny_velocity": tiny(), "tiny_warp": tiny("warp", pose_branch=True),
             "tiny_motion_latent": tiny("x0", motion_latent=True), "wan_latent": wan(),
             "wan_pixels": wan_pixels(), "wan_pixels_reference": wan_pixels(True),
             "worldplay": worldplay,
             # attention to the last 2 history frames only: shorter than the histories below
             "tiny_window": tiny(history_window=2), "wan_latent_window": wan(2),
             "wan_pixels_reference_window": wan_pixels(True, history_window=2)}


@pytest.fixture(params=list(BACKBONES))
def model(request) -> WorldModel:
    return BACKBONES[request.param]()


def _frames(model: WorldModel, b: int, f: int, seed: int) -> torch.Tensor:
    _, c, h, w = model.clip_shape
    return torch.randn(b, f, c, h, w, generator=torch.Generator().manual_seed(seed)).clamp(-1, 1)


def _actions(model: WorldModel, first: int, rest: int) -> torch.Tensor:
    """One command ``[F]`` shared by all rows: ``first`` then ``rest``."""
    return torch.tensor([first] + [rest] * (model.clip_frames - 1))


def _motion(model: WorldModel, b: int) -> dict:
    return {"motion": torch.randn(b, 3)} if model.motion_latent else {}


def _history(model: WorldModel, clips: int = 1):
    f = model.clip_frames
    frames = _frames(model, 1, 1 + clips * f, seed=3)
    actions = torch.cat([torch.zeros(1, 1, dtype=torch.long),
                         torch.randint(0, 81, (1, clips * f), generator=torch.Generator()
                                       .manual_seed(4))], dim=1)
    return frames, actions


def test_declares_every_member(model):
    check_world_model(model)
    assert isinstance(model, WorldModel)
    assert all(hasattr(model, name) for name in WORLD_MODEL_MEMBERS)
    assert "action_offset" in model.exploration_inputs


def test_missing_members_are_named():
    class Partial(nn.Module):
        clip_frames = 2

    with pytest.raises(TypeError, match="lacks .*velocity.*fresh_copy"):
        check_world_model(Partial())


@torch.no_grad()
def test_cache_chunk_by_chunk_equals_one_parallel_forward(model):
    frames, actions = _history(model, clips=2)
    sigma = model.context_sigma
    stepwise = model.extend_cache(model.empty_cache(), frames, actions, sigma=sigma)
    parallel = model.build_cache_parallel(frames, actions, sigma=sigma)
    assert stepwise.num_frames == parallel.num_frames == frames.shape[1]
    for a, b in zip(stepwise.keys + stepwise.values, parallel.keys + parallel.values,
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@torch.no_grad()
def test_candidates_over_one_shared_cache_equal_separate_forwards(model):
    frames, actions = _history(model)
    cache = model.build_cache_parallel(frames, actions, sigma=model.context_sigma)
    x_t = _frames(model, 3, model.clip_frames, seed=5)
    sigma = torch.tensor([0.9, 0.5, 0.2])
    clip_actions = torch.tensor([3, 40, 45])[:, None].expand(-1, model.clip_frames).clone()
    clip_actions[2, -1] = 12
    extra = _motion(model, 3)
    v = model.velocity(x_t, sigma, clip_actions, cache, **extra)
    assert v.shape == (3, *model.clip_shape) and torch.isfinite(v).all()
    for i in range(3):
        one = model.velocity(x_t[i:i + 1], sigma[i:i + 1], clip_actions[i:i + 1], cache,
                             **{k: t[i:i + 1] for k, t in extra.items()})
        torch.testing.assert_close(v[i:i + 1], one, rtol=1e-3, atol=1e-4)
    assert model.bound_frames(v).shape == v.shape


@torch.no_grad()
def test_teacher_forced_velocity_equals_cached_velocity(model):
    frames, actions = _history(model, clips=2)
    f = model.clip_frames
    x_t = _frames(model, 1, 2 * f, seed=6)
    sigma = torch.tensor([[0.7, 0.3]])
    extra = {"motion": torch.randn(1, 2, 3)} if model.motion_latent else {}
    want = model.teacher_forced_velocity(frames, actions[:, 1:], x_t, sigma,
                                         context_sigma=model.context_sigma, **extra)
    cache = model.build_cache_parallel(frames[:, :1 + f], actions[:, :1 + f],
                                       sigma=model.context_sigma)
    got = model.velocity(x_t[:, f:], sigma[:, 1], actions[:, 1 + f:], cache,
                         **{k: t[:, 1] for k, t in extra.items()})
    torch.testing.assert_close(got, want[:, f:], rtol=1e-3, atol=1e-4)


@torch.no_grad()
def test_action_offset_moves_the_conditioning_and_zero_is_no_offset(model):
    frames, actions = _history(model)
    cache = model.build_cache_parallel(frames, actions, sigma=model.context_sigma)
    x_t = _frames(model, 2, model.clip_frames, seed=7)
    sigma = torch.tensor([0.6, 0.6])
    extra = _motion(model, 2)
    plain = model.velocity(x_t, sigma, _actions(model, 1, 5), cache, **extra)
    zero = model.velocity(x_t, sigma, _actions(model, 1, 5), cache,
                          action_offset=torch.zeros(2, 8), **extra)
    torch.testing.assert_close(plain, zero)
    offset = torch.zeros(2, 8)
    offset[1, 0] = 0.5  # the second row also half-presses "forward"
    moved = model.velocity(x_t, sigma, _actions(model, 1, 5), cache,
                           action_offset=offset, **extra)
    torch.testing.assert_close(moved[0], plain[0])
    assert (moved[1] - plain[1]).abs().max() > 1e-4
    with pytest.raises(ValueError, match=r"action_offset must have shape \[2, 8\]"):
        model.velocity(x_t, sigma, _actions(model, 1, 5), cache,
                       action_offset=torch.zeros(2, 6), **extra)
    with pytest.raises(TypeError, match="action_offset must be a floating-point tensor"):
        model.velocity(x_t, sigma, _actions(model, 1, 5), cache,
                       action_offset=torch.zeros(2, 8, dtype=torch.long), **extra)


def test_parameter_groups_are_the_models_own(model):
    params = {id(p) for p in model.parameters()}
    hidden = model.hidden_matrices()
    conditioning = model.conditioning_parameters()
    assert hidden and conditioning
    assert all(id(p) in params and p.ndim == 2 for p in hidden)
    assert all(id(p) in params for p in conditioning)
    modules = {id(m) for m in model.modules()}
    assert model.shard_units() and all(id(u) in modules for u in model.shard_units())


def test_flops_grow_with_batch_and_history(model):
    assert 0 < model.velocity_flops(1, 16) < model.velocity_flops(2, 16)
    assert model.velocity_flops(1, 16) < model.velocity_flops(1, 64)
    assert 0 < model.history_flops(1 + model.clip_frames) < model.history_flops(
        1 + 2 * model.clip_frames)


@torch.no_grad()
def test_fresh_copy_has_the_architecture_and_takes_the_weights(model):
    copy = model.fresh_copy()
    assert type(copy) is type(model)
    want = model.state_dict()
    assert {k: v.shape for k, v in copy.state_dict().items()} == {
        k: v.shape for k, v in want.items()}
    copy.load_state_dict(want)
    copy.eval()
    frames, actions = _history(model)
    x_t = _frames(model, 2, model.clip_frames, seed=8)
    sigma = torch.tensor([0.5, 0.4])
    extra = _motion(model, 2)
    outs = [m.velocity(x_t, sigma, _actions(model, 2, 2),
                       m.build_cache_parallel(frames, actions, sigma=m.context_sigma), **extra)
            for m in (model, copy)]
    torch.testing.assert_close(outs[0], outs[1])
