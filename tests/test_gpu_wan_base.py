"""The Wan base's GPU pretraining script (``bash bench/gpu_wan_base.sh OUT MINUTES``), run on
the CPU (``DEVICE=cpu``): each variant's archive holds its weights, card and loss log, the card
records the variant's settings, and what comes back from the GPU machine stays within its
limits (at most 8 files, each under 16 MiB)."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bash") is None, reason="the script is a bash script"),
]


def _run(out: Path, minutes: str, **env: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WAN_")},
           "PYTHON": sys.executable, "DEVICE": "cpu", **env}
    return subprocess.run(["bash", "bench/gpu_wan_base.sh", str(out), minutes], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def test_an_initial_model_without_its_card_is_refused_before_any_job(tmp_path):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    proc = _run(tmp_path / "out", "0.01", WAN_INIT=str(weights))
    assert proc.returncode == 1
    assert f"needs the file and its card {tmp_path / 'w.json'}" in proc.stderr
    assert not list((tmp_path / "out").glob("*.tgz"))


def test_variants_run_and_their_archives_hold_weights_card_and_losses(tmp_path):
    out = tmp_path / "out"
    proc = _run(out, "0.02", WAN_VARIANTS="a 1 1 5e-4 0.5 3;b 2 2 3e-4 0.0 2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["wan_a.tgz", "wan_b.tgz", "wan_base.log"], files
    assert all(p.stat().st_size < 16 * 2**20 for p in out.iterdir())
    for name, batch, clips, lr, fraction in (("a", 1, 3, 5e-4, 0.5), ("b", 2, 2, 3e-4, 0.0)):
        with tarfile.open(out / f"wan_{name}.tgz") as archive:
            members = set(archive.getnames())
            assert {f"wan_{name}/base_model.safetensors", f"wan_{name}/base_model.json",
                    f"wan_{name}/loss.jsonl"} <= members, members
            card = json.load(archive.extractfile(f"wan_{name}/base_model.json"))
        assert (card["batch_size"], card["num_clips"], card["lr"], card["composite_fraction"]) \
            == (batch, clips, lr, fraction)
        assert card["init"] == "wc_fast/assets/wan_base_model.safetensors"
        assert card["model"]["backbone"] == "wan"
    assert "exported the EMA weights" in (out / "wan_base.log").read_text()
