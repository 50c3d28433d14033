"""Runs that cannot be corrupted: each test injects one fault and checks it is refused clearly
or survived with nothing lost (one writer per directory, no silent reuse of a run directory,
pruning within a run's lineage, torn logs, malformed checkpoints and model cards, finite
blow-ups, paths and sizes checked before setup, one-line CLI errors)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from wc_fast import config
from wc_fast import eval as eval_cli
from wc_fast.cli import run_main
from wc_fast.infra import checkpoint
from wc_fast.infra.metrics import MetricsLog
from wc_fast.infra.run_dir import LOCK_NAME, RunDirError, RunLock, claim
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import (
    export_world_model,
    load_checkpoint_model,
    load_world_model,
)
from wc_fast.pretrain import main as pretrain_main
from wc_fast.rl.trainer import NumericalFaultError
from wc_fast.train import main

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["--preset", "smoke", "--train.ckpt_every", "1"]


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _hold_lock(directory: Path) -> subprocess.Popen:
    """A child process holding ``directory``'s lock until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        from wc_fast.infra.run_dir import RunLock
        with RunLock({str(directory)!r}):
            print("locked", flush=True)
            sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- one writer per directory -------------------------------------------------------------------

def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirError, match=rf"in use by pid {holder.pid} on host "
                                              rf"{socket.gethostname()}"):
            main([*SMOKE, "--steps", "1", "--out", str(tmp_path)])
    finally:
        holder.communicate("")
    assert not checkpoint.list_checkpoints(tmp_path)  # refused before it wrote anything
    with RunLock(tmp_path):  # free again once the holder ended
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert (tmp_path / LOCK_NAME).read_text() == ""  # released cleanly


def test_pretraining_takes_the_same_lock(tmp_path):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirError, match=f"in use by pid {holder.pid}"):
            pretrain_main(["--preset", "smoke", "--steps", "1", "--out", str(tmp_path)])
    finally:
        holder.communicate("")


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path):
    dead = _dead_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead, "host": socket.gethostname(),
                                                  "since": "x", "command": "killed run"}))
    with pytest.warns(UserWarning, match=rf"stale lock .* pid {dead} .*killed run"), \
            RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_the_lock_of_a_killed_writer_is_taken_over(tmp_path):
    holder = _hold_lock(tmp_path)
    holder.kill()  # SIGKILL: no release, the lock file still names it
    holder.communicate()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid
    with pytest.warns(UserWarning, match=f"stale lock .* pid {holder.pid} "), RunLock(tmp_path):
        pass


def test_a_lock_file_naming_a_live_process_here_is_refused_even_unlocked(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid,
                                                      "host": socket.gethostname()}))
        with pytest.raises(RunDirError, match=f"pid {sleeper.pid} .*is running"):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


# -- a used directory is not silently reused ----------------------------------------------------

def _used(directory: Path) -> None:
    model = nn.Linear(2, 2)
    checkpoint.save(directory, 3, models={"model": model}, config={}, state={})
    (directory / "metrics.jsonl").write_text('{"step": 3}\n')


def test_a_fresh_run_into_a_used_directory_is_refused(tmp_path):
    _used(tmp_path)
    with pytest.raises(RunDirError, match=r"already holds a run \(step_00000003, "
                                          r"metrics.jsonl\).*--resume.*--overwrite"):
        main([*SMOKE, "--steps", "1", "--out", str(tmp_path)])
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 3}\n'  # untouched


def test_overwrite_deletes_the_previous_run_and_resume_keeps_it(tmp_path):
    _used(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    claim(tmp_path, resume=True, overwrite=False)
    assert checkpoint.list_checkpoints(tmp_path)
    claim(tmp_path, resume=False, overwrite=True)
    assert not checkpoint.list_checkpoints(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resume_and_overwrite_together_are_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*SMOKE, "--out", str(tmp_path), "--resume", "--overwrite"])
    assert "not allowed with argument" in capsys.readouterr().err


# -- pruning by write order within a lineage ----------------------------------------------------

def _save(root: Path, step: int, run_id: str | None, keep_last: int = 2) -> Path:
    return checkpoint.save(root, step, models={"model": nn.Linear(2, 2)}, config={},
                           state={}, keep_last=keep_last, run_id=run_id)


def test_pruning_follows_write_order_within_one_lineage(tmp_path):
    for step in (1, 2, 5):
        _save(tmp_path, step, "a")
    # resumed from an older checkpoint: what it writes now is newer than step 5
    _save(tmp_path, 3, "a")
    _save(tmp_path, 4, "a")
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000003",
                                                                     "step_00000004"]
    assert checkpoint.latest(tmp_path).name == "step_00000004"


def test_another_lineage_is_never_pruned_and_its_checkpoint_is_not_taken_for_ours(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step, "old")
    _save(tmp_path, 1, "new")  # the new run's own step 1 replaces the old step 1 and stays
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "step_00000001", "step_00000002", "step_00000003"]
    assert checkpoint.latest(tmp_path).name == "step_00000001"
    assert checkpoint.load(checkpoint.latest(tmp_path), models={}).run_id == "new"


# -- metrics.jsonl -------------------------------------------------------------------------------

def test_a_torn_last_line_is_dropped_and_the_log_rewritten_atomically(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    written = []
    real = checkpoint.write_atomic
    monkeypatch.setattr("wc_fast.infra.metrics.write_atomic",
                        lambda p, data: (written.append(Path(p)), real(p, data)))
    with pytest.warns(UserWarning, match=rf"{path}: dropping its torn last line 4"):
        log = MetricsLog(path, resume_step=2)
    assert [r["step"] for r in log.rows] == [1, 2]
    assert written == [path] and path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary left


def test_a_damaged_line_inside_the_log_names_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{path} line 2 is not a metrics row"):
        MetricsLog(path, resume_step=3)


def test_resume_survives_a_torn_metrics_line(tmp_path):
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path)]) == 0
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "clip"')  # a crash mid-append
    with pytest.warns(UserWarning, match="torn last line"):
        assert main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


# -- every checkpoint fault is a CheckpointError, with fallback --------------------------------

def _rewrite_meta(path: Path, change) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta = change(meta)
    if isinstance(meta, dict) and "sha256" in meta:
        meta["sha256"] = checkpoint._meta_digest(meta)  # a consistent edit, not a bit flip
    (path / "meta.json").write_text(json.dumps(meta))


def _state_without_rng(path: Path) -> None:
    torch.save({"optimizers": []}, path / "state.pt")
    _rewrite_meta(path, lambda m: {**m, "files": {**m["files"], "state.pt":
                                                  checkpoint._sha256(path / "state.pt")}})


FAULTS = {
    "meta.json a list": (lambda p: _rewrite_meta(p, lambda m: [m]), "holds a list"),
    "no step": (lambda p: _rewrite_meta(p, lambda m: {k: v for k, v in m.items()
                                                      if k != "step"}), "has no 'step'"),
    "step a string": (lambda p: _rewrite_meta(p, lambda m: {**m, "step": "2"}),
                      "'step' .* must be a JSON int"),
    "state.pt without rng": (_state_without_rng, "state.pt is incomplete: it has no 'rng'"),
    "altered meta.json": (lambda p: (p / "meta.json").write_text(
        (p / "meta.json").read_text().replace('"step": 2', '"step": 7')),
        "meta.json fails its sha256 check"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_every_checkpoint_fault_falls_back_to_the_previous_one(tmp_path, fault):
    damage, says = FAULTS[fault]
    for step in (1, 2):
        _save(tmp_path, step, "a", keep_last=3)
    damage(tmp_path / "step_00000002")
    with pytest.raises(checkpoint.CheckpointError, match=says):
        checkpoint.load(tmp_path / "step_00000002", models={"model": nn.Linear(2, 2)})
    with pytest.warns(UserWarning, match="skipping damaged checkpoint step_00000002"):
        loaded = checkpoint.load_latest_intact(tmp_path, models={"model": nn.Linear(2, 2)})
    assert loaded.step == 1


def _tiny_checkpoint(root: Path) -> Path:
    cfg = config.preset("smoke")
    model = TinyWorldDiT(cfg.model)
    return checkpoint.save(root, 1, models={"model": model}, config=config.to_dict(cfg),
                           state={}, run_id="a")


def test_a_huge_model_in_meta_json_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    path = _tiny_checkpoint(tmp_path)
    built = []
    real_init = TinyWorldDiT.__init__

    def spy(self, cfg):
        built.append((cfg.dim, torch.get_default_device().type))
        real_init(self, cfg)

    monkeypatch.setattr(TinyWorldDiT, "__init__", spy)

    def dim(value):
        _rewrite_meta(path, lambda m: {**m, "config": {**m["config"], "model": {
            **m["config"]["model"], "dim": value}}})

    dim(65536)  # 17 GB of weights per copy: over the size bound
    with pytest.raises(checkpoint.CheckpointError, match="meta.json is invalid: .* GiB per rank"):
        load_checkpoint_model(path, torch.device("cpu"))
    dim(4096)  # within the bound, but not what the weights file holds
    with pytest.raises(checkpoint.CheckpointError, match="meta.json's model config needs"):
        load_checkpoint_model(path, torch.device("cpu"))
    assert built == [(4096, "meta")]  # sized on the meta device only
    (path / "meta.json").write_text((path / "meta.json").read_text().replace('"dim": 4096',
                                                                             '"dim": 32'))
    with pytest.raises(checkpoint.CheckpointError, match="meta.json fails its sha256"):
        load_checkpoint_model(path, torch.device("cpu"))


def test_eval_reports_a_malformed_meta_json_in_one_line(tmp_path, capsys):
    path = _tiny_checkpoint(tmp_path)
    (path / "meta.json").write_text("[1, 2")
    assert run_main("python -m wc_fast.eval", eval_cli.main, ["--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CheckpointError" in err and "meta.json is not valid" in err
    with pytest.raises(checkpoint.CheckpointError):  # --debug: the traceback
        run_main("python -m wc_fast.eval", eval_cli.main, ["--checkpoint", str(path), "--debug"])


# -- a changed architecture on resume names the fields -----------------------------------------

def test_resume_with_another_architecture_names_the_fields_before_setup(tmp_path, monkeypatch):
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path)]) == 0
    monkeypatch.setattr("wc_fast.train.initial_model",
                        lambda *a: pytest.fail("the model was built before the config check"))
    with pytest.raises(checkpoint.ConfigMismatchError,
                       match=r"\(checkpoint -> now\): model.dim: 32 -> 64; "
                             r"model.heads: 2 -> 4$"):
        main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--resume", "--model.dim", "64",
              "--model.heads", "4"])


def test_a_config_mismatch_is_not_skipped_as_damage(tmp_path):
    model = nn.Linear(2, 2)
    for step in (1, 2):
        checkpoint.save(tmp_path, step, models={"model": model}, config={"m": {"dim": 8}},
                        state={}, run_id="a")
    with pytest.raises(checkpoint.ConfigMismatchError, match="m.dim: 8 -> 4"):
        checkpoint.load_latest_intact(tmp_path, models={"model": model},
                                      config={"m": {"dim": 4}})


# -- a finite blow-up is not checkpointed as healthy -------------------------------------------

def test_an_absurd_learning_rate_is_skipped_and_stops_the_run(tmp_path):
    with pytest.raises(NumericalFaultError, match="1 consecutive updates .*too large"):
        main([*SMOKE, "--steps", "2", "--out", str(tmp_path), "--optim.lr", "1e30",
              "--train.max_bad_updates", "1"])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["loss"], r["skipped_updates"]) for r in rows] == [(None, 1)]
    torch.manual_seed(config.preset("smoke").train.seed)
    init = TinyWorldDiT(config.preset("smoke").model).state_dict()
    saved = load_file(checkpoint.latest(tmp_path) / "model.safetensors")
    for key, value in init.items():
        torch.testing.assert_close(saved[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_the_guard_off_lets_the_blow_up_through(tmp_path):
    """The same run with ``train.max_update_ratio 0``: the check above is what stopped it."""
    assert main([*SMOKE, "--steps", "1", "--out", str(tmp_path), "--optim.lr", "1e30",
                 "--train.max_update_ratio", "0"]) == 0
    saved = load_file(checkpoint.latest(tmp_path) / "model.safetensors")
    assert max(v.abs().max().item() for v in saved.values()) > 1e20


# -- model cards, paths and sizes, before setup; one-line errors --------------------------------

@pytest.mark.parametrize(("field", "value", "says"), [
    ("heads", 0, "model.heads must be an integer >= 1"),
    ("dtype", "float8", "model.dtype must be one of"),
    ("wings", 2, r"unknown model fields \['wings'\]"),
])
def test_an_invalid_model_card_names_the_field(tmp_path, field, value, says):
    path = export_world_model(TinyWorldDiT(config.preset("smoke").model),
                              tmp_path / "m.safetensors", {})
    card = json.loads(path.with_suffix(".json").read_text())
    card["model"][field] = value
    path.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=rf"model card .*m.json is invalid: .*{says}"):
        load_world_model(path)


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_out_that_cannot_be_a_directory_fails_before_setup(tmp_path, monkeypatch, where):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" if where == "a file" else tmp_path / "f" / "run"
    monkeypatch.setattr("wc_fast.train.initial_model", lambda *a: pytest.fail("set up"))
    with pytest.raises(RunDirError, match="train.out .*f"):
        main([*SMOKE, "--out", str(out)])


def test_a_read_only_out_fails_before_setup(tmp_path, monkeypatch):
    """A read-only directory as a non-root user sees it (root may write anywhere)."""
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("wc_fast.infra.run_dir.tempfile.TemporaryFile", denied)
    monkeypatch.setattr("wc_fast.train.initial_model", lambda *a: pytest.fail("set up"))
    with pytest.raises(RunDirError, match=f"train.out {tmp_path} is not a writable directory: "
                                          "Permission denied"):
        main([*SMOKE, "--out", str(tmp_path)])


def test_cuda_without_a_gpu_is_one_line_with_exit_status_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [*SMOKE, "--out", str(tmp_path), "--train.device", "cuda"]
    assert run_main("python -m wc_fast.train", main, argv) == 2
    err = capsys.readouterr().err
    assert err == ("python -m wc_fast.train: error: RuntimeError: train.device='cuda' but no "
                   "CUDA device is available\n")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_command_line_reports_an_error_in_one_line_or_a_traceback_with_debug(tmp_path):
    (tmp_path / "f").write_text("")
    command = [sys.executable, "-m", "wc_fast.train", "--preset", "smoke", "--out",
               str(tmp_path / "f")]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"python -m wc_fast.train: error: RunDirError: train.out {tmp_path / 'f'} is a file, "
        "not a directory")
    assert "Traceback" not in done.stderr
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True, env=_env(),
                           timeout=300)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_eval_refuses_zero_steps_and_an_unwritable_json_up_front(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_cli, "evaluate", lambda *a, **k: pytest.fail("evaluated"))
    with pytest.raises(SystemExit):
        eval_cli.main(["--sampler-steps", "0"])
    assert "--sampler-steps must be >= 1" in capsys.readouterr().err
    (tmp_path / "f").write_text("")
    with pytest.raises(RunDirError, match="--json's directory"):
        eval_cli.main(["--json", str(tmp_path / "f" / "out.json")])


def test_absurd_sizes_are_refused_with_the_memory_they_would_need():
    cfg = config.preset("smoke")
    cfg.rollout.group_size = 10**8
    with pytest.raises(ValueError, match=r"need at least [\d,]+ GiB per rank.*rollout.group_size"):
        config.validate(cfg)
    assert sum(config.memory_estimate(config.preset("paper")).values()) < 1  # GiB
