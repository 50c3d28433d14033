"""The bench/ scripts run end to end on the smoke preset and report sane numbers (timings are
not asserted: speed is measured by running the scripts, not in tests)."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str = "rl_iteration"):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rl_iteration_writes_both_sides_phase_times_and_flop_rates(tmp_path, dtype):
    out = tmp_path / "rl.json"
    assert _load().main(["--preset", "smoke", "--device", "cpu", "--json", str(out),
                         "--set", f"model.dtype={dtype}"]) == 0
    result = json.loads(out.read_text())
    assert set(result["ours_phases_s"]) == set(result["official_style_phases_s"])
    assert {"rollout", "reward", "train"} <= set(result["ours_phases_s"])
    assert all(v > 0 for v in result["ours_phases_s"].values())
    assert result["speedup"] == pytest.approx(result["official_style_s"] / result["ours_s"])
    assert result["compute_dtype"] == dtype
    assert 0 < result["flop_fraction"] and 0 < result["mfu"]
    if dtype == "float32":
        assert result["mfu"] == result["flop_fraction"]


def test_reward_agreement_reports_a_pair_fraction_and_a_correlation(capsys):
    assert _load("reward_agreement").main(["--preset", "smoke", "--groups", "2",
                                           "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    fraction = float(out.split("ordered alike: ")[1].split(" = ")[1].split()[0])
    assert 0.0 <= fraction <= 1.0
    assert "correlation of reward IF and evaluation IF" in out
