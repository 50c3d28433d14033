"""The evaluation's printed tables show the numbers of the result they are given."""

import re

from rich.console import Console

from wc_fast.eval import KINDS, print_comparison


def _block(accuracy: float, fit: float | None, vq: float, three_keys: float) -> dict:
    block = {"accuracy": accuracy, "vq": vq,
             "by_keys": {"2": {"accuracy": accuracy, "clips": 6},
                         "3": {"accuracy": three_keys, "clips": 4}}}
    return block if fit is None else {**block, "fit_accuracy": fit}


def _rows(before: dict, after: dict) -> dict:
    """The accuracy table's rows by set, from the printout at a log's 80 columns (no cell may
    be cut)."""
    console = Console(record=True, width=80)
    print_comparison(before, after, console, "base vs trained")
    text = console.export_text()
    assert "…" not in text
    lines = text.split("visual quality")[0].splitlines()
    rows = {}
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in KINDS or cells[0].endswith(" keys"):
            rows[cells[0]] = cells[1:]
    return rows


def test_comparison_shows_the_fit_first_the_estimator_and_the_reader_gap():
    before = {kind: _block(0.25 + 0.1 * i, 0.25, 1.5, 0.125) for i, kind in enumerate(KINDS)}
    after = {kind: _block(0.5 + 0.1 * i, 0.375, -2.0, 0.375) for i, kind in enumerate(KINDS)}
    rows = _rows(before, after)
    for i, kind in enumerate(KINDS):
        # the estimator gains 0.250, the fit 0.125: the reader gap grows by 0.125
        assert rows[kind] == ["0.250", "0.375", "+0.125", f"{0.25 + 0.1 * i:.3f}",
                              f"{0.5 + 0.1 * i:.3f}", "+0.250", "+0.125"]
    assert rows["3 keys"] == ["-", "-", "-", "0.125", "0.375", "+0.250", "-"]
    assert "4 keys" not in rows


def test_comparison_prints_vq_in_its_own_table():
    before = {kind: _block(0.25, 0.25, 1.5, 0.125) for kind in KINDS}
    after = {kind: _block(0.5, 0.375, -2.0, 0.375) for kind in KINDS}
    console = Console(record=True, width=80)
    print_comparison(before, after, console, "base vs trained")
    vq = console.export_text().split("visual quality")[1]
    assert "basic" in vq and "1.500" in vq and "-2.000" in vq and "-3.500" in vq


def test_comparison_of_results_without_the_fit_shows_dashes():
    before = {kind: _block(0.25, None, 1.5, 0.125) for kind in KINDS}
    after = {kind: _block(0.5, None, -2.0, 0.375) for kind in KINDS}
    assert _rows(before, after)["basic"][:3] == ["-", "-", "-"]
