"""Runs that survive faults: NaN/inf updates, preemption signals, extended runs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from gloo_ranks import spawn_ranks

from wc_fast.config import preset
from wc_fast.infra import checkpoint
from wc_fast.infra.preemption import EXIT_PREEMPTED, StopRequest
from wc_fast.models import TinyWorldDiT
from wc_fast.rl.trainer import NumericalFaultError, Trainer
from wc_fast.train import main

SMOKE = ["--preset", "smoke", "--train.ckpt_every", "1"]
REPO = Path(__file__).resolve().parents[1]


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(path) -> dict:
    return checkpoint.read_weights(path, "model")


def _assert_initial(weights: dict) -> None:
    """``weights`` are the smoke preset's random init: no update reached them."""
    torch.manual_seed(preset("smoke").train.seed)
    init = TinyWorldDiT(preset("smoke").model).state_dict()
    for key, value in init.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0, msg=key)


def _nan_gradient_on_updates(monkeypatch, calls: set[int]) -> None:
    """Put a NaN into one gradient in the updates numbered ``calls`` (0-based)."""
    real, count = Trainer._all_reduce_grads, iter(range(10**6))

    def poisoned(self):
        real(self)
        if next(count) in calls:
            next(p for p in self.model.parameters() if p.grad is not None).grad[0] = torch.nan

    monkeypatch.setattr(Trainer, "_all_reduce_grads", poisoned)


def test_a_nan_gradient_skips_its_update_and_is_counted(tmp_path, monkeypatch):
    _nan_gradient_on_updates(monkeypatch, {0})
    assert main([*SMOKE, "--steps", "2", "--out", str(tmp_path)]) == 0
    assert [r["skipped_updates"] for r in _rows(tmp_path)] == [1, 0]
    _assert_initial(_weights(tmp_path / "step_00000001"))
    first, second = _weights(tmp_path / "step_00000001"), _weights(tmp_path / "step_00000002")
    assert any(not torch.equal(first[k], second[k]) for k in first)  # the next one updated


def _nan_on_rank_one(rank: int, args: list[str]) -> None:
    """Run ``main(args)`` with a NaN put into rank 1's gradient shard (FSDP2) only."""
    if rank == 1:
        real = Trainer._all_reduce_grads

        def poisoned(self):
            real(self)
            shards = (p.grad.to_local() for p in self.model.parameters() if p.grad is not None)
            next(g for g in shards if g.numel()).view(-1)[0] = torch.nan

        Trainer._all_reduce_grads = poisoned
    assert main(args) == 0


@pytest.mark.slow
def test_a_nan_on_one_fsdp2_rank_skips_the_update_on_every_rank(tmp_path):
    spawn_ranks(_nan_on_rank_one, ([*SMOKE, "--steps", "1", "--out", str(tmp_path),
                                    "--train.distributed", "fsdp2"],), tmp_path)
    assert [r["skipped_updates"] for r in _rows(tmp_path)] == [1]
    _assert_initial(_weights(tmp_path / "step_00000001"))


def test_consecutive_nan_losses_stop_the_run_with_a_checkpoint(tmp_path, monkeypatch):
    real = Trainer._accumulate

    def nan_loss(self, item, total):
        _, flops, kl = real(self, item, total)
        return float("nan"), flops, kl

    monkeypatch.setattr(Trainer, "_accumulate", nan_loss)
    with pytest.raises(NumericalFaultError, match=r"2 consecutive updates .*"
                                                  r"train.max_bad_updates=2.* iteration 2"):
        main([*SMOKE, "--steps", "3", "--out", str(tmp_path), "--train.ckpt_every", "100",
              "--train.max_bad_updates", "2"])
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000002"]
    _assert_initial(_weights(tmp_path / "step_00000002"))


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_resumed_run_equals_the_uninterrupted_one(tmp_path):
    args = ["--preset", "smoke", "--steps", "6", "--train.ckpt_every", "100"]
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    # as many threads as this process, so both halves of the run round alike
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "wc_fast.train", *args, "--out",
                             str(stopped)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics, deadline = stopped / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == EXIT_PREEMPTED, output
    saved = checkpoint.latest(stopped)
    assert 1 <= int(saved.name.removeprefix(checkpoint.PREFIX)) < 6
    assert saved.name in output and "continue with --resume" in output
    assert main([*args, "--out", str(stopped), "--resume"]) == 0
    assert main([*args, "--out", str(full)]) == 0
    resumed, uninterrupted = _weights(checkpoint.latest(stopped)), _weights(
        checkpoint.latest(full))
    for key, value in uninterrupted.items():
        torch.testing.assert_close(resumed[key], value, rtol=0, atol=0, msg=key)


def test_a_second_signal_exits_at_once():
    code = ("import sys, time\nfrom wc_fast.infra.preemption import StopRequest\n"
            "with StopRequest():\n    print('ready', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None  # the first signal only asks for a stop
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 128 + signal.SIGINT
    assert "stopping after this iteration" in proc.stderr.read()


def _agree(rank: int, out: str) -> None:
    with StopRequest() as stop:
        assert not stop.agreed(2)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        Path(out, f"rank{rank}").write_text(str(stop.agreed(2)))


@pytest.mark.slow
def test_every_rank_stops_when_one_rank_is_signalled(tmp_path):
    spawn_ranks(_agree, (str(tmp_path),), tmp_path)
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["True", "True"]


def test_a_resumed_run_extends_with_its_ema_schedule_kept(tmp_path):
    assert main([*SMOKE, "--steps", "2", "--out", str(tmp_path)]) == 0
    with pytest.warns(UserWarning, match=r"train.steps changed from 2 to 4: continuing from "
                                         r"step 2; .*keeps its original length of 2"):
        assert main([*SMOKE, "--steps", "4", "--out", str(tmp_path), "--resume"]) == 0
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["ema_decay"] for r in rows[1:]] == [preset("smoke").ema.end] * 3
    with pytest.raises(checkpoint.CheckpointError, match="train.steps=3 is below the step"):
        main([*SMOKE, "--steps", "3", "--out", str(tmp_path), "--resume"])
