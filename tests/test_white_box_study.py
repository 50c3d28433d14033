"""studies/white_box.py: clip 1 generated as the evaluation generates it, read by five readers,
end to end on the shipped base and a changed copy of it."""

import json

import pytest
import torch

from studies import white_box
from wc_fast.config import build_preset
from wc_fast.eval import EVAL_SEED, EvalSettings, rollout_sequences
from wc_fast.models.pretrained import export_world_model, load_checkpoint_model
from wc_fast.world import sample_sequences

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = EvalSettings.from_config(build_preset("cpu"), sequences=2, clips=1)


@pytest.fixture(scope="module")
def base():
    return load_checkpoint_model(None, torch.device("cpu"))


def test_clip1_is_the_evaluations_clip1_and_its_parts(base):
    data = sample_sequences(2, num_clips=1, seed=EVAL_SEED, composite_fraction=1.0)
    want = rollout_sequences(base, data.frames[:, :1], data.actions, steps=SETTINGS.steps,
                             shift=SETTINGS.shift, seed=EVAL_SEED)
    got = white_box.generate_clip1(base, data.frames[:, :1], data.actions, settings=SETTINGS,
                                   seed=EVAL_SEED)
    torch.testing.assert_close(got["frames"], want, rtol=1e-5, atol=1e-5)
    assert got["flow"].shape == (2, 4, 2, 32, 32)
    assert torch.equal(got["warp_only"][:, 0], data.frames[:, 0])
    assert (got["warp_only"][:, 1:] - got["frames"][:, 1:]).abs().amax() > 0.01
    assert bool((got["residual"] > 0).all())


def test_the_study_runs_end_to_end_and_reports_changes(tmp_path, base, capsys):
    changed = base.fresh_copy()
    changed.load_state_dict(base.state_dict())
    with torch.no_grad():
        changed.affine_flow.bias.add_(torch.tensor([1.5, 0, 0, 0, 0, 0]))  # a pan right
    weights = export_world_model(changed, tmp_path / "changed.safetensors", {"note": "test"})
    out = tmp_path / "white_box.json"
    assert white_box.main(["--checkpoints", "base", str(weights), "--sequences", "2",
                           "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["models"]) == ["base", str(weights)]
    for kind in ("basic", "composite", "composite_2key"):
        assert result["truth"][kind]["white box"] == 1.0
        for name in result["models"]:
            row = result["models"][name][kind]
            assert set(row) == {*white_box.READERS, "residual", "per_sequence"}
            assert all(len(row["per_sequence"][r]) == 2 for r in white_box.READERS)
        change = result["changes"][str(weights)][kind]["white box"]
        assert change["low"] <= change["change"] <= change["high"]
    assert "clip-1 accuracy by reader" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        white_box.main(["--checkpoints", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        white_box.main(["--clips", "2"])


def test_a_schedule_whose_last_step_is_not_the_heads_clip_is_refused(base):
    data = sample_sequences(1, num_clips=1, seed=EVAL_SEED)
    fine = EvalSettings(sequences=1, clips=1, steps=40, shift=1.0)  # last sigma 0.025
    with pytest.raises(ValueError, match="X0_MIN_SIGMA"):
        white_box.generate_clip1(base, data.frames[:, :1], data.actions, settings=fine,
                                 seed=EVAL_SEED)


def test_a_run_directory_is_read_at_its_latest_checkpoint(tmp_path):
    assert white_box.resolve("base") is None
    weights = tmp_path / "m.safetensors"
    weights.write_bytes(b"")
    assert white_box.resolve(str(weights)) == str(weights)
    for step in (1, 2):
        (tmp_path / "run" / f"step_{step:08d}").mkdir(parents=True)
    assert white_box.resolve(str(tmp_path / "run")) == str(tmp_path / "run" / "step_00000002")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        white_box.main(["--checkpoints", str(tmp_path / "empty")])


def test_pooled_changes_pool_the_seeds_and_report_the_reader_gaps():
    def model(shift: float) -> dict:
        # every reader reads 0.5 + shift on both sequences, the estimator 0.1 more
        row = {r: [0.5 + shift, 0.5 + shift] for r in white_box.READERS}
        row["estimator"] = [0.6 + shift, 0.6 + shift]
        return {kind: {**{r: v[0] for r, v in row.items()}, "residual": 0.0,
                       "per_sequence": row} for kind in ("basic", "composite_2key")}

    result = {"models": {"base": model(0.0), "s0": model(0.1), "s1": model(0.3)}}
    pooled = white_box.pooled(result)
    assert pooled["basic"]["white box"]["change"] == pytest.approx(0.2)  # the seeds' mean
    assert pooled["basic"]["white box"]["seeds"] == 2
    assert pooled["composite_2key"]["estimator - white box"]["change"] == pytest.approx(0.0)
    assert white_box.pooled(result, ["s1"])["basic"]["fit"]["change"] == pytest.approx(0.3)
    lines = white_box.markdown(result, "recipe")
    assert lines[0].startswith("| set | base, white box | base, fit | base, estimator | "
                               "recipe: white box |")
    assert lines[2].startswith("| basic | 0.500 | 0.500 | 0.600 | +0.200 [+0.100, +0.300] |")
    with pytest.raises(ValueError, match="at least one model"):
        white_box.pooled({"models": {"base": model(0.0)}})
