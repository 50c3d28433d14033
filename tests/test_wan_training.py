"""Training the Wan world model through the normal trainer: the VAE codec, one RL iteration
end to end with checkpoints and an exact resume, conditioning-only training and the checks
on ``model.path``."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from gloo_ranks import spawn_ranks
from safetensors.torch import save_file
from test_train import _assert_same, _final_weights, _rank
from video_check import assert_generates

from wc_fast import config as config_lib
from wc_fast.infra import checkpoint
from wc_fast.models.pretrained import frame_codec, load_wan_world_model
from wc_fast.models.wan.vae import WanLatentCodec
from wc_fast.rl.trainer import Trainer
from wc_fast.train import main

pytestmark = pytest.mark.usefixtures("one_thread")

Z = 4  # latent channels of the test VAE and the transformer


def tiny_vae() -> AutoencoderKLWan:
    """A random Wan VAE (spatial factor 8) with a few thousand weights."""
    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=4, z_dim=Z, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True],
                            latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.5, 2.0, 1.0])


def tiny_transformer() -> WanTransformer3DModel:
    torch.manual_seed(1)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=Z,
        out_channels=Z, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
        rope_max_seq_len=32)


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory) -> str:
    """A diffusers pipeline directory with ``transformer/`` and ``vae/``."""
    root = tmp_path_factory.mktemp("wan")
    tiny_transformer().save_pretrained(root / "transformer")
    tiny_vae().save_pretrained(root / "vae")
    return str(root)


def wan_args(path: str, out, *extra: str) -> list[str]:
    return ["--preset", "smoke", "--model.backbone", "wan", "--model.path", path,
            "--train.init", "base", "--train.ckpt_every", "1", "--out", str(out), *extra]


def wan_config(path: str, **overrides: str) -> config_lib.Config:
    cfg = config_lib.preset("smoke")
    for key, value in {"model.backbone": "wan", "model.path": path, "train.init": "base",
                       **overrides}.items():
        config_lib.apply_override(cfg, key, value)
    config_lib.validate(cfg)
    return cfg


def test_codec_round_trip_shapes_range_and_normalisation(wan_dir):
    codec = frame_codec(wan_config(wan_dir).model)
    assert isinstance(codec, WanLatentCodec) and codec.latent_size == (4, 4)
    frames = torch.rand(2, 3, 3, 32, 32, requires_grad=True) * 2 - 1
    z = codec.encode(frames)
    assert z.shape == (2, 3, Z, 4, 4) and z.dtype == torch.float32 and not z.requires_grad
    pixels = codec.decode(z)
    assert pixels.shape == (2, 3, 3, 32, 32) and pixels.dtype == torch.float32
    assert not pixels.requires_grad and bool(torch.isfinite(pixels).all())
    assert pixels.min() >= -1 and pixels.max() <= 1
    # one latent frame per frame: a frame encodes alone as it does in a clip
    torch.testing.assert_close(codec.encode(frames[:, 1:2]), z[:, 1:2])
    # the pipeline's normalisation: raw mode latents minus latents_mean over latents_std
    vae = codec.vae
    raw = vae.encode(frames[0, :1].detach().unsqueeze(2)).latent_dist.mode().squeeze(2)
    mean = torch.tensor(vae.config.latents_mean).view(1, Z, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, Z, 1, 1)
    torch.testing.assert_close(z[0, :1], (raw - mean) / std)
    small = WanLatentCodec(vae, pixel_size=16).decode(torch.randn(1, 2, Z, 2, 2))
    assert small.shape == (1, 2, 3, 16, 16)
    # decoded a few frames at a time: each frame's pixels are those of one batch of all
    many = torch.randn(3, 4, Z, 4, 4)
    codec.decode_frames = 12
    whole = codec.decode(many)
    codec.decode_frames = 5
    torch.testing.assert_close(codec.decode(many), whole, rtol=0, atol=0)


def test_rl_iterations_train_the_wan_model_and_resume_exactly(wan_dir, tmp_path):
    args = wan_args(wan_dir, tmp_path, "--steps", "2", "--train.keep_last", "2")
    assert main(args) == 0
    uninterrupted = _final_weights(tmp_path)
    initial = load_wan_world_model(wan_config(wan_dir).model).state_dict()
    assert uninterrupted.keys() == initial.keys()
    moved = [k for k in initial if not torch.equal(uninterrupted[k], initial[k])]
    assert "action_proj.weight" in moved and any(k.startswith("transformer.blocks") for k in moved)
    shutil.rmtree(checkpoint.latest(tmp_path))
    assert main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))


def test_wan_smoke_preset_runs_with_only_the_model_path(wan_dir, tmp_path):
    assert main(["--preset", "wan_smoke", "--model.path", wan_dir, "--out", str(tmp_path)]) == 0
    ckpt = checkpoint.latest(tmp_path)
    assert ckpt.name == "step_00000002"
    saved = config_lib.from_dict(json.loads((ckpt / "meta.json").read_text())["config"])
    assert (saved.preset, saved.model.dtype, saved.model.activation_checkpointing) == (
        "wan_smoke", "bfloat16", True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    # the checkpoint plays: generated latents decoded by the run's VAE
    assert_generates(ckpt, tmp_path / "clip.mp4", saved.model.clip_frames)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_gloo_ranks_train_the_wan_model_as_one_process(wan_dir, tmp_path, mode):
    common = ["--steps", "2", "--reward.std", "global", "--rollout.capture", "eager"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(wan_args(wan_dir, one, *common, "--rollout.groups_per_rank", "2")) == 0
    spawn_ranks(_rank, (wan_args(wan_dir, two, *common, "--rollout.groups_per_rank", "1",
                                 "--train.distributed", mode),), tmp_path)
    # fp32 sums over ranks against one process's accumulation; see test_train's 2-rank test
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)
    _assert_same(_final_weights(one, "old"), _final_weights(two, "old"), atol=5e-5)


def test_conditioning_only_trains_the_conditioning_parameters(wan_dir):
    cfg = wan_config(wan_dir, **{"optim.trainable": "conditioning"})
    model = load_wan_world_model(cfg.model)
    trainer = Trainer(cfg, model, torch.device("cpu"), codec=frame_codec(cfg.model))
    conditioning = {id(p) for p in model.conditioning_parameters()}
    names = {name for name, p in model.named_parameters() if id(p) in conditioning}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.iteration(0)
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and moved <= names and "action_proj.weight" in moved
    hidden = {id(p) for p in model.hidden_matrices()}
    assert hidden and not hidden & conditioning


def test_action_layers_are_drawn_from_the_seed(wan_dir):
    cfg = wan_config(wan_dir).model
    first, again = (load_wan_world_model(cfg, seed=3).state_dict() for _ in range(2))
    _assert_same(first, again)
    other = load_wan_world_model(cfg, seed=4).state_dict()
    assert not torch.equal(first["key_embed.weight"], other["key_embed.weight"])
    assert torch.equal(first["transformer.proj_out.weight"], other["transformer.proj_out.weight"])


def test_flop_estimates_grow_with_the_history(wan_dir):
    model = load_wan_world_model(wan_config(wan_dir).model)
    assert 0 < model.velocity_flops(2, 0) < model.velocity_flops(2, 64)
    assert model.velocity_flops(4, 0) == pytest.approx(2 * model.velocity_flops(2, 0), rel=0.01)
    assert 0 < model.history_flops(1) < model.history_flops(1 + model.clip_frames)


def test_model_path_errors_name_what_is_missing(wan_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*not found"):
        main(wan_args(str(tmp_path / "nowhere"), tmp_path / "out"))
    shutil.copytree(f"{wan_dir}/transformer", tmp_path / "no_vae" / "transformer")
    with pytest.raises(FileNotFoundError, match="vae.*not found"):
        main(wan_args(str(tmp_path / "no_vae"), tmp_path / "out"))
    # an empty path on a preset that does not size a real backbone is the embedded Wan model
    # (the wan presets require the path: tests/test_config.py)
    assert wan_config("").model.path == ""
    tiny = config_lib.preset("smoke")
    config_lib.apply_override(tiny, "model.path", wan_dir)
    with pytest.raises(ValueError, match="model.path"):
        config_lib.validate(tiny)


def test_prompt_embeds_come_from_a_file_and_condition_the_model(wan_dir, tmp_path):
    embeds = torch.randn(1, 3, 16, generator=torch.Generator().manual_seed(7))
    save_file({"prompt_embeds": embeds}, tmp_path / "prompt.safetensors")
    model = load_wan_world_model(
        wan_config(wan_dir, **{"model.prompt_embeds": str(tmp_path / "prompt.safetensors")}).model)
    torch.testing.assert_close(model.prompt_embeds, embeds, rtol=0, atol=0)
    empty = load_wan_world_model(wan_config(wan_dir).model)
    assert torch.equal(empty.prompt_embeds, torch.zeros(1, 1, 16))
    f = model.clip_frames
    x, sigma, actions = torch.randn(1, f, Z, 4, 4), torch.tensor([0.5]), torch.full((f,), 9)
    with torch.no_grad():
        moved = (model.velocity(x, sigma, actions, model.empty_cache())
                 - empty.velocity(x, sigma, actions, empty.empty_cache()))
    assert moved.abs().max() > 1e-4  # the text tokens reach the blocks' cross-attention


def test_prompt_embeds_errors_name_the_file_and_the_tensor(wan_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="model.prompt_embeds.*not found"):
        load_wan_world_model(wan_config(wan_dir, **{
            "model.prompt_embeds": str(tmp_path / "none.safetensors")}).model)
    save_file({"other": torch.zeros(1, 1, 16)}, tmp_path / "wrong.safetensors")
    with pytest.raises(ValueError, match="no tensor 'prompt_embeds'"):
        load_wan_world_model(wan_config(wan_dir, **{
            "model.prompt_embeds": str(tmp_path / "wrong.safetensors")}).model)
    save_file({"prompt_embeds": torch.zeros(1, 2, 8)}, tmp_path / "narrow.safetensors")
    with pytest.raises(ValueError, match=r"prompt_embeds must have shape \[1, L, 16\]"):
        load_wan_world_model(wan_config(wan_dir, **{
            "model.prompt_embeds": str(tmp_path / "narrow.safetensors")}).model)
    tiny = config_lib.preset("smoke")
    config_lib.apply_override(tiny, "model.prompt_embeds", str(tmp_path / "wrong.safetensors"))
    with pytest.raises(ValueError, match="model.prompt_embeds"):
        config_lib.validate(tiny)
