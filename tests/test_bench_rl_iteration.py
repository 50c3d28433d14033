"""The RL-iteration benchmark script runs end to end on the smoke preset and reports sane
numbers (its timings are not asserted: speed is measured by running it, not in tests)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "rl_iteration.py"


def _load():
    spec = importlib.util.spec_from_file_location("rl_iteration", SCRIPT)
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
