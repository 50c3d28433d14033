"""The evaluation: scoring is right on renders with known labels, and it runs end to end."""

import json

import pytest
import torch

from wc_fast.actions import basic_actions
from wc_fast.config import preset
from wc_fast.eval import EvalSettings, evaluate, main, score_sequences
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import export_world_model
from wc_fast.rewards import load_critic, load_estimator
from wc_fast.world import sample_sequences

SETTINGS = EvalSettings.from_config(preset("cpu"), sequences=3, clips=2, steps=2)


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
    for kind in ("basic", "composite", "composite_2key"):
        assert 0.0 <= a[kind]["accuracy"] <= 1.0
        assert a[kind]["accuracy"] == b[kind]["accuracy"]
        assert len(a[kind]["by_clip"]) == 2
        assert set(a[kind]) >= {"vq", "short", "long", "by_keys"}
    assert {row["set"] for row in a["by_clip"]} == {"basic", "composite", "composite_2key"}
    assert set(a["basic"]["by_keys"]) == {"1"}
    assert set(a["composite_2key"]["by_keys"]) == {"2"}
    assert a["composite_2key"]["by_keys"]["2"]["clips"] == SETTINGS.sequences * SETTINGS.clips
    by_keys = a["composite"]["by_keys"]
    assert set(by_keys) <= {"2", "3", "4"}
    clips = sum(entry["clips"] for entry in by_keys.values())
    assert clips == SETTINGS.sequences * SETTINGS.clips
    weighted = sum(e["accuracy"] * e["clips"] for e in by_keys.values()) / clips
    assert weighted == pytest.approx(a["composite"]["accuracy"])


def test_command_writes_json_and_grid(tmp_path):
    torch.manual_seed(0)
    weights = export_world_model(TinyWorldDiT(preset("smoke").model), tmp_path / "m.safetensors",
                                 {"note": "test"})
    out, grid = tmp_path / "eval.json", tmp_path / "grid.png"
    assert main(["--checkpoint", str(weights), "--json", str(out), "--grid", str(grid),
                 "--sequences", "1", "--clips", "2", "--steps", "2"]) == 0
    result = json.loads(out.read_text())
    assert set(result) >= {"basic", "composite", "composite_2key", "by_clip", "ground_truth"}
    assert grid.is_file() and grid.stat().st_size > 0
