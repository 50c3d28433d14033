"""Experiment tracking: TensorBoard events read back with TensorBoard's own reader, an offline
W&B run read back from its ``.wandb`` file, and the metric names they share."""

import json
import struct
import sys
from pathlib import Path

import pytest

from wc_fast.infra import checkpoint
from wc_fast.infra.metrics import (
    TAGS,
    MetricsLog,
    TensorBoardLog,
    WandbLog,
    tracked_scalars,
    wandb_mode,
)
from wc_fast.train import main

SMOKE = ["--preset", "smoke", "--train.ckpt_every", "1"]


def _events(directory: Path):
    """TensorBoard's own reader over the event files in ``directory``."""
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is not installed (pip install 'wc_fast[tensorboard]')")
    events = accumulator.EventAccumulator(str(directory))
    events.Reload()
    return events


def _scalars(directory: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in _events(directory).Scalars(tag)]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _checkpoint(out: Path, step: int) -> checkpoint.Checkpoint:
    return checkpoint.load(out / f"{checkpoint.PREFIX}{step:08d}", models={},
                           restore_rng=False)


def test_row_keys_map_to_torchtitan_style_names():
    row = {"step": 3, "loss": 0.5, "mfu": 0.25, "rollout_s": 1.5, "new_key": 2,
           "note": "text", "flag": True}
    assert tracked_scalars(row) == {"loss_metrics/loss": 0.5, "mfu(%)": 25.0,
                                    "time_metrics/rollout_s": 1.5, "misc/new_key": 2}


def test_a_run_logs_its_metrics_config_and_plots_to_tensorboard(tmp_path):
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path),
                 "--train.loggers", "jsonl,tensorboard", "--train.eval_at_end", "true",
                 "--train.eval_sequences", "1", "--train.eval_clips", "1"]) == 0
    [row] = _rows(tmp_path)
    events = _events(tmp_path / "tensorboard")
    assert set(events.Tags()["scalars"]) == set(tracked_scalars(row))
    assert {"reward/if_mean", "time_metrics/train_s", "mfu(%)"} <= set(events.Tags()["scalars"])
    for key, (tag, scale) in TAGS.items():
        if key in row:
            [event] = events.Scalars(tag)
            assert (event.step, event.value) == (1, pytest.approx(row[key] * scale, rel=1e-6))
    [text] = events.Tensors("config/text_summary")
    config = text.tensor_proto.string_val[0].decode().removeprefix("```json").removesuffix("```")
    assert json.loads(config) == _checkpoint(tmp_path, 1).config
    for tag in ("plots/rewards", "plots/rollouts"):
        [image] = events.Images(tag)
        assert image.step == 1 and image.width > 0 and image.height > 0


def test_resume_drops_events_after_the_resumed_step(tmp_path):
    board = tmp_path / "tb"
    log = MetricsLog(tmp_path / "m.jsonl", trackers=[TensorBoardLog(board)])
    for step in (1, 2, 3):
        log.append({"step": step, "loss": float(step)})
    log.close()
    log = MetricsLog(tmp_path / "m.jsonl", resume_step=1,
                     trackers=[TensorBoardLog(board, resume_step=1)])
    log.append({"step": 2, "loss": 20.0})
    log.close()
    assert _scalars(board, "loss_metrics/loss") == [(1, 1.0), (2, 20.0)]


def _wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file, parsed with wandb's protobuf ``Record``: a 7-byte file
    header, then LevelDB-log framing (32 KiB blocks of chunks, each with a 7-byte header of
    crc32, length and type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, chunks, i = [], b"", 7
    while i + 7 <= len(data):
        if 32768 - i % 32768 < 7:  # a block's tail too short for a header is padding
            i += 32768 - i % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[i:i + 7])
        if kind == 0:
            break
        chunks += data[i + 7:i + 7 + length]
        i += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(chunks))
            chunks = b""
    return records


def _wandb_run(directory: Path) -> tuple[dict, dict[int, dict]]:
    """The config and the history (step -> key -> value) of the offline run in
    ``directory``."""
    [path] = directory.glob("run-*.wandb")
    config, history = {}, {}
    for record in _wandb_records(path):
        if record.HasField("run"):
            config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        if record.HasField("history"):
            row = {}
            for item in record.history.item:  # an image's fields come as [tag, field] keys
                *parents, name = item.nested_key or [item.key]
                target = row
                for parent in parents:
                    target = target.setdefault(parent, {})
                target[name] = json.loads(item.value_json)
            history.setdefault(row["_step"], {}).update(row)
    return config, history


def test_an_offline_wandb_run_logs_and_resume_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'wc_fast[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    args = [*SMOKE, "--out", str(out), "--train.loggers", "jsonl,wandb"]
    assert main([*args, "--steps", "1"]) == 0
    with pytest.warns(UserWarning, match="train.steps changed from 1 to 2"):
        assert main([*args, "--steps", "2", "--resume"]) == 0
    run_id = _checkpoint(out, 1).state["wandb_run_id"]
    assert _checkpoint(out, 2).state["wandb_run_id"] == run_id
    first, resumed = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert first.name.endswith(f"-{run_id}") and resumed.name.endswith(f"-{run_id}")
    rows = _rows(out)
    for directory, row in ((first, rows[0]), (resumed, rows[1])):
        config, history = _wandb_run(directory)
        saved = _checkpoint(out, row["step"]).config  # the config of the run that wrote it
        assert {k: config[k] for k in saved} == saved
        logged = history[row["step"]]
        assert {tag: logged[tag] for tag in tracked_scalars(row)} == pytest.approx(
            tracked_scalars(row), rel=1e-6)
        image = logged["plots/rewards"]
        assert image["_type"] == "image-file" and (directory / "files" / image["path"]).is_file()


def test_wandb_goes_offline_without_an_api_key(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_mode() == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password secret\n")
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() is None  # wandb reads the user's choice itself


def test_missing_wandb_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'wc_fast\[wandb\]'"):
        WandbLog(tmp_path, config={}, name="run")


class _FakeWandb:
    """What a run asks of ``wandb``: ``init``'s settings, the artifacts it logs."""

    def __init__(self) -> None:
        self.settings: dict = {}
        self.artifacts: list[tuple[str, dict, list[str], list[str]]] = []
        fake = self

        class Artifact:
            def __init__(self, name, type, metadata):  # noqa: A002 - wandb's own keyword
                self.name, self.metadata, self.dirs = name, metadata, []

            def add_dir(self, path):
                self.dirs.append(path)

        class Run:
            id = "fake-run"

            def log(self, values, step):
                pass

            def log_artifact(self, artifact, aliases):
                fake.artifacts.append((artifact.name, artifact.metadata, artifact.dirs, aliases))

            def finish(self):
                pass

        self.Artifact, self.Run = Artifact, Run

    def init(self, **settings):
        self.settings = settings
        return self.Run()

    def Image(self, path):  # noqa: N802 - wandb's own name
        return path


def test_wandb_project_entity_group_tags_and_checkpoint_artifacts(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = tmp_path / "run"
    assert main([*SMOKE, "--out", str(out), "--train.loggers", "jsonl,wandb",
                 "--train.wandb_project", "p", "--train.wandb_entity", "team",
                 "--train.wandb_group", "sweep1", "--train.wandb_tags", "a,b",
                 "--train.wandb_checkpoints", "true", "--train.reader_gap_every", "0"]) == 0
    assert {k: fake.settings[k] for k in ("project", "entity", "group", "tags")} == {
        "project": "p", "entity": "team", "group": "sweep1", "tags": ["a", "b"]}
    assert [(a[0], a[1], a[3]) for a in fake.artifacts] == [
        ("fake-run-checkpoint", {"step": s}, [f"step_{s}", "latest"]) for s in (1, 2)]
    assert [Path(a[2][0]).name for a in fake.artifacts] == ["step_00000001", "step_00000002"]


def test_wandb_settings_left_empty_are_wandbs_own(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert main([*SMOKE, "--out", str(tmp_path / "run"), "--train.loggers", "jsonl,wandb",
                 "--steps", "1", "--train.reader_gap_every", "0"]) == 0
    assert (fake.settings["project"], fake.settings["entity"], fake.settings["group"],
            fake.settings["tags"]) == ("wc_fast", None, None, None)
    assert fake.artifacts == []
