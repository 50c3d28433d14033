"""A multi-node launch as a cluster runs it: two torchrun agents (two "nodes" of one process
each, here on one machine) meet through the c10d rendezvous and train one run together."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wc_fast.infra import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_meet_through_c10d_and_train_one_run(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "wc_fast_test",
               "-m", "wc_fast.train", "--preset", "smoke", "--steps", "2",
               "--out", str(tmp_path / "run"), "--train.reader_gap_every", "0"]
    nodes = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert any("2 rank(s)" in out for out in outputs), outputs
    assert checkpoint.latest(tmp_path / "run").name == "step_00000002"
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2


def test_the_slurm_example_is_valid_bash_and_launches_the_trainer_through_c10d():
    script = ROOT / "examples" / "slurm_train.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "--rdzv-backend c10d" in text and "-m wc_fast.train" in text
    assert '"$@"' in text.split("-m wc_fast.train", 1)[1]
