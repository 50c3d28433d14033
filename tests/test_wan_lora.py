"""LoRA on the Wan backbone (``model.lora_rank``) and activation checkpointing
(``model.activation_checkpointing``): an unchanged model at init, only the adapters and the
conditioning trained, checkpoints of the trained weights over a hashed base with an exact
resume, and the same loss and gradients with blocks rerun in the backward."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import shutil
import sys

import pytest
import torch
from checkpoint_contents import assert_holds_only_the_trained
from gloo_ranks import spawn_ranks
from test_train import _assert_same, _final_weights, _rank
from test_wan_training import tiny_transformer, tiny_vae, wan_args, wan_config
from test_wan_world_model import CLIP, latents, tiny_model, with_action_weights

import wc_fast.models.tiny.dit as tiny_dit
import wc_fast.models.wan.model as wan
import wc_fast.train as train
from wc_fast import config as config_lib
from wc_fast.infra import checkpoint
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import (
    export_world_model,
    frame_codec,
    load_checkpoint_model,
    load_wan_world_model,
    load_world_model,
)
from wc_fast.rl.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

TARGETS = config_lib.ModelConfig().lora_targets
LORA = {"model.lora_rank": "4"}
needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None,
                                reason="peft is not installed (pip install 'wc_fast[lora]')")


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory) -> str:
    """A diffusers pipeline directory with ``transformer/`` and ``vae/``."""
    root = tmp_path_factory.mktemp("wan")
    tiny_transformer().save_pretrained(root / "transformer")
    tiny_vae().save_pretrained(root / "vae")
    return str(root)


@pytest.fixture
def quick_runs(monkeypatch) -> None:
    """Runs without the reward plot and the matmul timing of the MFU column (seconds each on
    this machine; these tests read neither)."""
    monkeypatch.setattr(train, "plot_rewards", lambda rows, path, loss_title="loss": None)
    monkeypatch.setattr(train, "matmul_flops", lambda device, dtype: 1e12)


def names_of(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def trained_names(model: torch.nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


@needs_peft
@torch.no_grad()
def test_lora_at_init_leaves_the_predictions_unchanged():
    model = with_action_weights(tiny_model())
    cache = model.extend_cache(model.empty_cache(), latents(1, 1 + CLIP),
                               torch.tensor([[0, 9, 41]]), sigma=0.05)
    x, sigma, actions = latents(2, CLIP, seed=3), torch.tensor([0.3, 0.8]), torch.tensor([9, 3])
    # every weight frozen for both predictions: whether a weight requires a gradient changes
    # how torch folds a linear over a broadcast batch, and with it the float rounding
    before = model.requires_grad_(False).velocity(x, sigma, actions, cache)
    model.add_lora(4, 0.0, TARGETS)
    lora = names_of(model, model.lora_parameters())
    # both factors of every target in both blocks, self- and cross-attention
    assert len(lora) == 2 * 2 * 10 and all(".lora_A." in n or ".lora_B." in n for n in lora)
    assert trained_names(model) == lora | names_of(model, model.conditioning_parameters())
    assert not names_of(model, model.hidden_matrices()) & lora
    after = model.requires_grad_(False).velocity(x, sigma, actions, cache)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


@needs_peft
def test_lora_targets_must_name_linear_layers():
    with pytest.raises(ValueError, match="model.lora_targets.*to_qq"):
        tiny_model().add_lora(4, 0.0, ("to_q", "to_qq"))


def test_missing_peft_names_the_field_and_the_extra(wan_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    cfg = wan_config(wan_dir, **LORA)
    with pytest.raises(ModuleNotFoundError,
                       match=r"model\.lora_rank.*pip install 'wc_fast\[lora\]'"):
        load_wan_world_model(cfg.model)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'wc_fast\[lora\]'"):
        tiny_model().add_lora(4, 0.0, TARGETS)


@needs_peft
def test_one_iteration_trains_only_the_adapters_and_the_conditioning(wan_dir):
    cfg = wan_config(wan_dir, **LORA)
    model = load_wan_world_model(cfg.model)
    trainer = Trainer(cfg, model, torch.device("cpu"), codec=frame_codec(cfg.model))
    lora = names_of(model, model.lora_parameters())
    trained = lora | names_of(model, model.conditioning_parameters())
    assert trainer.trained == trained
    # no trained weight is a hidden matrix: AdamW alone, over exactly the trained weights
    assert [type(opt).__name__ for opt in trainer.optimizers] == ["AdamW"]
    stepped = {id(p) for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}
    assert names_of(model, [p for p in model.parameters() if id(p) in stepped]) == trained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.iteration(0)
    after, old = model.state_dict(), trainer.old.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved <= trained and moved & lora and "action_proj.weight" in moved
    for name in before.keys() - trained:  # the backbone, bit for bit, in both models
        assert torch.equal(after[name], before[name]) and torch.equal(old[name], before[name])
    # the old model moved toward the current one on the trained weights only
    assert any(not torch.equal(old[k], before[k]) for k in moved & lora)


@needs_peft
def test_lora_checkpoints_hold_the_trained_weights_and_resume_exactly(wan_dir, tmp_path,
                                                                      quick_runs):
    args = wan_args(wan_dir, tmp_path, "--steps", "2", "--train.keep_last", "2",
                    "--model.lora_rank", "4")
    assert train.main(args) == 0
    latest = checkpoint.latest(tmp_path)
    uninterrupted = _final_weights(tmp_path)
    old = _final_weights(tmp_path, "old")
    model = load_wan_world_model(wan_config(wan_dir, **LORA).model)
    assert uninterrupted.keys() == old.keys() == trained_names(model)
    assert_holds_only_the_trained(latest, {n: p for n, p in model.named_parameters()
                                           if p.requires_grad})
    base = json.loads((latest / "meta.json").read_text())["base"]
    frozen = {k: v for k, v in model.state_dict().items() if k not in uninterrupted}
    assert base == {"path": wan_dir, "sha256": checkpoint.weights_sha256(frozen)}
    shutil.rmtree(latest)
    assert train.main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))
    _assert_same(old, _final_weights(tmp_path, "old"))


@needs_peft
def test_a_lora_run_exports_in_peft_format_and_loads_onto_a_fresh_base(wan_dir, tmp_path,
                                                                      quick_runs):
    """``python -m wc_fast.tools.export --peft``: peft loads the adapters onto a fresh base,
    which with the exported conditioning predicts what the trained checkpoint predicts."""
    import peft
    from safetensors.torch import load_file

    from wc_fast.tools.export import export_peft
    from wc_fast.tools.export import main as export

    assert train.main(wan_args(wan_dir, tmp_path / "run", "--steps", "1",
                               "--model.lora_rank", "4")) == 0
    ckpt = checkpoint.latest(tmp_path / "run")
    assert export([str(ckpt), "--out", str(tmp_path / "peft"), "--peft"]) == 0
    trained = load_checkpoint_model(ckpt, torch.device("cpu"))
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (config["r"], config["peft_type"]) == (4, "LORA")
    fresh = load_wan_world_model(wan_config(wan_dir).model)
    root = fresh.lora_root()
    peft.inject_adapter_in_model(peft.LoraConfig(**{k: config[k] for k in (
        "r", "lora_alpha", "target_modules")}), root)
    peft.set_peft_model_state_dict(root,
                                   load_file(tmp_path / "peft" / "adapter_model.safetensors"))
    conditioning = load_file(tmp_path / "peft" / "conditioning.safetensors")
    assert conditioning and not any("lora" in k for k in conditioning)
    fresh.load_state_dict(conditioning, strict=False)
    gen = torch.Generator().manual_seed(0)
    f, shape = trained.clip_frames, trained.clip_shape
    x, sigma = torch.randn(2, *shape, generator=gen), torch.full((2,), 0.5)
    actions = torch.randint(0, 81, (2, f), generator=gen)
    history = torch.randn(1, 1 + f, *shape[1:], generator=gen)
    with torch.no_grad():
        caches = [m.build_cache_parallel(history, torch.zeros(1, 1 + f, dtype=torch.long),
                                         sigma=0.0) for m in (trained, fresh.eval())]
        want = trained.velocity(x, sigma, actions, caches[0])
        got = fresh.velocity(x, sigma, actions, caches[1])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert train.main(wan_args(wan_dir, tmp_path / "full", "--steps", "1")) == 0
    with pytest.raises(ValueError, match="not of a LoRA run"):
        export_peft(checkpoint.latest(tmp_path / "full"), tmp_path / "x")


@pytest.mark.slow
@needs_peft
def test_two_gloo_ranks_train_the_adapters_as_one_process(wan_dir, tmp_path):
    """The adapters' first factors are drawn from train.seed, so both ranks and the one
    process start from the same adapters."""
    common = ["--steps", "2", "--reward.std", "global", "--rollout.capture", "eager",
              "--model.lora_rank", "4"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert train.main(wan_args(wan_dir, one, *common, "--rollout.groups_per_rank", "2")) == 0
    spawn_ranks(_rank, (wan_args(wan_dir, two, *common, "--rollout.groups_per_rank", "1",
                                 "--train.distributed", "ddp"),), tmp_path)
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)
    _assert_same(_final_weights(one, "old"), _final_weights(two, "old"), atol=5e-5)


@pytest.mark.slow
@needs_peft
def test_two_gloo_ranks_checkpoint_the_adapters_sharded_and_resume_exactly(wan_dir, tmp_path):
    """A multi-rank LoRA run's sharded checkpoints hold the trained weights only, name the
    frozen base, and resume bit for bit."""
    args = wan_args(wan_dir, tmp_path / "run", "--steps", "2", "--train.keep_last", "2",
                    "--rollout.capture", "eager", "--model.lora_rank", "4")
    spawn_ranks(_rank, (args,), tmp_path)
    latest = checkpoint.latest(tmp_path / "run")
    meta = checkpoint.read_meta(latest)
    assert meta["format"] == "dcp" and meta["base"]["path"] == wan_dir
    uninterrupted, old = _final_weights(tmp_path / "run"), _final_weights(tmp_path / "run", "old")
    model = load_wan_world_model(wan_config(wan_dir, **LORA).model)
    assert uninterrupted.keys() == old.keys() == trained_names(model)
    shutil.rmtree(latest)
    spawn_ranks(_rank, ([*args, "--resume"],), tmp_path)
    _assert_same(uninterrupted, _final_weights(tmp_path / "run"))
    _assert_same(old, _final_weights(tmp_path / "run", "old"))


@needs_peft
def test_resume_refuses_other_base_weights(wan_dir, tmp_path, quick_runs):
    base = tmp_path / "wan"
    shutil.copytree(wan_dir, base)
    args = wan_args(str(base), tmp_path / "out", "--steps", "1", "--model.lora_rank", "4")
    assert train.main(args) == 0
    saved = checkpoint.latest(tmp_path / "out")
    with pytest.raises(ValueError, match="FrozenBase"):
        checkpoint.load(saved, models={"model": tiny_model()})
    transformer = tiny_transformer()
    with torch.no_grad():
        transformer.blocks[0].ffn.net[2].weight[0, 0] += 1e-3
    transformer.save_pretrained(base / "transformer")
    with pytest.raises(ValueError, match="sha256.*model.path"):
        train.main([*wan_args(str(base), tmp_path / "out", "--steps", "2",
                              "--model.lora_rank", "4"), "--resume"])


def count_calls(monkeypatch, module, name: str = "checkpoint") -> list[int]:
    """Counts the calls of ``module.<name>`` from now on."""
    calls = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def loss_and_gradients(model: torch.nn.Module, frames: torch.Tensor, actions: torch.Tensor,
                       x_t: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A loss of two clips' velocities over a history cache built with gradient (as
    ``update.context_kv recompute_grad`` builds it), and every weight's gradient."""
    cache = model.build_cache_parallel(frames, actions, sigma=0.05)
    v = model.velocity(x_t, torch.tensor([0.3, 0.7]), actions[0, 1:].expand(2, -1), cache)
    loss = v.square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=needs_peft)])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(monkeypatch, lora):
    plain = with_action_weights(tiny_model())
    if lora:
        plain.add_lora(4, 0.0, TARGETS)
        with torch.no_grad():  # nonzero adapters, as after training
            for p in plain.lora_parameters():
                p.normal_(std=0.1)
    rerun = copy.deepcopy(plain)
    rerun.activation_checkpointing = True
    blocks = [0]
    for block in rerun.transformer.blocks:
        block.attn1.register_forward_hook(lambda *_: blocks.__setitem__(0, blocks[0] + 1))
    wrapped = count_calls(monkeypatch, wan)
    frames, actions = latents(1, 1 + CLIP), torch.tensor([[0, 9, 41]])
    with torch.no_grad():  # rollouts keep nothing to rerun
        rerun.velocity(latents(2, CLIP), torch.tensor([0.5, 0.5]), actions[0, 1:],
                       rerun.empty_cache())
    assert wrapped[0] == 0
    blocks[0] = 0
    x_t = latents(2, CLIP, seed=3)
    want, want_grads = loss_and_gradients(plain, frames, actions, x_t)
    got, got_grads = loss_and_gradients(rerun, frames, actions, x_t)
    depth = len(rerun.transformer.blocks)
    # two forwards (cache, clips), each block checkpointed and run again in the backward
    assert wrapped[0] == 2 * depth and blocks[0] == 2 * 2 * depth
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_activation_checkpointing_of_the_embedded_model(monkeypatch):
    torch.manual_seed(0)
    plain = TinyWorldDiT(config_lib.preset("smoke").model)
    with torch.no_grad():  # the zero-initialised output layers pass no gradient back
        plain.out.weight.normal_(std=0.1)
        plain.final_modulation.weight.normal_(std=0.1)
    rerun = copy.deepcopy(plain)
    rerun.cfg = dataclasses.replace(rerun.cfg, activation_checkpointing=True)
    wrapped = count_calls(monkeypatch, tiny_dit)
    c, r = plain.cfg.channels, plain.cfg.resolution
    frames = torch.rand(1, 1 + plain.clip_frames, c, r, r) * 2 - 1
    actions = torch.tensor([[0, *[9] * plain.clip_frames]])
    x_t = torch.randn(2, plain.clip_frames, c, r, r, generator=torch.Generator().manual_seed(1))
    want, want_grads = loss_and_gradients(plain, frames, actions, x_t)
    got, got_grads = loss_and_gradients(rerun, frames, actions, x_t)
    assert wrapped[0] == 2 * len(rerun.blocks)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("overrides,match", [
    ({"model.lora_rank": "-1"}, "model.lora_rank"),
    ({"model.lora_rank": "4"}, "model.lora_rank.*tiny"),
    ({"model.backbone": "wan", "model.lora_alpha": "-2"}, "model.lora_alpha"),
    ({"model.backbone": "wan", **LORA, "model.lora_targets": ""}, "model.lora_targets"),
    ({"model.backbone": "wan", **LORA, "optim.trainable": "conditioning"},
     r"optim.trainable \(with model.lora_rank"),
    ({"model.backbone": "wan", **LORA, "train.distributed": "fsdp2"},
     r"train.distributed \(with model.lora_rank"),
])
def test_lora_fields_are_checked(overrides, match):
    cfg = config_lib.preset("smoke")
    if overrides.get("model.backbone") == "wan":
        overrides = {"model.path": "wan_dir", "train.init": "base", **overrides}
    for key, value in overrides.items():
        config_lib.apply_override(cfg, key, value)
    with pytest.raises(ValueError, match=match):
        config_lib.validate(cfg)


def test_lora_and_checkpointing_fields_parse_and_default_off():
    cfg = wan_config("wan_dir", **LORA, **{"model.lora_targets": "to_q,ffn.net.2",
                                           "model.activation_checkpointing": "true"})
    assert cfg.model.lora_targets == ("to_q", "ffn.net.2") and cfg.model.activation_checkpointing
    default = config_lib.preset("smoke").model
    assert default.lora_rank == 0 and not default.activation_checkpointing
    assert config_lib.from_dict(json.loads(json.dumps(config_lib.to_dict(cfg)))) == cfg


def test_an_exported_model_card_loads_back_with_the_same_config(tmp_path):
    """The card holds the new fields; its JSON lists come back as the config's tuples."""
    model = TinyWorldDiT(config_lib.preset("smoke").model)
    assert load_world_model(export_world_model(model, tmp_path / "m.safetensors", {})).cfg == (
        model.cfg)
