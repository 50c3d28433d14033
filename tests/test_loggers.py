"""Experiment tracking: TensorBoard events read back with TensorBoard's own reader."""

import json

import pytest

from wc_fast.metrics import MetricsLog
from wc_fast.train import main

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is not installed (pip install 'wc_fast[tensorboard]')")


def _scalars(directory, tag: str) -> list[tuple[int, float]]:
    events = event_accumulator.EventAccumulator(str(directory))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_a_run_logs_its_metrics_to_tensorboard(tmp_path):
    assert main(["--preset", "smoke", "--steps", "1", "--out", str(tmp_path),
                 "--train.loggers", "jsonl,tensorboard"]) == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    [(step, value)] = _scalars(tmp_path / "tensorboard", "if_mean")
    assert step == 1 and value == pytest.approx(row["if_mean"])


def test_resume_drops_events_after_the_resumed_step(tmp_path):
    board = tmp_path / "tb"
    log = MetricsLog(tmp_path / "m.jsonl", tensorboard=board)
    for step in (1, 2, 3):
        log.append({"step": step, "loss": float(step)})
    log.close()
    log = MetricsLog(tmp_path / "m.jsonl", resume_step=1, tensorboard=board)
    log.append({"step": 2, "loss": 20.0})
    log.close()
    assert _scalars(board, "loss") == [(1, 1.0), (2, 20.0)]
