"""WorldPlayWorldModel against the official HY-WorldPlay transformer (the golden fixture made by
studies/make_worldplay_fixture.py), and its protocol behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from wc_fast.models.protocol import ContextCache, WorldModel
from wc_fast.models.worldplay.camera import (
    action_keys,
    history_cameras,
    intrinsics,
    view_matrices,
)
from wc_fast.models.worldplay.model import WorldPlayConfig, WorldPlayWorldModel, key_pattern_weights
from wc_fast.models.worldplay.tiny import write_tiny_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "worldplay_tiny"
# fp32 against the official transformer's fp32 output (values up to about 2.6): the order of
# summation differs between CPUs (AVX2 and AVX-512 GEMM kernels), which moved single elements by
# up to 7.7e-6 on the machines we ran; a wrong op moves them by 1e-3 or more.
ATOL, RTOL = 3e-5, 1e-5


def fixture_model() -> tuple[WorldPlayWorldModel, dict]:
    card = json.loads(FIXTURE.with_suffix(".json").read_text())
    tensors = load_file(FIXTURE.with_suffix(".safetensors"))
    data = {k.removeprefix("fixture."): v for k, v in tensors.items() if k.startswith("fixture.")}
    weights = {k: v for k, v in tensors.items() if not k.startswith("fixture.")}
    cfg = card["config"]
    config = WorldPlayConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()
                                if k in WorldPlayConfig.__dataclass_fields__})
    model = WorldPlayWorldModel(config, clip_frames=card["chunk"],
                                latent_size=tuple(card["latent_size"]),
                                text_states=data["text_states"],
                                vision_states=data["vision_states"],
                                context_sigma=card["context_timestep"] / 1000)
    model.load_official(weights)
    return model.eval(), {**data, "card": card}


def test_matches_official_without_history():
    model, d = fixture_model()
    f = d["card"]["chunk"]
    w2c = d["w2c"][None, -f:].expand(2, -1, -1, -1)
    sigma = d["sigma"][:, None].expand(2, f)
    with torch.no_grad():
        v = model._velocity(d["noisy"], sigma, d["chunk_actions"], None, w2c,
                            model.empty_cache())
    torch.testing.assert_close(v, d["velocity_no_history"], atol=ATOL, rtol=RTOL)


def test_matches_official_with_history():
    model, d = fixture_model()
    p, f = d["card"]["context_frames"], d["card"]["chunk"]
    with torch.no_grad():
        sigma_ctx = torch.full((1, p), model.context_sigma)
        cache = model._cache_from(d["context"], d["context_actions"][None], sigma_ctx,
                                  d["w2c"][None, :p])
        v = model._velocity(d["noisy"], d["sigma"][:, None].expand(2, f), d["chunk_actions"],
                            None, d["w2c"][None, p:].expand(2, -1, -1, -1), cache)
    torch.testing.assert_close(v, d["velocity_with_history"], atol=ATOL, rtol=RTOL)
    assert (v - d["velocity_no_history"]).abs().max() > 0.1  # the history matters


def test_key_pattern_weights_one_hot_for_discrete_keys():
    ids = torch.arange(81)
    weights = key_pattern_weights(action_keys(ids))
    torch.testing.assert_close(weights, torch.eye(81))


def test_intrinsics_are_the_pipeline_default():
    _, d = fixture_model()
    torch.testing.assert_close(intrinsics(9).float(), d["intrinsics"])


# -- the WorldModel protocol -----------------------------------------------------------------


def f64_model() -> WorldPlayWorldModel:
    return fixture_model()[0].double()


def history(frames: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, frames, 4, 4, 4, generator=gen, dtype=torch.float64),
            torch.randint(0, 81, (1, frames), generator=gen))


def test_is_a_world_model():
    assert isinstance(f64_model(), WorldModel)


def test_chunked_cache_equals_parallel_cache():
    model = f64_model()
    frames, actions = history(9)
    with torch.no_grad():
        chunked = model.extend_cache(model.empty_cache(), frames[:, :1], actions[:, :1],
                                     sigma=0.014)
        chunked = model.extend_cache(chunked, frames[:, 1:], actions[:, 1:], sigma=0.014)
        parallel = model.build_cache_parallel(frames, actions, sigma=0.014)
    assert model.empty_cache().num_tokens == 0
    assert chunked.num_frames == parallel.num_frames == 9
    assert chunked.num_tokens == model.text_tokens + 9 * 16
    for a, b in zip(chunked.keys + chunked.values, parallel.keys + parallel.values, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_candidates_over_shared_cache_equal_single_rows():
    model = f64_model()
    frames, actions = history(5)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 4, 4, 4, generator=gen, dtype=torch.float64)
    sigma = torch.rand(3, generator=gen, dtype=torch.float64)
    clip_actions = torch.randint(0, 81, (3, 4), generator=gen)
    with torch.no_grad():
        cache = model.build_cache_parallel(frames, actions, sigma=0.014)
        batched = model.velocity(x, sigma, clip_actions, cache)
        for i in range(3):
            own = ContextCache([k.clone() for k in cache.keys], [v.clone() for v in cache.values],
                               cache.num_frames, cache.signature, cache.last_frame)
            single = model.velocity(x[i:i + 1], sigma[i:i + 1], clip_actions[i:i + 1], own)
            torch.testing.assert_close(batched[i:i + 1], single, rtol=1e-10, atol=1e-10)


def test_cameras_rebased_on_the_last_history_frame_give_the_official_frame_0_result():
    """PRoPE sees only relative cameras: the public path (world = last history frame) equals
    the official one (world = frame 0) up to rounding."""
    model = f64_model()
    frames, actions = history(5)
    actions[:, 0] = 0
    clip_actions = torch.tensor([[9, 14, 1, 37]])
    x = torch.randn(1, 4, 4, 4, 4, dtype=torch.float64)
    sigma = torch.tensor([0.6], dtype=torch.float64)
    c2w = history_cameras(torch.cat([actions, clip_actions], dim=1))
    w2c = view_matrices(c2w)
    with torch.no_grad():
        public = model.velocity(x, sigma, clip_actions,
                                model.build_cache_parallel(frames, actions, sigma=0.014))
        cache = model._cache_from(frames, actions, torch.full((1, 5), 0.014,
                                                              dtype=torch.float64), w2c[:, :5])
        official = model._velocity(x, sigma[:, None].expand(1, 4), clip_actions, None,
                                   w2c[:, 5:], cache)
    torch.testing.assert_close(public, official, rtol=1e-9, atol=1e-9)


def test_teacher_forced_velocity_is_velocity_over_each_clips_history():
    model = f64_model()
    frames, actions = history(9)
    x = torch.randn(1, 8, 4, 4, 4, dtype=torch.float64)
    sigma = torch.tensor([[0.3, 0.8]], dtype=torch.float64)
    with torch.no_grad():
        tf = model.teacher_forced_velocity(frames, actions[:, 1:], x, sigma, context_sigma=0.014)
        cache = model.build_cache_parallel(frames[:, :5], actions[:, :5], sigma=0.014)
        second = model.velocity(x[:, 4:], sigma[:, 1], actions[:, 5:], cache)
    torch.testing.assert_close(tf[:, 4:], second, rtol=0, atol=0)


def test_action_offset_softens_the_keys_and_carries_a_gradient():
    model = f64_model()
    frames, actions = history(5)
    x = torch.randn(2, 4, 4, 4, 4, dtype=torch.float64)
    sigma = torch.tensor([0.5, 0.5], dtype=torch.float64)
    clip_actions = torch.tensor([9, 9, 9, 9])  # forward
    with torch.no_grad():
        cache = model.build_cache_parallel(frames, actions, sigma=0.014)
        plain = model.velocity(x, sigma, clip_actions, cache)
        zero = model.velocity(x, sigma, clip_actions, cache,
                              action_offset=torch.zeros(2, 8, dtype=torch.float64))
        # pressing yaw right fully is the discrete id forward + yaw right (10)
        turn = torch.zeros(2, 8, dtype=torch.float64)
        turn[:, 4] = 1.0
        pressed = model.velocity(x, sigma, clip_actions, cache, action_offset=turn)
        discrete = model.velocity(x, sigma, torch.tensor([10, 10, 10, 10]), cache)
    torch.testing.assert_close(zero, plain, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pressed, discrete, rtol=1e-10, atol=1e-10)
    offset = torch.full((2, 8), 0.2, dtype=torch.float64, requires_grad=True)
    model.velocity(x, sigma, clip_actions, cache, action_offset=offset).square().sum().backward()
    assert offset.grad is not None and float(offset.grad.abs().sum()) > 0


def test_bad_inputs_name_the_argument():
    model = f64_model()
    cache = model.empty_cache()
    x = torch.randn(2, 4, 4, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="x_t"):
        model.velocity(x[:, :3], torch.rand(2), torch.zeros(2, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="sigma"):
        model.velocity(x, torch.rand(3), torch.zeros(2, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="action_offset"):
        model.velocity(x, torch.rand(2), torch.zeros(4, dtype=torch.long), cache,
                       action_offset=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="history frames"):
        model.build_cache_parallel(torch.randn(1, 3, 4, 4, 4), torch.zeros(1, 3, dtype=torch.long),
                                   sigma=0.014)


def test_from_pretrained_names_a_missing_or_mis_shaped_tensor(tmp_path):
    root = write_tiny_checkpoint(tmp_path / "wp")
    model = WorldPlayWorldModel.from_pretrained(root, clip_frames=4, latent_size=(8, 8))
    assert model.config.hidden_size == 64
    weights = load_file(root / "transformer" / "diffusion_pytorch_model.safetensors")
    weights["double_blocks.1.img_attn_q.weight"] = torch.zeros(64, 63)
    del weights["action_in.mlp.0.bias"]
    save_file(weights, root / "transformer" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match=r"action_in\.mlp\.0\.bias.*img_attn_q\.weight"):
        WorldPlayWorldModel.from_pretrained(root, clip_frames=4, latent_size=(8, 8))
    with pytest.raises(FileNotFoundError, match="config.json"):
        WorldPlayWorldModel.from_pretrained(tmp_path, clip_frames=4, latent_size=(8, 8))


def test_lora_starts_unchanged_and_trains_only_adapters_and_conditioning():
    pytest.importorskip("peft")
    model = f64_model()
    frames, actions = history(5)
    x = torch.randn(2, 4, 4, 4, 4, dtype=torch.float64)
    sigma = torch.tensor([0.5, 0.7], dtype=torch.float64)
    with torch.no_grad():
        cache = model.build_cache_parallel(frames, actions, sigma=0.014)
        before = model.velocity(x, sigma, actions[0, 1:], cache)
    model.add_lora(4, 0.0, ("img_attn_q", "img_mlp.fc1"))
    with torch.no_grad():
        after = model.velocity(x, sigma, actions[0, 1:], cache)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    expected = {id(p) for p in (*model.lora_parameters(), *model.conditioning_parameters())}
    assert trained == expected and len(model.lora_parameters()) == 2 * 2 * 2


def test_flop_estimates_grow_with_the_history_and_the_batch():
    model = f64_model()
    assert model.history_flops(9) > model.history_flops(5) > 0
    assert model.velocity_flops(4, 200) > model.velocity_flops(4, 100) > 0
    assert model.velocity_flops(8, 100) > 1.9 * model.velocity_flops(4, 100)


def test_bf16_autocast_stays_close_to_fp32():
    model = fixture_model()[0]
    frames, actions = history(5)
    frames = frames.float()
    x = torch.randn(2, 4, 4, 4, 4)
    sigma = torch.tensor([0.4, 0.9])
    with torch.no_grad():
        full = model.velocity(x, sigma, actions[0, 1:],
                              model.build_cache_parallel(frames, actions, sigma=0.014))
        model.autocast_dtype = torch.bfloat16
        cache = model.build_cache_parallel(frames, actions, sigma=0.014)
        half = model.velocity(x, sigma, actions[0, 1:], cache)
    assert cache.keys[0].dtype == torch.bfloat16 and half.dtype == torch.float32
    assert float((half - full).norm() / full.norm()) < 0.02


def test_frozen_block_matrices_in_bf16_predict_what_fp32_ones_do_under_bf16_autocast():
    """A frozen copy (the KL's reference) holds every block matrix in bf16, the text stream's
    and the adapters' included: its cache and velocity are those of its fp32 weights to the
    bit, since bf16 autocast rounds each weight to bf16 on every call anyway."""
    pytest.importorskip("peft")
    from wc_fast.rl.optim import frozen_copy, hold_frozen_matrices_in

    model = fixture_model()[0]
    model.autocast_dtype = torch.bfloat16
    model.add_lora(4, 0.0, ("img_attn_q", "img_mlp.fc1"))
    with torch.no_grad():
        for p in model.lora_parameters():
            p.normal_(std=0.1)
    frames, actions = history(5)
    frames = frames.float()
    x = torch.randn(2, 4, 4, 4, 4)
    sigma = torch.tensor([0.4, 0.9])

    def predict(m):
        with torch.no_grad():
            cache = m.build_cache_parallel(frames, actions, sigma=0.014)
            return cache, m.velocity(x, sigma, actions[0, 1:], cache)

    ref = frozen_copy(model)
    cache, want = predict(ref)
    assert hold_frozen_matrices_in(ref, torch.bfloat16) > 0
    blocks = [m for m in ref.double_blocks.modules() if isinstance(m, torch.nn.Linear)]
    assert blocks and all(m.weight.dtype == torch.bfloat16 for m in blocks)
    held_cache, got = predict(ref)
    assert torch.equal(got, want)
    for a, b in zip(held_cache.keys + held_cache.values, cache.keys + cache.values, strict=True):
        assert torch.equal(a, b)
