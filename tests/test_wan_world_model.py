"""WanWorldModel (wc_fast/models/wan/model.py) on a tiny random WanTransformer3DModel."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from diffusers import WanTransformer3DModel

from wc_fast.models import WorldModel
from wc_fast.models.wan.model import WanWorldModel

CLIP = 2
LATENT = (4, 6)
CHANNELS = 4


def tiny_transformer(seed: int = 0) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
        in_channels=CHANNELS, out_channels=CHANNELS, text_dim=16, freq_dim=16, ffn_dim=32,
        num_layers=2, rope_max_seq_len=32).eval()


def tiny_model(seed: int = 0) -> WanWorldModel:
    return WanWorldModel(tiny_transformer(seed), clip_frames=CLIP, latent_size=LATENT,
                         attention_backend="reference")


def with_action_weights(model: WanWorldModel) -> WanWorldModel:
    """The model with a nonzero action projection, as after training."""
    with torch.no_grad():
        model.action_proj.weight.normal_(std=0.2)
    return model


def latents(b: int, f: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, f, CHANNELS, *LATENT, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_matches_diffusers_with_zero_actions_and_one_timestep():
    transformer = tiny_transformer()
    reference = copy.deepcopy(transformer)
    model = WanWorldModel(transformer, clip_frames=CLIP, latent_size=LATENT)
    assert isinstance(model, WorldModel)
    x = latents(2, CLIP)
    sigma = torch.tensor([0.3, 0.8])
    want = reference(x.transpose(1, 2), 1000 * sigma, model.prompt_embeds.expand(2, -1, -1),
                     return_dict=False)[0].transpose(1, 2)
    got = model.velocity(x, sigma, torch.tensor([0, 40]), model.empty_cache())
    assert got.shape == (2, CLIP, CHANNELS, *LATENT)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_cached_clips_equal_teacher_forced():
    model = with_action_weights(tiny_model())
    frames = latents(1, 1 + 2 * CLIP)
    x_t = latents(1, 2 * CLIP, seed=2)
    actions = torch.tensor([[9, 9, 41, 3]])
    sigma = torch.tensor([[0.6, 0.4]])
    want = model.teacher_forced_velocity(frames, actions, x_t, sigma, context_sigma=0.05)
    history_actions = torch.cat([torch.zeros(1, 1, dtype=torch.long), actions], dim=1)
    prompt = model.extend_cache(model.empty_cache(), frames[:, :1], history_actions[:, :1],
                                sigma=0.05)
    first = model.velocity(x_t[:, :CLIP], sigma[:, 0], actions[:, :CLIP], prompt)
    cache = model.extend_cache(prompt, frames[:, 1:1 + CLIP], actions[:, :CLIP], sigma=0.05)
    assert cache.num_frames == 1 + CLIP and cache.keys[0].shape[:2] == (1, 2)
    second = model.velocity(x_t[:, CLIP:], sigma[:, 1], actions[:, CLIP:], cache)
    torch.testing.assert_close(first, want[:, :CLIP], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second, want[:, CLIP:], rtol=1e-5, atol=1e-5)
    # the same clip at the prompt's positions (no history) predicts something else
    alone = model.velocity(x_t[:, CLIP:], sigma[:, 1], actions[:, CLIP:], model.empty_cache())
    assert (alone - second).abs().max() > 1e-3


@torch.no_grad()
def test_parallel_cache_equals_chunked_cache():
    model = with_action_weights(tiny_model())
    frames = latents(1, 1 + 2 * CLIP)
    actions = torch.tensor([[0, 9, 9, 41, 3]])
    chunked = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.1)
    parallel = model.build_cache_parallel(frames, actions, sigma=0.1)
    assert parallel.num_frames == chunked.num_frames == 1 + 2 * CLIP
    for a, b in zip(chunked.keys + chunked.values, parallel.keys + parallel.values, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_candidates_over_shared_cache_equal_single_rows():
    model = with_action_weights(tiny_model())
    cache = model.extend_cache(model.empty_cache(), latents(1, 1 + CLIP), torch.tensor([[0, 9, 1]]),
                               sigma=0.0)
    x = latents(3, CLIP, seed=3)
    sigma = torch.tensor([0.9, 0.5, 0.2])
    actions = torch.tensor([[9, 9], [41, 41], [3, 4]])
    batched = model.velocity(x, sigma, actions, cache)
    for row in range(3):
        single = model.velocity(x[row:row + 1], sigma[row:row + 1], actions[row:row + 1], cache)
        torch.testing.assert_close(batched[row:row + 1], single, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_actions_change_velocity_only_once_trained():
    model = tiny_model()
    cache = model.extend_cache(model.empty_cache(), latents(1, 1), torch.tensor([[0]]), sigma=0.0)
    x, sigma = latents(1, CLIP), torch.tensor([0.5])
    still = model.velocity(x, sigma, torch.tensor([0, 0]), cache)
    torch.testing.assert_close(model.velocity(x, sigma, torch.tensor([41, 41]), cache), still,
                               rtol=0, atol=0)
    with_action_weights(model)
    moved = model.velocity(x, sigma, torch.tensor([41, 41]), cache)
    assert (moved - model.velocity(x, sigma, torch.tensor([0, 0]), cache)).abs().max() > 1e-3


@torch.no_grad()
def test_bf16_autocast_runs_the_blocks_in_bf16_and_stays_close_to_fp32():
    fp32 = with_action_weights(tiny_model())
    bf16 = copy.deepcopy(fp32)
    bf16.autocast_dtype = torch.bfloat16
    frames, actions = latents(1, 1 + CLIP), torch.tensor([[0, 9, 41]])
    x, sigma = latents(2, CLIP, seed=4), torch.tensor([0.7, 0.3])
    caches = [m.extend_cache(m.empty_cache(), frames, actions, sigma=0.05) for m in (fp32, bf16)]
    assert caches[0].keys[0].dtype == torch.float32 and caches[1].keys[0].dtype == torch.bfloat16
    want = fp32.velocity(x, sigma, torch.tensor([41, 3]), caches[0])
    got = bf16.velocity(x, sigma, torch.tensor([41, 3]), caches[1])
    assert got.dtype == torch.float32 and bf16.transformer.proj_out.weight.dtype == torch.float32
    # bf16 matmuls: a few bf16 ulps (2^-8) of the output's scale, not equal
    error = (got - want).abs().max() / want.abs().max()
    assert 0 < error < 0.05


def test_autocast_dtype_must_be_a_float_dtype():
    with pytest.raises(ValueError, match="autocast_dtype"):
        WanWorldModel(tiny_transformer(), clip_frames=CLIP, latent_size=LATENT,
                      autocast_dtype=torch.int8)


def test_action_projection_gets_a_gradient_at_zero_init():
    model = tiny_model()
    v = model.velocity(latents(1, CLIP), torch.tensor([0.5]), torch.tensor([9, 41]),
                       model.empty_cache())
    v.square().sum().backward()
    assert model.action_proj.weight.grad.abs().max() > 0


@pytest.mark.parametrize("pipeline_layout", [True, False])
def test_from_pretrained_loads_a_local_directory(tmp_path, pipeline_layout):
    transformer = tiny_transformer(seed=5)
    target = tmp_path / "transformer" if pipeline_layout else tmp_path
    transformer.save_pretrained(target)
    model = WanWorldModel.from_pretrained(tmp_path, clip_frames=CLIP, latent_size=LATENT)
    for name, tensor in transformer.state_dict().items():
        torch.testing.assert_close(model.transformer.state_dict()[name], tensor, rtol=0, atol=0)
    assert model.clip_shape == (CLIP, CHANNELS, *LATENT)


def test_from_pretrained_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        WanWorldModel.from_pretrained(tmp_path / "absent", clip_frames=CLIP, latent_size=LATENT)
    with pytest.raises(FileNotFoundError, match="config.json"):
        WanWorldModel.from_pretrained(tmp_path, clip_frames=CLIP, latent_size=LATENT)
    tiny_transformer().save_pretrained(tmp_path)
    for weights in tmp_path.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(FileNotFoundError, match="no weights"):
        WanWorldModel.from_pretrained(tmp_path, clip_frames=CLIP, latent_size=LATENT)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "_class_name": "UNet2DModel"}))
    (tmp_path / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="UNet2DModel"):
        WanWorldModel.from_pretrained(tmp_path, clip_frames=CLIP, latent_size=LATENT)


@torch.no_grad()
def test_bad_inputs_name_the_argument():
    model = tiny_model()
    cache = model.empty_cache()
    x, sigma, actions = latents(2, CLIP), torch.tensor([0.5, 0.5]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="x_t"):
        model.velocity(latents(2, CLIP + 1), sigma, actions, cache)
    with pytest.raises(ValueError, match="x_t"):
        model.velocity(x[:, :, :3], sigma, actions, cache)
    with pytest.raises(TypeError, match="x_t"):
        model.velocity(x.long(), sigma, actions, cache)
    with pytest.raises(ValueError, match="sigma"):
        model.velocity(x, torch.tensor([0.5]), actions, cache)
    with pytest.raises(TypeError, match="sigma"):
        model.velocity(x, torch.tensor([1, 1]), actions, cache)
    with pytest.raises(ValueError, match="actions"):
        model.velocity(x, sigma, torch.tensor([0, 0, 0]), cache)
    with pytest.raises(TypeError, match="actions"):
        model.velocity(x, sigma, actions.float(), cache)
    with pytest.raises(ValueError, match="action ids"):
        model.velocity(x, sigma, torch.tensor([0, 81]), cache)
    with pytest.raises(ValueError, match="motion"):
        model.velocity(x, sigma, actions, cache, motion=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="batch must be 1"):
        model.extend_cache(cache, latents(2, 1), torch.tensor([0]), sigma=0.0)
    with pytest.raises(ValueError, match="cache"):
        tiny_model().velocity(x, sigma, actions, WanWorldModel(
            tiny_transformer(), clip_frames=CLIP, latent_size=(6, 6)).empty_cache())
    with pytest.raises(ValueError, match="temporal patch"):
        WanWorldModel(WanTransformer3DModel(patch_size=(2, 2, 2), num_attention_heads=2,
                                            attention_head_dim=8, in_channels=4, text_dim=16,
                                            freq_dim=16, ffn_dim=32, num_layers=1),
                      clip_frames=CLIP, latent_size=LATENT)


@torch.no_grad()
def test_action_offset_shifts_the_movement_keys():
    """A zero offset is the commanded keys; an offset on row 0 changes row 0 only; it equals
    editing the key table's movement columns; a wrong shape is refused by name."""
    model = with_action_weights(tiny_model())
    x, sigma = latents(2, CLIP), torch.tensor([0.4, 0.7])
    actions = torch.tensor([[1] * CLIP, [9] * CLIP])
    cache = model.empty_cache()
    base = model.velocity(x, sigma, actions, cache)
    torch.testing.assert_close(model.velocity(x, sigma, actions, cache,
                                              action_offset=torch.zeros(2, 8)), base,
                               rtol=0, atol=0)
    offset = torch.zeros(2, 8)
    offset[0, 3] = 0.7
    moved = model.velocity(x, sigma, actions, cache, action_offset=offset)
    assert (moved[0] - base[0]).abs().max() > 1e-4
    torch.testing.assert_close(moved[1], base[1], rtol=0, atol=0)
    # the same as pressing key 3 of row 0 at intensity 0.7 in the key table
    edited = copy.deepcopy(model)
    edited.keys_of_action[1, 3] += 0.7
    torch.testing.assert_close(edited.velocity(x[:1], sigma[:1], actions[:1], cache),
                               moved[:1], rtol=1e-5, atol=1e-6)
    for bad in (torch.zeros(2, 9), torch.zeros(1, 8)):
        with pytest.raises(ValueError, match="action_offset"):
            model.velocity(x, sigma, actions, cache, action_offset=bad)
    with pytest.raises(TypeError, match="action_offset"):
        model.velocity(x, sigma, actions, cache, action_offset=torch.zeros(2, 8, dtype=torch.long))
