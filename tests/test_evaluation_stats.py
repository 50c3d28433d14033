"""Paired bootstrap intervals against closed forms on toy cases, and the comparison tables
built from them."""

import json

import numpy as np
import pytest

from wc_fast.measures import paired_bootstrap, sequence_values
from wc_fast.measures.compare import COMPARED, SETS, compare, markdown
from wc_fast.tools.compare import main as compare_main


def test_two_sequences_give_the_exact_bootstrap_distribution():
    """Changes (0, 1): a bootstrap mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the
    95% percentile interval is [0, 1] and the standard error sqrt(var / n) = sqrt(0.25 / 2)."""
    out = paired_bootstrap([1.0, 1.0], [1.0, 2.0], draws=40_000, seed=1)
    assert out["change"] == 0.5
    assert (out["low"], out["high"]) == (0.0, 1.0)
    assert out["se"] == pytest.approx(np.sqrt(0.125), rel=0.02)
    assert (out["sequences"], out["seeds"]) == (2, 1)


def test_interval_matches_the_normal_closed_form_for_many_sequences():
    """For n paired changes the bootstrap mean is near normal with sd = std(d) / sqrt(n)
    (population std): the interval is change +/- 1.96 sd."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=400)
    change = rng.normal(0.3, 1.0, size=400)
    out = paired_bootstrap(base, base + change, draws=20_000, seed=2)
    sd = change.std() / np.sqrt(len(change))
    assert out["change"] == pytest.approx(change.mean())
    assert out["se"] == pytest.approx(sd, rel=0.03)
    assert out["low"] == pytest.approx(change.mean() - 1.96 * sd, abs=0.1 * sd)
    assert out["high"] == pytest.approx(change.mean() + 1.96 * sd, abs=0.1 * sd)


def test_pairing_removes_the_shared_sequence_difficulty():
    """Sequences differ a lot, the change is a constant 0.1: the paired interval is a point."""
    base = np.linspace(0.0, 1.0, 50)
    out = paired_bootstrap(base, base + 0.1, draws=1000)
    assert out["low"] == pytest.approx(0.1) and out["high"] == pytest.approx(0.1)


def test_seeds_are_resampled_too():
    """One sequence, three seeds with changes (0, 0, 3): the seed bootstrap's variance is
    var / S = 2 / 3 (population variance 2)."""
    out = paired_bootstrap([0.0], [[0.0], [0.0], [3.0]], draws=40_000, seed=3)
    assert out["change"] == 1.0
    assert out["se"] ** 2 == pytest.approx(2 / 3, rel=0.03)
    assert (out["low"], out["high"]) == (0.0, 3.0)
    assert out["seeds"] == 3


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="one n"):
        paired_bootstrap([0.0, 1.0], [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="one row per trained seed"):
        paired_bootstrap([[0.0], [1.0]], [[0.0], [1.0], [2.0]])


def test_sequence_values_reads_an_eval_result():
    result = {"basic": {"per_sequence": {"psnr": [[10.0, 20.0], [30.0, 50.0]]}}}
    assert sequence_values(result, "basic", "psnr").tolist() == [15.0, 40.0]
    assert sequence_values(result, "basic", "psnr", slice(0, 1)).tolist() == [10.0, 30.0]
    with pytest.raises(KeyError, match="ssim"):
        sequence_values(result, "basic", "ssim")


def test_final_evaluation_seeds_are_disjoint_from_every_tuning_seed():
    """The reserved sets and their floors share no seed with the tuning or validation sets,
    their floors, the evaluation critic's generations (3500-3502) or the camera fit's renders
    (321); the validation sets share none with the tuning sets."""
    from wc_fast.eval import (
        EVAL_SEED,
        FINAL_EVAL_SEED,
        FLOOR_SEED_OFFSET,
        KINDS,
        SEED_SETS,
        VALIDATION_EVAL_SEED,
    )

    def seeds(base: int) -> set[int]:
        sets = {base + k for k in range(len(KINDS))}
        return sets | {s + FLOOR_SEED_OFFSET for s in sets}

    others = {3500, 3501, 3502, 321}
    assert seeds(FINAL_EVAL_SEED).isdisjoint(seeds(EVAL_SEED) | seeds(VALIDATION_EVAL_SEED)
                                             | others)
    assert seeds(VALIDATION_EVAL_SEED).isdisjoint(seeds(EVAL_SEED) | others)
    assert SEED_SETS == {"tuning": EVAL_SEED, "validation": VALIDATION_EVAL_SEED,
                         "final": FINAL_EVAL_SEED}


def _result(values: dict[str, list[list[float]]], **settings) -> dict:
    base_settings = {"sequences": 2, "clips": 2, "seed": 5, "steps": 10, "shift": 5.0,
                     "trans_thresholds": [0.02, 0.04], "rot_threshold_deg": 1.0}
    return {"settings": {**base_settings, **settings},
            **{kind: {"per_sequence": values} for kind in SETS}}


def test_compare_rows_are_paired_changes_per_slice():
    base = _result({"psnr": [[10.0, 20.0], [30.0, 40.0]]})
    trained = _result({"psnr": [[12.0, 20.0], [32.0, 46.0]]})
    rows = {(r["set"], r["clips"]): r for r in compare(base, [trained], metrics=("psnr",),
                                                          draws=2000)}
    assert set(rows) == {(k, c) for k in SETS for c in ("all clips", "clip 1", "clips 2-on")}
    clip1 = rows["basic", "clip 1"]
    # clip 1 improved by exactly 2 dB in both sequences: the interval is that point
    assert (clip1["base"], clip1["trained"], clip1["change"]) == (20.0, 22.0, 2.0)
    assert clip1["low"] == pytest.approx(2.0) and clip1["high"] == pytest.approx(2.0)
    later = rows["basic", "clips 2-on"]
    assert later["change"] == 3.0 and (later["low"], later["high"]) == (0.0, 6.0)
    table = markdown(compare(base, [trained, trained], metrics=("psnr",), sets=("basic",)))
    assert table[2] == ("| basic | PSNR (dB) | all clips | 25.000 | 27.500 | "
                        "+2.500 [+1.000, +4.000] |")


def test_compare_refuses_unpaired_or_incomplete_results():
    base = _result({"psnr": [[10.0, 20.0], [30.0, 40.0]]})
    with pytest.raises(ValueError, match="seed"):
        compare(base, [_result({"psnr": [[1.0, 2.0], [3.0, 4.0]]}, seed=6)], metrics=("psnr",))
    with pytest.raises(ValueError, match="at least one"):
        compare(base, [], metrics=("psnr",))
    with pytest.raises(KeyError, match="ssim"):
        compare(base, [base], metrics=("ssim",))


def test_compare_command_writes_the_table(tmp_path, capsys):
    base = _result({name: [[0.5, 0.5], [0.5, 0.5]] for name in COMPARED})
    paths = []
    for i, result in enumerate((base, base)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(result))
    out = tmp_path / "table.md"
    assert compare_main([str(paths[0]), str(paths[1]), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 2 + len(SETS) * len(COMPARED) * 3
    assert "+0.000 [+0.000, +0.000]" in lines[-1] and lines[0] in capsys.readouterr().out
