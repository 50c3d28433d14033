"""studies.final_table: rows trained as the study trains them, evaluated on the reserved seeds,
compared with the base by paired bootstrap; cached evaluations are not run again."""

import json

import pytest

from studies import final_table, replicate
from wc_fast.config import to_dict

SETTINGS = {"sequences": 3, "clips": 2, "seed": 7700001, "steps": 10, "shift": 5.0,
            "trans_thresholds": [0.08, 0.12], "rot_threshold_deg": 2.0}


def _result(shift: float) -> dict:
    """A ``wc_fast.eval --json`` result whose every per-sequence value is ``base + shift``."""
    values = {"accuracy": 0.3, "fit_accuracy": 0.4, "psnr": 20.0, "vq": -3.0}
    per_sequence = {metric: [[v + shift + 0.01 * i, v + shift] for i in range(3)]
                    for metric, v in values.items()}
    return {"settings": SETTINGS, "basic": {"per_sequence": per_sequence},
            "composite_2key": {"per_sequence": per_sequence}}


def test_final_table_trains_evaluates_and_tabulates_paired_changes(tmp_path, monkeypatch):
    trained, evaluated = [], []

    def fake_run(row, seed, folder, steps, base="tiny"):
        trained.append((row, seed, base))
        return folder / "step_00000060"

    def fake_evaluate(checkpoint, base, sequences, clips, path, log, seeds):
        assert log.parent == tmp_path / "runs" and seeds == "final"
        evaluated.append(checkpoint)
        result = _result(0.0 if checkpoint is None else 0.1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))  # as `wc_fast.eval --json` writes it
        return result

    monkeypatch.setattr(final_table, "run", fake_run)
    monkeypatch.setattr(final_table, "evaluate_final", fake_evaluate)
    cache = tmp_path / "final"
    args = ["--rows", "recipe:2,recipe_no_exploration", "--sequences", "3", "--clips", "2",
            "--out", str(tmp_path / "runs"), "--cache", str(cache)]
    assert final_table.main(args) == 0
    assert trained == [("recipe", 0, "tiny"), ("recipe", 1, "tiny"),
                       ("recipe_no_exploration", 0, "tiny")]
    assert evaluated[0] is None and len(evaluated) == 4  # the base, then each (row, seed)
    lines = (cache / "tiny_table.md").read_text().splitlines()
    # the camera fit first, the estimator beside it, then their gap
    assert lines[4] == ("| base model | - | 0.405 | 0.305 | -0.100 | 0.410 | 0.405 | 0.305 | "
                        "20.010 | -2.990 |")
    # every sequence changed by exactly +0.1 (both readers alike, so the gap by 0): the
    # interval is that point
    recipe = lines[5]
    assert recipe.startswith(f"| {replicate.TITLES['recipe']} | 2 | +0.100 [+0.100, +0.100] | "
                             "+0.100 [+0.100, +0.100] | +0.000 [+0.000, +0.000] |")
    assert recipe.count("+0.100 [+0.100, +0.100]") == len(final_table.COLUMNS) - 1
    tag = f"3x2_final-{replicate.evaluation_id(3, 2, seeds='final')}"
    # the evaluation's JSON with the row's resolved training config stored in it
    config = replicate.resolved_config("recipe", 1, None)
    path = cache / f"recipe_s1_cfg-{replicate.config_id(config)}_{tag}.json"
    stored = json.loads(json.dumps(to_dict(config)))  # tuples as JSON lists
    assert json.loads(path.read_text()) == dict(_result(0.1), config=stored)

    def nothing_again(*args, **kwargs):
        raise AssertionError("a cached evaluation was run again")

    monkeypatch.setattr(final_table, "run", nothing_again)
    monkeypatch.setattr(final_table, "evaluate_final", nothing_again)
    assert final_table.main(args) == 0


def test_final_table_names_runs_and_evaluations_by_base(tmp_path, monkeypatch):
    assert replicate.evaluation_id(3, 2, seeds="final") != replicate.evaluation_id(3, 2)
    wan = replicate.evaluation_id(3, 2, seeds="final", base="wan")
    assert wan != replicate.evaluation_id(3, 2, seeds="final")
    def recipe_id(base: str) -> str:
        return replicate.config_id(replicate.resolved_config("recipe", 0, None, base), base)

    run_id = recipe_id("wan")
    assert run_id != recipe_id("tiny")
    weights = tmp_path / "wan_base_model.safetensors"
    weights.write_bytes(b"retrained weights")
    card = json.loads(replicate.BASE_MODELS["wan"].with_suffix(".json").read_text())
    weights.with_suffix(".json").write_text(json.dumps(card))
    monkeypatch.setitem(replicate.BASE_MODELS, "wan", weights)
    # RL starts from the shipped base: retrained weights are a new run and a new evaluation
    retrained = replicate.evaluation_id(3, 2, seeds="final", base="wan")
    assert recipe_id("wan") != run_id
    assert retrained != wan
    # a card field added later: at its old value the id made before it existed, else a new one
    ids = {}
    for window in (None, 0, 3):
        card["model"].pop("history_window", None)
        if window is not None:
            card["model"]["history_window"] = window
        weights.with_suffix(".json").write_text(json.dumps(card))
        ids[window] = replicate.evaluation_id(3, 2, seeds="final", base="wan")
    assert ids[None] == ids[0] and ids[3] not in (ids[0], retrained)


@pytest.mark.parametrize("rows", ["recipe:0", "recipe:x", "nope", ""])
def test_final_table_refuses_bad_rows(rows, tmp_path):
    with pytest.raises(SystemExit):
        final_table.main(["--rows", rows, "--cache", str(tmp_path)])


def test_validation_seeds_evaluate_with_their_own_flag_tag_and_cache(tmp_path, monkeypatch):
    calls = []

    def fake_evaluate(checkpoint, base, sequences, clips, path, log, seeds):
        calls.append((seeds, path.parent))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_result(0.0 if checkpoint is None else 0.1)))
        return json.loads(path.read_text())

    monkeypatch.setattr(final_table, "run", lambda row, seed, folder, steps, base="tiny":
                        folder / "step_00000060")
    monkeypatch.setattr(final_table, "evaluate_final", fake_evaluate)
    monkeypatch.setitem(final_table.CACHES, "validation", str(tmp_path / "validation"))
    assert final_table.main(["--seeds", "validation", "--rows", "recipe", "--sequences", "3",
                             "--clips", "2", "--out", str(tmp_path / "runs")]) == 0
    assert calls == [("validation", tmp_path / "validation")] * 2
    tag = f"3x2_validation-{replicate.evaluation_id(3, 2, seeds='validation')}"
    assert (tmp_path / "validation" / f"base_{tag}.json").is_file()
    assert "validation seeds" in (tmp_path / "validation" / "tiny_table.md").read_text()
    # --table writes elsewhere and leaves the committed table alone
    committed = (tmp_path / "validation" / "tiny_table.md").read_text()
    assert final_table.main(["--seeds", "validation", "--rows", "recipe", "--sequences", "3",
                             "--clips", "2", "--out", str(tmp_path / "runs"),
                             "--table", str(tmp_path / "one_row.md")]) == 0
    one_row = (tmp_path / "one_row.md").read_text().splitlines()
    assert "--table" in one_row[0] and one_row[1:] == committed.splitlines()[1:]
    assert (tmp_path / "validation" / "tiny_table.md").read_text() == committed
    assert replicate.evaluation_id(3, 2, seeds="validation") != replicate.evaluation_id(
        3, 2, seeds="final")
    with pytest.raises(ValueError, match="seeds must be one of"):
        replicate.evaluation_id(3, 2, seeds="reserved")


def test_the_final_evaluation_command_names_its_seed_set(tmp_path, monkeypatch):
    commands = []

    def fake_subprocess_run(command, **kwargs):
        commands.append(command)
        (tmp_path / "e.json").write_text("{}")

    monkeypatch.setattr(final_table.subprocess, "run", fake_subprocess_run)
    for seeds in ("final", "validation"):
        final_table.evaluate_final(None, "tiny", 3, 2, tmp_path / "e.json", tmp_path / "e.log",
                                   seeds)
    assert [c[3] for c in commands] == ["--final", "--validation"]
