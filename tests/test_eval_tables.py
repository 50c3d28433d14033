"""The evaluation's printed tables show the numbers of the result they are given."""

from rich.console import Console

from wc_fast.eval import KINDS, print_comparison


def _block(accuracy: float, vq: float, three_keys: float) -> dict:
    return {"accuracy": accuracy, "vq": vq,
            "by_keys": {"2": {"accuracy": accuracy, "clips": 6},
                        "3": {"accuracy": three_keys, "clips": 4}}}


def test_comparison_shows_both_runs_the_change_and_the_three_key_row():
    before = {kind: _block(0.25 + 0.1 * i, 1.5, 0.125) for i, kind in enumerate(KINDS)}
    after = {kind: _block(0.5 + 0.1 * i, -2.0, 0.375) for i, kind in enumerate(KINDS)}
    console = Console(record=True, width=120)
    print_comparison(before, after, console, "base vs trained")
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in console.export_text().splitlines() if line.startswith("│")}
    for i, kind in enumerate(KINDS):
        assert rows[kind] == [f"{0.25 + 0.1 * i:.3f}", f"{0.5 + 0.1 * i:.3f}", "+0.250",
                              "1.500", "-2.000"]
    assert rows["composite, 3 keys"] == ["0.125", "0.375", "+0.250", "", ""]
    assert "composite, 4 keys" not in rows
