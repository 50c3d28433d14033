"""The evaluation: scoring is right on renders with known labels, and it runs end to end."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from wc_fast import eval as eval_cli
from wc_fast.actions import basic_actions
from wc_fast.config import preset
from wc_fast.eval import (
    EVAL_SEED,
    EvalSettings,
    add_reader_gap,
    evaluate,
    horizons,
    main,
    print_table,
    score_sequences,
    summarize,
)
from wc_fast.infra import checkpoint
from wc_fast.measures import NPZ_KEYS
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import export_world_model, load_checkpoint_model
from wc_fast.rewards import load_critic, load_estimator
from wc_fast.world import sample_sequences

SETTINGS = EvalSettings.from_config(preset("cpu"), sequences=3, clips=2, steps=2)
TRUTH_KEYS = ("accuracy", "vq", "fit_accuracy", "psnr", "ssim", "rot_err_deg", "trans_err",
              "psnr_floor", "ssim_floor", "frechet", "frechet_floor")


def test_ground_truth_renders_score_high_and_wrong_labels_score_low():
    data = sample_sequences(6, num_clips=2, seed=424242, composite_fraction=0.0)
    estimator, critic = load_estimator("eval"), load_critic()
    acc, vq = score_sequences(data.frames, data.actions, clip_frames=4, settings=SETTINGS,
                              estimator=estimator, critic=critic)
    assert acc.shape == vq.shape == (6, 2)
    assert acc.mean() >= 0.9
    # relabel every clip with a different basic action: the same frames must now score ~0
    basic = torch.tensor(basic_actions())
    wrong = basic[(torch.searchsorted(basic.sort().values, data.actions) + 3) % 8]
    wrong_acc, _ = score_sequences(data.frames, wrong, clip_frames=4, settings=SETTINGS,
                                   estimator=estimator, critic=critic)
    assert wrong_acc.mean() <= 0.1


def test_evaluate_runs_end_to_end_and_is_deterministic(tmp_path):
    torch.manual_seed(0)
    model = TinyWorldDiT(preset("smoke").model).eval()
    a = evaluate(model, SETTINGS)
    b = evaluate(model, SETTINGS)
    sets = ("basic", "composite", "composite_2key")
    assert set(a) == {"settings", "ground_truth", "by_clip", *sets}
    assert a["settings"] == {k: getattr(SETTINGS, k) for k in EvalSettings.__slots__}
    for kind in sets:
        assert 0.0 <= a[kind]["accuracy"] <= 1.0
        assert a[kind]["accuracy"] == b[kind]["accuracy"]
        assert len(a[kind]["by_clip"]) == 2
        assert set(a[kind]) == {"accuracy", "vq", "by_keys", "by_clip", "short", "long",
                                "metrics", "per_sequence", "fit_accuracy", "reader_gap"}
        # the reader gap: the evaluation estimator's accuracy minus the classical fit's
        assert a[kind]["fit_accuracy"] == a[kind]["metrics"]["all"]["fit_accuracy"]
        assert a[kind]["reader_gap"] == pytest.approx(
            a[kind]["accuracy"] - a[kind]["fit_accuracy"])
        assert set(a["ground_truth"][kind]) == {"accuracy", "vq", "fit_accuracy", "rot_err_deg",
                                                "trans_err"}
        metrics = a[kind]["metrics"]
        assert set(metrics) == {"all", "short", "long", "clip1", "clips_2_on", "by_clip"}
        for block in (*(metrics[h] for h in ("all", "short", "long", "clip1", "clips_2_on")),
                      *metrics["by_clip"]):
            assert set(block) >= set(TRUTH_KEYS), kind
        assert metrics["clip1"]["accuracy"] == pytest.approx(a[kind]["by_clip"][0]["accuracy"])
        assert metrics["all"]["psnr"] == pytest.approx(
            torch.tensor(a[kind]["per_sequence"]["psnr"]).mean().item())
        assert set(a[kind]["per_sequence"]) == {k for k in TRUTH_KEYS if not k.startswith("fre")}
        assert torch.tensor(a[kind]["per_sequence"]["ssim"]).shape == (SETTINGS.sequences, 2)
        assert a[kind]["metrics"] == b[kind]["metrics"]
    assert [(row["set"], row["clip"]) for row in a["by_clip"]] == [
        (kind, c) for kind in sets for c in (1, 2)]
    assert all(set(row) == {"set", "clip", "accuracy", "vq", "fit_accuracy", "reader_gap"}
               for row in a["by_clip"])
    assert set(a["basic"]["by_keys"]) == {"1"}
    assert set(a["composite_2key"]["by_keys"]) == {"2"}
    assert a["composite_2key"]["by_keys"]["2"]["clips"] == SETTINGS.sequences * SETTINGS.clips
    by_keys = a["composite"]["by_keys"]
    assert set(by_keys) <= {"2", "3", "4"}
    clips = sum(entry["clips"] for entry in by_keys.values())
    assert clips == SETTINGS.sequences * SETTINGS.clips
    weighted = sum(e["accuracy"] * e["clips"] for e in by_keys.values()) / clips
    assert weighted == pytest.approx(a["composite"]["accuracy"])


def test_command_writes_json_grid_and_frames(tmp_path):
    torch.manual_seed(0)
    weights = export_world_model(TinyWorldDiT(preset("smoke").model), tmp_path / "m.safetensors",
                                 {"note": "test"})
    out, grid, frames = tmp_path / "eval.json", tmp_path / "grid.png", tmp_path / "frames"
    assert main(["--checkpoint", str(weights), "--json", str(out), "--grid", str(grid),
                 "--save-frames", str(frames), "--sequences", "1", "--clips", "2",
                 "--sampler-steps", "2"]) == 0
    result = json.loads(out.read_text())
    assert set(result) >= {"basic", "composite", "composite_2key", "by_clip", "ground_truth"}
    assert set(result["basic"]["metrics"]["clip1"]) >= set(TRUTH_KEYS)
    assert grid.is_file() and grid.stat().st_size > 0
    data = sample_sequences(1, num_clips=2, seed=EVAL_SEED, composite_fraction=0.0)
    for kind in ("basic", "composite", "composite_2key"):
        saved = np.load(frames / f"{kind}.npz")
        assert set(saved.files) == set(NPZ_KEYS)
        assert saved["generated"].shape == saved["ground_truth"].shape == (1, 9, 3, 32, 32)
        assert saved["actions"].shape == (1, 8)
        for key in ("c2w_true", "c2w_commanded", "c2w_fit"):
            assert saved[key].shape == (1, 9, 4, 4), key
    basic = np.load(frames / "basic.npz")
    assert np.array_equal(basic["actions"], data.actions.numpy())
    assert np.allclose(basic["c2w_true"], data.c2w.numpy())
    assert np.allclose(basic["c2w_commanded"][:, 0], data.c2w[:, 0].numpy())


@pytest.mark.parametrize("clips,want", [
    (1, {"short": [0], "long": [0]}),
    (2, {"short": [0], "long": [1]}),
    (3, {"short": [0], "medium": [1], "long": [2]}),
    (6, {"short": [0, 1], "medium": [2, 3], "long": [4, 5]}),
    (7, {"short": [0, 1], "medium": [2, 3, 4], "long": [5, 6]}),
])
def test_horizons_are_the_first_middle_and_last_third(clips, want):
    got = {name: list(range(clips))[sl] for name, sl in horizons(clips).items()}
    assert {name: idx for name, idx in got.items() if idx} == want


def test_summarize_report_on_a_hand_built_input():
    """Two sequences x six clips; accuracy c / 10 at clip c (VQ its negative), keys pressed
    1 on the first sequence and 2 on the second."""
    acc = torch.arange(6, dtype=torch.float32).repeat(2, 1) / 10
    acc[1] += 0.2
    keys = torch.tensor([[1] * 6, [2] * 6])
    block = summarize(acc, -acc, keys)
    assert set(block) == {"accuracy", "vq", "by_keys", "by_clip", "short", "medium", "long"}
    assert block["accuracy"] == pytest.approx(0.35)
    assert block["vq"] == pytest.approx(-0.35)
    for name, mean in (("short", 0.15), ("medium", 0.35), ("long", 0.55)):
        assert block[name] == pytest.approx({"accuracy": mean, "vq": -mean}), name
    assert block["by_keys"] == {"1": {"accuracy": pytest.approx(0.25), "clips": 6},
                                "2": {"accuracy": pytest.approx(0.45), "clips": 6}}
    assert block["by_clip"] == [{"clip": c + 1, "accuracy": pytest.approx(c / 10 + 0.1),
                                 "vq": pytest.approx(-(c / 10 + 0.1))} for c in range(6)]


def _assert_weights(model, weights: dict) -> None:
    state = model.state_dict()
    assert state.keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(state[key], value), key


def test_eval_loads_a_training_checkpoint_directory(tmp_path):
    """Its current model, not the old one."""
    from wc_fast.train import main as train

    assert train(["--preset", "smoke", "--steps", "1", "--out", str(tmp_path / "run")]) == 0
    directory = checkpoint.latest(tmp_path / "run")
    model = load_checkpoint_model(directory, torch.device("cpu"))
    _assert_weights(model, load_file(directory / "model.safetensors"))
    old = load_file(directory / "old.safetensors")
    assert any(not torch.equal(model.state_dict()[k], old[k]) for k in old)


def test_eval_loads_a_pretraining_checkpoint_directory_as_its_ema(tmp_path):
    from wc_fast.pretrain import main as pretrain

    assert pretrain(["--preset", "smoke", "--pretrain.batch_size", "1", "--pretrain.num_clips",
                     "1", "--steps", "2", "--out", str(tmp_path)]) == 0
    model = load_checkpoint_model(checkpoint.latest(tmp_path), torch.device("cpu"))
    _assert_weights(model, load_file(tmp_path / "base_model.safetensors"))
    live = load_file(checkpoint.latest(tmp_path) / "model.safetensors")
    assert any(not torch.equal(model.state_dict()[k], live[k]) for k in live)


def test_printed_table_puts_each_horizon_under_its_column():
    from rich.console import Console

    block = {"accuracy": 0.5, "vq": 0.25, "short": {"accuracy": 0.111},
             "medium": {"accuracy": 0.222}, "long": {"accuracy": 0.333},
             "by_keys": {}, "by_clip": [{"clip": 1, "accuracy": 0.5}],
             "metrics": {"all": {"fit_accuracy": 0.375},
                         "by_clip": [{"clip": 1, "fit_accuracy": 0.375}]}}
    add_reader_gap(block)
    assert block["reader_gap"] == 0.125 and block["by_clip"][0]["reader_gap"] == 0.125
    result = {kind: block for kind in ("basic", "composite", "composite_2key")}
    result["ground_truth"] = {kind: {"accuracy": 0.999} for kind in result}
    console = Console(record=True, width=80)  # a log's width: no cell may be cut
    print_table(result, console=console)
    text = console.export_text()
    assert "…" not in text
    lines = text.splitlines()
    header = next(line for line in lines if "short" in line)
    assert header.index("acc") < header.index("short") < header.index("medium") \
        < header.index("long") < header.index("gap")
    row = next(line for line in lines if line.strip("│ ").startswith("basic"))
    assert row.split() == ["basic", "0.375", "0.111", "0.222", "0.333", "0.500", "+0.125",
                           "0.250"]
    assert "the estimator on the true renders: basic 0.999" in text
    by_clip = [line for line in lines if line.strip("│ ").startswith("basic")][1]
    assert "0.38 / 0.50" in by_clip


class _Evaluated(Exception):
    """Stops the command once it has its evaluation settings."""


def test_eval_takes_config_overrides_and_the_old_steps_spelling(tmp_path, monkeypatch):
    """``--section.field VALUE`` sets the preset's fields the evaluation reads, ``--config``
    reads them from a file; ``--steps`` still sets the sampler steps, with a warning naming
    ``--sampler-steps``."""
    seen = []

    def evaluate(model, settings, **kw):
        seen.append(settings)
        raise _Evaluated

    monkeypatch.setattr(eval_cli, "evaluate", evaluate)
    monkeypatch.setattr(eval_cli, "load_checkpoint_model", lambda *a, **k: None)
    monkeypatch.setattr(eval_cli, "load_estimator", lambda *a, **k: None)
    (tmp_path / "eval.yaml").write_text("inherits: cpu\nrollout:\n  steps: 7\n")
    for args in (["--rollout.steps", "3", "--reward.trans_thresholds", "0.1,0.2"],
                 ["--config", str(tmp_path / "eval.yaml")]):
        with pytest.raises(_Evaluated):
            eval_cli.main(args)
    with pytest.warns(FutureWarning, match="--sampler-steps"), pytest.raises(_Evaluated):
        eval_cli.main(["--steps", "5"])
    assert [s.steps for s in seen] == [3, 7, 5]
    assert seen[0].trans_thresholds == (0.1, 0.2)
    with pytest.raises(SystemExit):
        eval_cli.main(["--rollout.bogus", "1"])
