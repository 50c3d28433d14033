"""Training WorldPlay through the normal trainer: the presets, the HunyuanVideo-1.5 VAE codec,
and two RL iterations of the tiny random model (python -m wc_fast.models.worldplay.tiny) end to
end with checkpoints and an exact resume."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from checkpoint_contents import assert_holds_only_the_trained
from gloo_ranks import spawn_ranks
from test_train import _assert_same, _final_weights, _rank
from video_check import assert_generates

from wc_fast import config as config_lib
from wc_fast.infra import checkpoint
from wc_fast.models.pretrained import frame_codec, load_worldplay_world_model
from wc_fast.models.worldplay.model import WorldPlayWorldModel
from wc_fast.models.worldplay.tiny import write_tiny_checkpoint
from wc_fast.models.worldplay.vae import HunyuanLatentCodec
from wc_fast.train import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("worldplay")))


def smoke_config(path: str, **overrides: str) -> config_lib.Config:
    cfg = config_lib.build_preset("worldplay_smoke")
    for key, value in {"model.path": path, **overrides}.items():
        config_lib.apply_override(cfg, key, value)
    config_lib.validate(cfg)
    return cfg


@pytest.mark.parametrize("name", ["worldplay", "worldplay_lora", "worldplay_smoke"])
def test_presets_need_the_model_path_and_describe_the_run(name):
    with pytest.raises(ValueError, match="model.path"):
        config_lib.preset(name)
    cfg = config_lib.build_preset(name)
    assert cfg.model.backbone == "worldplay" and cfg.model.context_sigma == 0.014
    assert cfg.model.clip_frames == 4 and cfg.model.activation_checkpointing
    expected = {"worldplay": ("fsdp2", 0, 12, 40), "worldplay_lora": ("ddp", 64, 12, 40),
                "worldplay_smoke": ("ddp", 0, 4, 4)}[name]
    assert (cfg.train.distributed, cfg.model.lora_rank, cfg.rollout.group_size,
            cfg.rollout.steps) == expected


def test_codec_round_trip_shapes_and_range(tiny_dir):
    codec = frame_codec(smoke_config(tiny_dir).model)
    assert isinstance(codec, HunyuanLatentCodec) and codec.latent_size == (8, 8)
    frames = torch.rand(2, 3, 3, 32, 32) * 2 - 1
    z = codec.encode(frames)
    assert z.shape == (2, 3, 4, 8, 8) and z.dtype == torch.float32
    # frame by frame: a frame encodes alone as it does among others
    torch.testing.assert_close(codec.encode(frames[1:, 2:]), z[1:, 2:])
    pixels = codec.decode(z)
    assert pixels.shape == (2, 3, 3, 32, 32) and pixels.min() >= -1 and pixels.max() <= 1


def test_loader_reads_the_official_layout_and_the_prompt_file(tiny_dir):
    cfg = smoke_config(tiny_dir, **{"model.prompt_embeds": f"{tiny_dir}/prompt.safetensors"})
    model = load_worldplay_world_model(cfg.model)
    assert isinstance(model, WorldPlayWorldModel)
    assert model.text_tokens == 5 + 3 and model.clip_shape == (4, 4, 8, 8)


def test_smoke_preset_trains_two_iterations_and_resumes_exactly(tiny_dir, tmp_path):
    args = ["--preset", "worldplay_smoke", "--model.path", tiny_dir, "--out", str(tmp_path),
            "--train.keep_last", "2"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    uninterrupted = _final_weights(tmp_path)
    initial = load_worldplay_world_model(smoke_config(tiny_dir).model).state_dict()
    assert uninterrupted.keys() == initial.keys()
    moved = {k for k in initial if not torch.equal(uninterrupted[k], initial[k])}
    assert "action_in.mlp.2.weight" in moved and "double_blocks.0.img_attn_q.weight" in moved
    shutil.rmtree(checkpoint.latest(tmp_path))
    assert main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))
    # the checkpoint plays: generated latents decoded by the run's VAE
    assert_generates(checkpoint.latest(tmp_path), tmp_path / "clip.mp4",
                     smoke_config(tiny_dir).model.clip_frames)


def test_lora_run_checkpoints_only_what_it_trains(tiny_dir, tmp_path):
    pytest.importorskip("peft")
    args = ["--preset", "worldplay_smoke", "--model.path", tiny_dir, "--out", str(tmp_path),
            "--model.lora_rank", "4", "--train.steps", "1"]
    assert main(args) == 0
    saved = _final_weights(tmp_path)
    assert any("lora_A" in k for k in saved) and "action_in.mlp.2.weight" in saved
    assert "double_blocks.0.txt_attn_q.weight" not in saved
    model = load_worldplay_world_model(smoke_config(tiny_dir, **{"model.lora_rank": "4"}).model)
    assert_holds_only_the_trained(checkpoint.latest(tmp_path), {
        n: p for n, p in model.named_parameters() if p.requires_grad})
    # peft's format: the adapters of the double blocks load onto a fresh base, which with the
    # exported conditioning predicts what the checkpoint predicts
    import peft
    from safetensors.torch import load_file

    from wc_fast.models.pretrained import load_checkpoint_model
    from wc_fast.tools.export import export_peft

    export_peft(checkpoint.latest(tmp_path), tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    fresh = load_worldplay_world_model(smoke_config(tiny_dir).model)
    peft.inject_adapter_in_model(peft.LoraConfig(**{k: config[k] for k in (
        "r", "lora_alpha", "target_modules")}), fresh.lora_root())
    peft.set_peft_model_state_dict(fresh.lora_root(),
                                   load_file(tmp_path / "peft" / "adapter_model.safetensors"))
    fresh.load_state_dict(load_file(tmp_path / "peft" / "conditioning.safetensors"),
                          strict=False)
    trained = load_checkpoint_model(checkpoint.latest(tmp_path), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    f, shape = trained.clip_frames, trained.clip_shape
    x, actions = torch.randn(2, *shape, generator=gen), torch.randint(0, 81, (2, f), generator=gen)
    history = torch.randn(1, 1 + f, *shape[1:], generator=gen)
    with torch.no_grad():
        out = [m.velocity(x, torch.full((2,), 0.5), actions, m.build_cache_parallel(
            history, torch.zeros(1, 1 + f, dtype=torch.long), sigma=0.0))
            for m in (trained, fresh.eval())]
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=0)


@pytest.mark.slow
def test_two_gloo_ranks_with_fsdp2_train_as_one_process(tiny_dir, tmp_path):
    common = ["--preset", "worldplay_smoke", "--model.path", tiny_dir, "--reward.std",
              "global", "--train.steps", "1"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*common, "--out", str(one), "--rollout.groups_per_rank", "2"]) == 0
    spawn_ranks(_rank, ([*common, "--out", str(two), "--rollout.groups_per_rank", "1",
                         "--train.distributed", "fsdp2"],), tmp_path)
    # fp32 sums over ranks against one process's accumulation; see test_train's 2-rank test
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)


def test_memory_script_measures_the_checkpointed_residual_and_the_cache():
    from studies import worldplay_memory as memory

    measured = memory.measure_tiny()
    # with checkpointing a block keeps only its fp32 input: 4 bytes per token and channel
    assert measured["ckpt"] == 4.0 and measured["full"] > 10 * measured["ckpt"]
    assert measured["cache_measured"] == measured["cache_formula"]
