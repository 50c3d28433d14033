"""``python -m kernels.aot`` compiles every Triton kernel for sm_90 without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

from kernels import aot
from kernels._triton import AotConfig
from kernels._triton.flow_noise import flow_noise_kernel

ROOT = Path(__file__).resolve().parents[1]


def test_aot_compiles_every_kernel_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "kernels.aot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:] if line.endswith(" ok")]
    seen = {(row[0], row[1]) for row in rows}
    for kernel in ("nft_abs_err_kernel", "nft_loss_grad_kernel", "flow_noise_kernel"):
        assert {(kernel, dtype) for dtype in ("fp32", "fp16", "bf16")} <= seen
    assert len(rows) == len(aot._configs())


def test_aot_fails_on_compile_error(monkeypatch, capsys):
    broken = AotConfig(flow_noise_kernel, "fp32", "missing arguments", {"x0_ptr": "*fp32"},
                       {"BLOCK": 16}, 4)
    monkeypatch.setattr(aot, "_configs", lambda: [broken])
    assert aot.main([]) == 1
    assert "failed" in capsys.readouterr().err


def test_spills_fail_the_row():
    row = aot.Row("k", "fp32", "", 4, registers=255, spill_stores=8, spill_loads=8, shared=0)
    assert not row.ok and "SPILLS" in aot.format_table([row])
