"""The old model and the KL's reference hold copies of the trained weights only, over the
current model's own frozen weights (``wc_fast.rl.optim.frozen_copy``), and training is bit for
bit what it was with whole copies.

The tiny base's recipe trains only the conditioning pathway (``optim.trainable
conditioning``), so the backbone is held once instead of three times; 3 iterations of NFT and
GRPO, with and without a KL to the initial model, against the same runs with whole copies.
"""

import pytest
import torch

from wc_fast import config as config_lib
from wc_fast.models import TinyWorldDiT
from wc_fast.rl import optim
from wc_fast.rl.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

RULES = {
    "nft": {},
    "nft_kl": {"nft.kl_beta": "0.1"},
    "grpo": {"train.update": "flow_grpo"},
    "grpo_kl": {"train.update": "flow_grpo", "grpo.kl_beta": "0.05"},
}


def _config(overrides: dict[str, str]) -> config_lib.Config:
    """The smoke preset training the conditioning pathway, as the recipe does on the shipped
    base (smoke's random model stands in for it: see :func:`_model`)."""
    cfg = config_lib.preset("smoke")
    for key, value in overrides.items():
        config_lib.apply_override(cfg, key, value)
    config_lib.validate(cfg)
    cfg.optim.trainable = "conditioning"
    return cfg


def _model(cfg: config_lib.Config) -> TinyWorldDiT:
    """A random smoke model whose zero-initialised layers (the output head among them) are
    drawn too, so that the conditioning pathway gets a gradient, as on a pretrained base."""
    torch.manual_seed(cfg.train.seed)
    model = TinyWorldDiT(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.02)
    return model


def _run(overrides: dict[str, str], steps: int = 3) -> tuple[Trainer, list]:
    cfg = _config(overrides)
    trainer = Trainer(cfg, _model(cfg), torch.device("cpu"))
    rows = [trainer.iteration(step) for step in range(steps)]
    return trainer, rows


def _whole_copies(monkeypatch) -> None:
    real = optim.frozen_copy
    for module in ("wc_fast.rl.optim", "wc_fast.rl.updates.base"):
        monkeypatch.setattr(f"{module}.frozen_copy",
                            lambda model, share_untrained=True, on_meta=False, real=real: real(
                                model, share_untrained=False, on_meta=on_meta))


@pytest.mark.slow
@pytest.mark.parametrize("rule", list(RULES))
def test_three_iterations_equal_whole_copies_bit_for_bit(monkeypatch, rule):
    shared, shared_rows = _run(RULES[rule])
    with monkeypatch.context() as patch:
        _whole_copies(patch)
        whole, whole_rows = _run(RULES[rule])
    assert whole.old.state_dict().keys() == shared.old.state_dict().keys()
    assert not _shares(whole.old, whole.model)
    for key in ("loss", "kl", "if_mean", "vq_mean", "r_std", "skipped_updates"):
        got = [getattr(row, key) for row in shared_rows]
        assert got == [getattr(row, key) for row in whole_rows], key
    assert all(row.loss is not None and row.skipped_updates == 0 for row in shared_rows)
    for name in ("model", "old", "ref"):
        a, b = getattr(shared, name), getattr(whole, name)
        if a is None:
            assert b is None and "kl" not in rule
            continue
        for (key, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(x, y), f"{name}.{key}"


def _shares(copy: torch.nn.Module, model: torch.nn.Module) -> set[str]:
    """Names of ``copy``'s parameters that are ``model``'s own tensors."""
    own = {p.data_ptr() for p in model.parameters()}
    return {name for name, p in copy.named_parameters() if p.data_ptr() in own}


@pytest.mark.parametrize("kl", [False, True])
def test_old_and_reference_share_the_frozen_weights(kl):
    cfg = _config({"nft.kl_beta": "0.1"} if kl else {})
    trainer = Trainer(cfg, _model(cfg), torch.device("cpu"))
    frozen = {n for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert frozen and trained
    copies = [trainer.old] + ([trainer.ref] if kl else [])
    assert (trainer.ref is not None) == kl
    for copy in copies:
        assert _shares(copy, trainer.model) == frozen
        assert not any(p.requires_grad for p in copy.parameters())
        assert not copy.training
    held = {p.data_ptr() for m in (trainer.model, *copies) for p in m.parameters()}
    count = {id(p) for p in trainer.model.parameters()}
    assert len(held) == len(count) + len(copies) * len(trained)


def test_a_copy_on_the_meta_device_has_the_structure_and_no_storage():
    """What FSDP2 shards before the copy's shards are filled from the model's."""
    cfg = _config({})
    model = _model(cfg)
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    structure = optim.frozen_copy(model, on_meta=True)
    assert [(n, p.shape, p.dtype) for n, p in structure.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in model.named_parameters()]
    assert all(t.is_meta for t in (*structure.parameters(), *structure.buffers()))
    assert not any(p.requires_grad for p in structure.parameters()) and not structure.training
    # the model itself is untouched
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())


def test_full_training_keeps_whole_copies():
    cfg = _config({})
    cfg.optim.trainable = "all"
    trainer = Trainer(cfg, _model(cfg), torch.device("cpu"))
    assert not _shares(trainer.old, trainer.model)


BF16_MODELS = {
    "tiny": {"model.dtype": "bfloat16"},
    "tiny_kl": {"model.dtype": "bfloat16", "nft.kl_beta": "0.1"},
    "wan": {"model.dtype": "bfloat16", "model.backbone": "wan", "model.reference_frame": "false",
            "model.dim": "24", "model.heads": "2", "model.depth": "1"},
}


def _bf16_run(overrides: dict[str, str], steps: int = 2) -> tuple[Trainer, list]:
    from wc_fast.models.pretrained import new_world_model

    cfg = _config(overrides)
    torch.manual_seed(cfg.train.seed)
    model = new_world_model(cfg.model, seed=cfg.train.seed)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.02)
    trainer = Trainer(cfg, model, torch.device("cpu"))
    return trainer, [trainer.iteration(step) for step in range(steps)]


@pytest.mark.slow
@pytest.mark.parametrize("backbone", list(BF16_MODELS))
def test_frozen_block_matrices_in_bf16_train_bit_for_bit_as_fp32(monkeypatch, backbone):
    """A bf16 model that trains its conditioning holds its frozen block matrices in bf16 (the
    autocast dtype), and the KL's reference every block matrix, and it trains exactly as with
    fp32 ones (whose values, rounded, they are)."""
    held, held_rows = _bf16_run(BF16_MODELS[backbone])
    hidden = {id(p) for p in held.model.hidden_matrices()}
    in_blocks = [p for unit in held.model.shard_units() for p in unit.parameters()
                 if id(p) in hidden and not p.requires_grad]
    assert in_blocks and all(p.dtype == torch.bfloat16 for p in in_blocks)
    assert all(p.dtype == torch.float32 for p in held.model.parameters() if p.requires_grad)
    with monkeypatch.context() as patch:
        for module in ("wc_fast.rl.trainer", "wc_fast.rl.optim"):  # the model's, the reference's
            patch.setattr(f"{module}.hold_frozen_matrices_in", lambda model, dtype: 0)
        fp32, fp32_rows = _bf16_run(BF16_MODELS[backbone])
    assert all(p.dtype == torch.float32 for p in fp32.model.parameters())
    assert [r.loss for r in held_rows] == [r.loss for r in fp32_rows]
    assert all(r.loss is not None for r in held_rows)
    if held.ref is not None:  # frozen whole: every block matrix held in bf16
        in_blocks = [m.weight for unit in held.ref.shard_units() for m in unit.modules()
                     if isinstance(m, torch.nn.Linear)]
        assert in_blocks and all(w.dtype == torch.bfloat16 for w in in_blocks)
        assert [r.kl for r in held_rows] == [r.kl for r in fp32_rows]
    for name in ("model", "old", "ref")[:2 if held.ref is None else 3]:
        for (key, x), y in zip(getattr(held, name).state_dict().items(),
                               getattr(fp32, name).state_dict().values(), strict=True):
            assert torch.equal(x, y.to(x.dtype)), f"{name}.{key}"
