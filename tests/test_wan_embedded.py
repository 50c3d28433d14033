"""The embedded Wan world model (model.backbone wan, no model.path): pixel frames, its config,
pretraining through ``python -m wc_fast.pretrain --base wan``, export/load and evaluation."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from wc_fast import config as config_lib
from wc_fast.cli import parse_run_args
from wc_fast.config import ModelConfig
from wc_fast.models import WorldModel
from wc_fast.models import pretrained as pretrained_lib
from wc_fast.models.pretrained import (
    export_world_model,
    load_base_model,
    load_checkpoint_model,
    load_world_model,
    new_world_model,
)
from wc_fast.models.wan.embedded import embedded_wan_model
from wc_fast.models.wan.model import WanWorldModel

# a tiny embedded Wan model on the world's 32x32 frames: 8x8 patches, width 24, one block
TINY = ModelConfig(backbone="wan", reference_frame=False, patch=8, dim=24, heads=2, depth=1)
TINY_ARGS = ["--base", "wan", "--model.dim", "24", "--model.heads", "2", "--model.depth", "1"]


def tiny_model(seed: int = 0) -> WanWorldModel:
    torch.manual_seed(seed)
    model = embedded_wan_model(TINY, seed=seed).eval()
    with torch.no_grad():  # a trained model's action projection is not zero
        model.action_proj.weight.normal_(std=0.2)
    return model


@torch.no_grad()
def test_pixel_model_shapes_and_clamping():
    model = tiny_model()
    assert isinstance(model, WorldModel) and model.pixels and model.cfg == TINY
    assert model.clip_shape == (4, 3, 32, 32)
    assert model.transformer.config.in_channels == model.transformer.config.out_channels == 3
    assert tuple(model.transformer.config.patch_size) == (1, 8, 8)
    x = torch.randn(2, 4, 3, 32, 32)
    v = model.velocity(x, torch.tensor([0.2, 0.9]), torch.tensor([[1] * 4, [40] * 4]),
                       model.empty_cache())
    assert v.shape == x.shape and torch.isfinite(v).all()
    bounded = model.bound_frames(3 * x)
    assert bounded.abs().max() <= 1 and (3 * x).abs().max() > 1
    inside = x.clamp(-1, 1)
    torch.testing.assert_close(model.bound_frames(inside), inside, rtol=0, atol=0)
    # a model on latents leaves its frames unbounded
    latent = WanWorldModel(model.transformer, clip_frames=4, latent_size=(32, 32))
    torch.testing.assert_close(latent.bound_frames(3 * x), 3 * x, rtol=0, atol=0)


def test_config_selects_the_embedded_model_without_a_path():
    cfg = config_lib.preset("cpu")
    config_lib.apply_base(cfg, "wan")
    config_lib.validate(cfg)
    m = cfg.model
    assert (m.backbone, m.path, m.prediction, m.reference_frame) == ("wan", "", "velocity", True)
    assert type(new_world_model(m)) is WanWorldModel
    for changes, name in (({"prediction": "warp"}, "model.prediction"),
                          ({"lora_rank": 4}, "model.lora_rank"),
                          ({"dim": 36, "heads": 4}, "model.dim")):  # head width 9 is odd
        bad = dataclasses.replace(cfg, model=dataclasses.replace(m, **changes))
        with pytest.raises(ValueError, match=name):
            config_lib.validate(bad)
    # with a path it is the diffusers-directory backbone, which starts from its weights
    pathed = dataclasses.replace(cfg, model=dataclasses.replace(m, path="/some/wan"))
    pathed.train.init = "random"
    with pytest.raises(ValueError, match="train.init"):
        config_lib.validate(pathed)
    with pytest.raises(ValueError, match="model.path"):
        new_world_model(pathed.model)
    with pytest.raises(ValueError, match="--base"):
        config_lib.apply_base(config_lib.preset("cpu"), "huge")


def test_base_flag_parses_in_pretrain():
    pretraining = config_lib.PRETRAIN_RUN
    tiny = parse_run_args("p", "d", [], kind=pretraining, with_base=True)
    assert tiny.base == "tiny" and tiny.config.model.backbone == "tiny"
    wan = parse_run_args("p", "d", ["--base", "wan", "--model.depth", "2"], kind=pretraining,
                         with_base=True)
    assert wan.base == "wan" and wan.config.model.backbone == "wan"
    assert wan.config.model.depth == 2  # field overrides apply after the base
    pt = wan.config.pretrain
    assert (pt.composite_fraction, pt.batch_size, pt.max_minutes) == (0.0, 4, 55.0)
    with pytest.raises(SystemExit):  # only entry points that take it
        parse_run_args("p", "d", ["--base", "wan"], kind=pretraining)


def test_base_flag_gives_rl_and_pretraining_runs_one_model():
    """``--base wan`` sets the same model in both; the RL run gets no pretraining section and
    drops what only the tiny model has."""
    rl = parse_run_args("t", "d", ["--base", "wan"], with_base=True).config
    pretraining = parse_run_args("p", "d", ["--base", "wan"], kind=config_lib.PRETRAIN_RUN,
                                 with_base=True).config
    assert rl.model == pretraining.model and rl.model.backbone == "wan"
    assert not hasattr(rl, "pretrain")
    assert rl.train.eval_at_end is False and rl.rollout.warp_exploration == 0.0


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory):
    """Two pretraining steps of a tiny embedded Wan model through the command's entry point."""
    from wc_fast.pretrain import main

    out = tmp_path_factory.mktemp("wan_pretrain")
    assert main([*TINY_ARGS, "--steps", "2", "--out", str(out), "--pretrain.batch_size", "2",
                 "--pretrain.num_clips", "1", "--pretrain.warmup", "1",
                 "--pretrain.eval_every", "1"]) == 0
    return out


def test_pretrain_base_wan_trains_and_exports(pretrained_dir):
    log = [json.loads(line) for line in (pretrained_dir / "loss.jsonl").open()]
    assert [r["step"] for r in log] == [1, 2] and all("held_out_ema" in r for r in log)
    card = json.loads((pretrained_dir / "base_model.json").read_text())
    assert card["steps"] == 2 and card["model"]["backbone"] == "wan"
    assert card["model"]["dim"] == 24 and card["model"]["path"] == ""
    model = load_world_model(pretrained_dir / "base_model.safetensors")
    assert type(model) is WanWorldModel and model.pixels
    # the export is the EMA weights the checkpoint holds, and the step changed them
    ema = load_checkpoint_model(next(pretrained_dir.glob("step_*")), torch.device("cpu"))
    for (name, a), (_, b) in zip(model.state_dict().items(), ema.state_dict().items(),
                                 strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    torch.manual_seed(0)
    fresh = embedded_wan_model(model.cfg, seed=0)
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     fresh.state_dict().values(), strict=True))


@torch.no_grad()
def test_export_load_round_trip(tmp_path):
    model = tiny_model(3)
    path = export_world_model(model, tmp_path / "w.safetensors", {"note": "test"})
    loaded = load_world_model(path)
    assert loaded.cfg == model.cfg and json.loads(path.with_suffix(".json").read_text())[
        "note"] == "test"
    x, sigma, actions = torch.randn(2, 4, 3, 32, 32), torch.tensor([0.3, 0.6]), torch.tensor(
        [[2] * 4, [20] * 4])
    torch.testing.assert_close(loaded.velocity(x, sigma, actions, loaded.empty_cache()),
                               model.velocity(x, sigma, actions, model.empty_cache()),
                               rtol=0, atol=0)


def test_load_base_model_by_name(tmp_path, monkeypatch):
    path = export_world_model(tiny_model(1), tmp_path / "wan_base.safetensors", {})
    monkeypatch.setitem(pretrained_lib.BASE_MODELS, "wan", path)
    assert type(load_base_model("wan")) is WanWorldModel
    assert type(load_checkpoint_model(None, torch.device("cpu"), base="wan")) is WanWorldModel
    with pytest.raises(ValueError, match="base model"):
        load_base_model("huge")
    monkeypatch.setitem(pretrained_lib.BASE_MODELS, "wan", tmp_path / "absent.safetensors")
    with pytest.raises(FileNotFoundError, match="pretrain --base wan"):
        load_base_model("wan")


@pytest.mark.slow
def test_eval_of_a_wan_checkpoint_and_of_base_wan(pretrained_dir, tmp_path, monkeypatch):
    from wc_fast.eval import main

    args = ["--sequences", "1", "--clips", "1", "--sampler-steps", "2"]
    out = tmp_path / "ckpt.json"
    ckpt = next(pretrained_dir.glob("step_*"))
    assert main(["--checkpoint", str(ckpt), "--json", str(out), *args]) == 0
    from_checkpoint = json.loads(out.read_text())
    assert set(from_checkpoint) >= {"basic", "composite", "composite_2key"}
    # --base wan evaluates the shipped weights: here the same model, exported
    monkeypatch.setitem(pretrained_lib.BASE_MODELS, "wan",
                        pretrained_dir / "base_model.safetensors")
    out_base = tmp_path / "base.json"
    assert main(["--base", "wan", "--json", str(out_base), *args]) == 0
    from_base = json.loads(out_base.read_text())
    for kind in ("basic", "composite", "composite_2key"):
        assert from_base[kind]["accuracy"] == from_checkpoint[kind]["accuracy"]
        assert from_base[kind]["vq"] == from_checkpoint[kind]["vq"]


def test_the_embedded_model_works_on_pixels():
    from wc_fast.models.pretrained import frame_codec
    from wc_fast.models.protocol import PixelFrames

    assert isinstance(frame_codec(TINY), PixelFrames)


def test_heldout_loss_scores_every_model_on_one_batch(pretrained_dir, capsys):
    from studies import heldout_loss as study
    from wc_fast.pretrain import flow_matching_loss
    from wc_fast.world import sample_sequences

    path = pretrained_dir / "base_model.safetensors"
    assert study.main([str(path), str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    model = load_world_model(path)
    batch = sample_sequences(study.SEQUENCES, num_clips=study.CLIPS, seed=study.SEED,
                             composite_fraction=0.0)
    with torch.no_grad():
        want = sum(flow_matching_loss(model, batch.frames, batch.actions, shift=study.SHIFT,
                                      gen=torch.Generator().manual_seed(k)).item()
                   for k in range(study.DRAWS)) / study.DRAWS
    assert lines[0].endswith(f"held-out loss {want:.4f}")
    assert study.main([str(path), "--by-sigma"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert len(rows) == len(study.SIGMAS)
    # one row per noise level, highest first: the noisy input's own error falls with sigma
    noisy = [float(r.split("noisy input ")[1].rstrip(")")) for r in rows]
    assert noisy == sorted(noisy, reverse=True)
    # with another sequence's keys the same frames are scored again under those keys
    assert study.main([str(path), "--other-keys"]) == 0
    own, other = capsys.readouterr().out.strip().splitlines()
    assert own.endswith(f"held-out loss {want:.4f}") and "held-out loss (other keys) " in other
    with torch.no_grad():
        rolled = sum(flow_matching_loss(model, batch.frames, batch.actions.roll(1, 0),
                                        shift=study.SHIFT,
                                        gen=torch.Generator().manual_seed(k)).item()
                     for k in range(study.DRAWS)) / study.DRAWS
    assert other.endswith(f"{rolled:.4f}")


def test_shipped_wan_base_is_the_configured_model():
    """The shipped Wan base loads as the model ``--base wan`` configures (its card's sizes,
    the reference frame as extra input channels) and predicts finite velocities."""
    model = load_base_model("wan")
    cfg = parse_run_args("t", "", ["--base", "wan"], with_base=True).config.model
    assert type(model) is WanWorldModel and model.reference_frame
    assert model.transformer.config.in_channels == 2 * model.transformer.config.out_channels
    assert dataclasses.replace(model.cfg, dtype=cfg.dtype) == cfg
    with torch.no_grad():
        v = model.velocity(torch.randn(2, *model.clip_shape), torch.tensor([0.3, 0.8]),
                           torch.tensor([2, 40]).repeat_interleave(4).view(2, 4),
                           model.empty_cache())
    assert torch.isfinite(v).all()


def test_train_base_wan_runs_the_recipe_through_the_actions(tmp_path, monkeypatch):
    """``wc_fast.train --base wan``: the recipe's exploration goes through the Wan model's
    action conditioning; a missing base is named with the command that pretrains it."""
    from wc_fast.train import main

    cfg = parse_run_args("t", "", ["--base", "wan"], with_base=True).config
    assert cfg.model.backbone == "wan" and cfg.rollout.action_exploration > 0
    assert cfg.rollout.warp_exploration == 0
    with monkeypatch.context() as patch:
        patch.setitem(pretrained_lib.BASE_MODELS, "wan", tmp_path / "absent.safetensors")
        with pytest.raises(FileNotFoundError, match="python -m wc_fast.pretrain --base wan"):
            main(["--base", "wan", "--out", str(tmp_path / "missing")])
    out = tmp_path / "run"
    assert main(["--preset", "smoke", "--base", "wan", "--out", str(out), "--model.dim", "32",
                 "--model.heads", "2", "--model.depth", "2", "--rollout.action_exploration",
                 "0.125", "--steps", "1"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["loss"] is not None
