"""Pretraining: the loss goes down, and an interrupted run resumes exactly."""

import itertools
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from wc_fast.infra import checkpoint
from wc_fast.pretrain import main

SMALL = ["--preset", "smoke", "--pretrain.batch_size", "2", "--pretrain.num_clips", "2",
         "--pretrain.warmup", "1"]


def _weights(path):
    return load_file(path / "base_model.safetensors")


def test_interrupted_run_resumes_exactly(tmp_path):
    args = [*SMALL, "--steps", "4", "--out", str(tmp_path), "--pretrain.ckpt_every", "2"]
    assert main(args) == 0
    uninterrupted = _weights(tmp_path)
    # simulate a crash after the step-2 checkpoint: the step-4 one and the export never happened
    final = checkpoint.latest(tmp_path)
    assert final.name.endswith("00000004")
    shutil.rmtree(final)
    (tmp_path / "base_model.safetensors").unlink()
    assert main([*args, "--resume"]) == 0
    a, b = uninterrupted, _weights(tmp_path)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_resume_refuses_another_config(tmp_path):
    assert main([*SMALL, "--steps", "1", "--out", str(tmp_path)]) == 0
    with pytest.raises(checkpoint.CheckpointError, match="pretrain.lr"):
        main([*SMALL, "--steps", "2", "--out", str(tmp_path), "--resume",
              "--pretrain.lr", "0.1"])


def test_resume_ignores_bookkeeping_but_not_the_noise_levels(tmp_path):
    assert main([*SMALL, "--steps", "1", "--out", str(tmp_path)]) == 0
    assert main([*SMALL, "--steps", "2", "--out", str(tmp_path), "--resume",
                 "--pretrain.keep_last", "3", "--pretrain.eval_every", "7",
                 "--pretrain.device", "cpu"]) == 0
    with pytest.raises(checkpoint.CheckpointError, match="pretrain.shift"):
        main([*SMALL, "--steps", "3", "--out", str(tmp_path), "--resume",
              "--pretrain.shift", "2.0"])


def test_checkpoints_hold_only_the_pretraining_config(tmp_path):
    assert main([*SMALL, "--steps", "1", "--out", str(tmp_path)]) == 0
    saved = json.loads((checkpoint.latest(tmp_path) / "meta.json").read_text())["config"]
    assert set(saved) == {"preset", "model", "pretrain"}


def test_an_rl_field_is_a_usage_error_naming_the_rl_entry_point(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL, "--steps", "1", "--rollout.shift", "2.0"])
    assert exit_info.value.code == 2
    assert "'rollout.shift' belongs to python -m wc_fast.train" in capsys.readouterr().err


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint found"):
        main([*SMALL, "--steps", "1", "--out", str(tmp_path / "empty"), "--resume"])


def test_a_few_steps_lower_the_loss(tmp_path):
    assert main([*SMALL, "--steps", "30", "--out", str(tmp_path), "--pretrain.lr", "1e-3",
                 "--pretrain.ckpt_every", "30", "--pretrain.num_clips", "1"]) == 0
    losses = [json.loads(line)["loss"] for line in (tmp_path / "loss.jsonl").open()]
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5


def test_ema_warmup_follows_the_live_model_early():
    from wc_fast.pretrain import ema_with_warmup

    update = ema_with_warmup(0.995)
    avg, cur = torch.zeros(3), torch.ones(3)
    first = update(avg, cur, torch.tensor(1))
    assert torch.allclose(first, torch.full((3,), 1 - 2 / 11))
    late = update(avg, cur, torch.tensor(10_000))
    assert torch.allclose(late, torch.full((3,), 1 - 0.995))


def _checkpointed_models(directory):
    from torch.optim.swa_utils import AveragedModel

    from wc_fast.config import from_dict
    from wc_fast.models import TinyWorldDiT

    cfg = from_dict(json.loads((directory / "meta.json").read_text())["config"])
    live = TinyWorldDiT(cfg.model)
    ema = AveragedModel(TinyWorldDiT(cfg.model), use_buffers=True)
    checkpoint.load(directory, models={"model": live, "ema": ema}, restore_rng=False)
    return cfg, {"live": live, "ema": ema.module}


def test_held_out_loss_is_logged_every_eval_interval(tmp_path):
    """The logged held-out losses are those of the checkpointed live and EMA models; only the
    newest ``keep_last`` checkpoints stay."""
    from wc_fast.pretrain import held_out_batch, held_out_losses

    assert main([*SMALL, "--steps", "5", "--out", str(tmp_path), "--pretrain.eval_every", "2",
                 "--pretrain.ckpt_every", "2", "--pretrain.keep_last", "2"]) == 0
    records = [json.loads(line) for line in (tmp_path / "loss.jsonl").open()]
    scored = [r["step"] for r in records if "held_out_ema" in r]
    assert scored == [2, 4, 5]
    kept = checkpoint.list_checkpoints(tmp_path)
    assert [int(path.name[-8:]) for path in kept] == [4, 5]
    for path in kept:
        cfg, models = _checkpointed_models(path)
        want = held_out_losses(models, held_out_batch(cfg), cfg)
        record = records[int(path.name[-8:]) - 1]
        assert (record["held_out_live"], record["held_out_ema"]) == pytest.approx(
            (want["live"], want["ema"]), rel=1e-6)
    assert records[-1]["held_out_live"] != records[-1]["held_out_ema"]


def test_max_minutes_stops_checkpoints_and_exports_what_ran(tmp_path, monkeypatch):
    """A spent wall-clock budget ends the run after the current step: the checkpoint, the
    exported weights and the card all say how many steps ran."""
    clock = itertools.count(0, 40)  # every reading 40 s after the last
    monkeypatch.setattr("wc_fast.pretrain.time.perf_counter", lambda: float(next(clock)))
    assert main([*SMALL, "--steps", "50", "--out", str(tmp_path),
                 "--pretrain.max_minutes", "1.5"]) == 0
    card = json.loads((tmp_path / "base_model.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "loss.jsonl").open()]
    assert card["steps"] == len(records) < 50
    assert checkpoint.latest(tmp_path).name.endswith(f"{card['steps']:08d}")
    assert "held_out_ema" in records[-1]


def test_cuda_without_a_gpu_names_the_pretraining_device_field(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="pretrain.device='cuda'"):
        main([*SMALL, "--steps", "1", "--out", str(tmp_path), "--pretrain.device", "cuda"])
