"""Checkpoint faults: damaged files, crashes mid-write, a full disk, malicious pickles."""

import errno
import json
import os
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from wc_fast.infra import checkpoint


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(4, 3)


def _save(root, step: int, seed: int = 0):
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return checkpoint.save(root, step, models={"model": model}, config={"seed": seed},
                           state={"optimizers": [opt.state_dict()]}, keep_last=5)


def _saved_weight(path) -> torch.Tensor:
    return load_file(path / "model.safetensors")["weight"]


def test_round_trip_records_hashes_and_restores_rng(tmp_path):
    path = _save(tmp_path, 1)
    meta = json.loads((path / "meta.json").read_text())
    assert sorted(meta["files"]) == ["model.safetensors", "state.pt"]
    draws = (torch.rand(3).tolist(), random.random(), np.random.rand())
    torch.manual_seed(123)
    model = _model(seed=9)
    ckpt = checkpoint.load(path, models={"model": model})
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == draws
    torch.testing.assert_close(model.weight, _saved_weight(path))
    assert ckpt.step == 1 and ckpt.state["optimizers"][0]["state"]


def _truncate(file):
    file.write_bytes(file.read_bytes()[:50])


def _flip_bit(file):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 1
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(("damage", "name", "says"), [
    (_truncate, "model.safetensors", "model.safetensors fails its sha256"),
    (_flip_bit, "state.pt", "state.pt fails its sha256"),
    (os.remove, "model.safetensors", "model.safetensors is missing"),
    (os.remove, "meta.json", "meta.json is missing"),
])
def test_damaged_checkpoint_names_the_file(tmp_path, damage, name, says):
    path = _save(tmp_path, 1)
    damage(path / name)
    model = _model(seed=5)
    before = model.weight.detach().clone()
    with pytest.raises(checkpoint.CheckpointError, match=says):
        checkpoint.load(path, models={"model": model})
    torch.testing.assert_close(model.weight.detach(), before)  # nothing half-loaded


def test_newest_intact_checkpoint_is_loaded_with_a_warning(tmp_path):
    _save(tmp_path, 1, seed=1)
    _flip_bit(_save(tmp_path, 2, seed=2) / "model.safetensors")
    model = _model(seed=7)
    with pytest.warns(UserWarning, match="skipping damaged checkpoint step_00000002"):
        ckpt = checkpoint.load_latest_intact(tmp_path, models={"model": model})
    assert ckpt.step == 1
    torch.testing.assert_close(model.weight, _saved_weight(tmp_path / "step_00000001"))
    _truncate(tmp_path / "step_00000001" / "state.pt")
    with pytest.warns(UserWarning), pytest.raises(checkpoint.CheckpointError,
                                                  match="no intact checkpoint"):
        checkpoint.load_latest_intact(tmp_path, models={"model": model})


def test_every_file_and_both_directories_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    final = _save(tmp_path, 3)
    rename = next(i for i, (kind, _) in enumerate(events) if kind == "replace")
    tmp = events[rename][1]
    synced_before = {path for kind, path in events[:rename] if kind == "fsync"}
    assert {f"{tmp}/{name}" for name in ("model.safetensors", "state.pt", "meta.json")} \
        <= synced_before
    assert tmp in synced_before
    assert events[rename + 1:] == [("fsync", str(tmp_path))]
    assert final.is_dir()


def test_crash_mid_write_leaves_no_checkpoint_under_its_name(tmp_path, monkeypatch):
    _save(tmp_path, 1)

    def killed(obj, f, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]
    # a hard kill leaves its temporary directory behind: it is never taken for a checkpoint,
    # and the next save removes it
    (tmp_path / ".step_00000002.abc").mkdir()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000001"]
    monkeypatch.undo()
    _save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002"]


def test_disk_full_keeps_previous_checkpoints_and_says_what_happened(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    real = checkpoint._write_synced

    def full(path, data):
        if path.name == "state.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(checkpoint, "_write_synced", full)
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"could not write checkpoint step_00000002 .*No space left"):
        _save(tmp_path, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]
    assert checkpoint.load(tmp_path / "step_00000001", models={"model": _model()}).step == 1


class _Payload:
    """Unpickling this creates a marker file: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_state_runs_nothing_and_fails_clearly(tmp_path):
    path = _save(tmp_path, 1)
    marker = tmp_path / "pwned"
    torch.save({"rng": _Payload(marker)}, path / "state.pt")
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["state.pt"] = checkpoint._sha256(path / "state.pt")  # hashes match
    meta["sha256"] = checkpoint._meta_digest(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(checkpoint.CheckpointError, match="refused to unpickle"):
        checkpoint.load(path, models={"model": _model()})
    assert not marker.exists()


def test_checkpoint_without_hashes_loads_unverified_with_a_warning(tmp_path):
    path = _save(tmp_path, 1)
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"], meta["sha256"]  # as written before the hashes were recorded
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match="records no sha256 hashes"):
        assert checkpoint.load(path, models={"model": _model()}).step == 1
