"""A run that trains a subset of the model (``optim.trainable conditioning``, the recipe's
default) checkpoints only what changes: the trained weights of the current and old models and
the optimizer state, with its frozen base named by hash. It resumes exactly, evaluates from the
checkpoint, refuses another base, and whole-model checkpoints still load."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from checkpoint_contents import assert_holds_only_the_trained, tensor_bytes
from safetensors import safe_open

from wc_fast.config import preset
from wc_fast.infra import checkpoint
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import export_world_model, load_checkpoint_model, load_world_model
from wc_fast.train import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _base(path: Path, seed: int = 0) -> Path:
    """A smoke-sized base model file whose zero-initialised layers are drawn too (so the
    conditioning gets a gradient, as on a pretrained base)."""
    torch.manual_seed(seed)
    model = TinyWorldDiT(preset("smoke").model)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.02)
    return export_world_model(model, path, {"steps": 0})


def _args(base: Path, out: Path, steps: int = 2) -> list[str]:
    return ["--preset", "smoke", "--train.init", str(base), "--optim.trainable",
            "conditioning", "--train.ckpt_every", "1", "--train.keep_last", "3", "--steps",
            str(steps), "--out", str(out)]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("partial")
    base = _base(root / "base.safetensors")
    out = root / "run"
    assert main(_args(base, out)) == 0
    return base, out


def _trained(model: TinyWorldDiT) -> dict[str, torch.Tensor]:
    """The weights ``optim.trainable conditioning`` trains, by name."""
    keep = {id(p) for p in model.conditioning_parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) in keep}


def test_the_checkpoint_holds_the_trained_weights_their_ema_and_optimizer_state(run):
    base, out = run
    ckpt = checkpoint.latest(out)
    model = TinyWorldDiT(preset("smoke").model)
    trained = _trained(model)
    assert_holds_only_the_trained(ckpt, trained)
    assert sum(p.nbytes for p in trained.values()) < sum(
        p.nbytes for p in model.parameters()) / 2
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["base"]["path"] == str(base) and len(meta["base"]["sha256"]) == 64


def test_it_resumes_exactly(run, tmp_path):
    base, out = run
    uninterrupted = load_checkpoint_model(checkpoint.latest(out), "cpu").state_dict()
    resumed = tmp_path / "resumed"
    assert main(_args(base, resumed)) == 0
    shutil.rmtree(checkpoint.latest(resumed))  # as if stopped after the first iteration
    assert main([*_args(base, resumed), "--resume"]) == 0
    again = load_checkpoint_model(checkpoint.latest(resumed), "cpu").state_dict()
    assert uninterrupted.keys() == again.keys()
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], again[key]), key


def test_evaluation_loads_the_base_and_the_trained_weights(run):
    base, out = run
    ckpt = checkpoint.latest(out)
    weights = load_checkpoint_model(ckpt, "cpu").state_dict()
    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        held = {key: f.get_tensor(key) for key in f.keys()}
    for key, value in held.items():
        assert torch.equal(weights[key], value), key
    for key, value in load_world_model(base).state_dict().items():
        if key not in held:
            assert torch.equal(weights[key], value), key


def test_another_base_is_refused(run, tmp_path):
    _, out = run
    ckpt = checkpoint.latest(out)
    meta = json.loads((ckpt / "meta.json").read_text())
    other = _base(tmp_path / "other.safetensors", seed=1)
    moved = tmp_path / "moved"
    shutil.copytree(ckpt, moved)
    # the checkpoint's config names its base file: point it at another model of that shape
    meta["config"]["train"]["init"] = str(other)
    meta["sha256"] = checkpoint._meta_digest(meta)
    (moved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="frozen weights"):
        load_checkpoint_model(moved, "cpu")


def test_a_run_that_trains_everything_still_checkpoints_whole_models(tmp_path):
    assert main(["--preset", "smoke", "--steps", "1", "--out", str(tmp_path)]) == 0
    ckpt = checkpoint.latest(tmp_path)
    keys, _ = tensor_bytes(ckpt / "model.safetensors")
    assert keys == set(TinyWorldDiT(preset("smoke").model).state_dict())
    assert "base" not in json.loads((ckpt / "meta.json").read_text())
    assert load_checkpoint_model(ckpt, "cpu") is not None


def test_a_model_with_buffers_that_trains_every_weight_is_not_partial():
    """Buffers are not trained weights: a run that trains every parameter of a model holding
    buffers still checkpoints whole models."""
    from wc_fast.rl.trainer import Trainer

    cfg = preset("smoke")
    model = TinyWorldDiT(cfg.model)
    model.register_buffer("extra", torch.zeros(3))
    assert not Trainer(cfg, model, torch.device("cpu")).partial
