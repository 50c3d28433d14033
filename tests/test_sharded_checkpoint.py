"""Sharded checkpoints of multi-rank runs (torch.distributed.checkpoint), written in the
background or not; format versions; exporting weights from either format."""

import errno
import json
import shutil

import pytest
import torch
from gloo_ranks import spawn_ranks
from safetensors.torch import load_file
from torch import nn

from wc_fast import config
from wc_fast.infra import checkpoint
from wc_fast.infra.sharded_checkpoint import ShardedWriter
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import load_checkpoint_model
from wc_fast.tools.export import export
from wc_fast.tools.export import main as export_main
from wc_fast.train import main

ARGS = ["--preset", "smoke", "--steps", "3", "--train.ckpt_every", "1", "--train.keep_last",
        "3", "--train.reader_gap_every", "0"]


def _rank(rank: int, args: list[str]) -> None:
    assert main(args) == 0


def _flip_bit(file) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 1
    file.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_background_written_sharded_run_resumes_exactly_and_falls_back_past_damage(
        tmp_path):
    """Two ranks write every checkpoint in the background; a copy stopped after step 2
    resumes (writing synchronously) to the same weights bit for bit; a damaged shard is
    skipped for the previous checkpoint; a killed write's temporary directory is no
    checkpoint and the next save removes it."""
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    spawn_ranks(_rank, ([*ARGS, "--out", str(run), "--train.async_checkpoint", "true"],),
                tmp_path)
    last = checkpoint.latest(run)
    meta = checkpoint.read_meta(last)
    assert (meta["format"], meta["format_version"], meta["world_size"]) == ("dcp", 2, 2)
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"} <= set(meta["files"])
    shutil.copytree(run, resumed)
    shutil.rmtree(checkpoint.latest(resumed))
    (resumed / ".step_00000003.dcp").mkdir()  # a write killed before its commit
    (resumed / ".step_00000003.dcp" / "__0_0.distcp").write_bytes(b"partial")
    assert [p.name for p in checkpoint.list_checkpoints(resumed)] == ["step_00000001",
                                                                      "step_00000002"]
    spawn_ranks(_rank, ([*ARGS, "--out", str(resumed), "--resume"],), tmp_path)
    assert not (resumed / ".step_00000003.dcp").exists()
    want = export(last, tmp_path / "want")
    got = export(checkpoint.latest(resumed), tmp_path / "got")
    for a, b in zip(want, got, strict=True):
        wa, wb = load_file(a), load_file(b)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    evaluated = load_checkpoint_model(last, torch.device("cpu")).state_dict()  # wc_fast.eval
    exported = load_file(want[0])
    assert all(torch.equal(evaluated[k], exported[k]) for k in exported)

    _flip_bit(last / "__1_0.distcp")
    cfg = config.preset("smoke")
    models = {"model": TinyWorldDiT(cfg.model), "old": TinyWorldDiT(cfg.model)}
    with pytest.warns(UserWarning, match="skipping damaged checkpoint step_00000003: .*"
                                         "__1_0.distcp fails its sha256"):
        loaded = checkpoint.load_latest_intact(run, models=models)
    assert loaded.step == 2
    saved = load_file(export(run / "step_00000002", tmp_path / "two")[0])
    for key, value in models["model"].state_dict().items():
        assert torch.equal(value, saved[key]), key


def _single(root):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    return model, checkpoint.save(root, 1, models={"model": model}, config={}, state={})


def test_a_single_file_checkpoint_exports_its_weights(tmp_path, capsys):
    model, path = _single(tmp_path / "run")
    assert export_main([str(path), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "model.safetensors")
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_export_refuses_a_damaged_checkpoint(tmp_path):
    _, path = _single(tmp_path / "run")
    _flip_bit(path / "model.safetensors")
    with pytest.raises(checkpoint.CheckpointError, match="model.safetensors fails its sha256"):
        export(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _rewrite_meta(path, change) -> None:
    meta = json.loads((path / "meta.json").read_text())
    change(meta)
    meta["sha256"] = checkpoint._meta_digest(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def test_a_version_1_checkpoint_still_loads_and_a_newer_version_is_refused(tmp_path):
    model, path = _single(tmp_path)
    for key in ("format", "format_version", "world_size"):  # as version 1 wrote it
        _rewrite_meta(path, lambda m, key=key: m.pop(key))
    fresh = nn.Linear(4, 3)
    loaded = checkpoint.load(path, models={"model": fresh})
    assert loaded.step == 1 and loaded.world_size is None
    assert torch.equal(fresh.weight, model.weight)
    _rewrite_meta(path, lambda m: m.update(format_version=checkpoint.FORMAT_VERSION + 1))
    with pytest.raises(checkpoint.CheckpointError, match="format version 3, newer than this "
                                                         "wc_fast reads"):
        checkpoint.load(path, models={"model": fresh})


def test_a_failed_commit_removes_the_written_shards_and_says_so(tmp_path, monkeypatch):
    """Disk full while rank 0 commits: a CheckpointError naming the checkpoint, no temporary
    left, the earlier checkpoint untouched."""
    _single(tmp_path)
    tmp = tmp_path / ".step_00000002.dcp"
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"shard")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "commit", full)
    writer = ShardedWriter(tmp_path, rank=0, group=None, asynchronous=False)
    commit = {"state": {}, "models": ["model"], "config": {}, "keep_last": 2, "base": None,
              "run_id": None, "world_size": 2}
    with pytest.raises(checkpoint.CheckpointError, match=r"could not commit checkpoint "
                                                         r"\.step_00000002\.dcp .*No space left"):
        writer._commit(tmp, 2, commit)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]
