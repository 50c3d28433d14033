"""``python -m wc_kernels.aot`` compiles every Triton kernel for sm_90 without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from wc_kernels import aot
from wc_kernels.ops.flow_noise.triton import aot_configs as flow_configs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_command_compiles_every_kernel_without_spills():
    """The real command, from an environment with ``TRITON_INTERPRET=1`` (as conftest sets):
    it re-runs itself without the interpreter, since Triton cannot compile interpreted kernels."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "wc_kernels.aot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[2:] if line.endswith(" ok")]
    seen = {(row[0], row[1]) for row in rows}
    for kernel in ("nft_abs_err_kernel", "nft_loss_grad_kernel", "flow_noise_kernel",
                   "sde_sums_kernel", "sde_grad_kernel"):
        assert {(kernel, dtype) for dtype in ("fp32", "fp16", "bf16")} <= seen
    assert "without spills" in proc.stdout


def test_compile_error_becomes_a_failed_row(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("ptxas exploded\n")

    monkeypatch.setattr(triton, "compile", fail)
    row = aot.compile_config(flow_configs()[0])
    assert not row.ok and row.error == "RuntimeError: ptxas exploded"


@pytest.mark.parametrize("failure", [{"error": "CompilationError: x"},
                                     {"spill_stores": 8, "spill_loads": 8}])
def test_exit_status_is_one_on_any_failure(monkeypatch, capsys, failure):
    good = aot.Row("a", "fp32", "", 4, registers=32, spill_stores=0, spill_loads=0, shared=0)
    bad = aot.Row("b", "fp32", "", 4, **{"registers": 255, "spill_stores": 0,
                                        "spill_loads": 0, "shared": 0, **failure})
    rows = iter([good, bad])
    monkeypatch.setattr(aot, "triton_interpreting", lambda: False)
    monkeypatch.setattr(aot, "_configs", lambda: [None, None])
    monkeypatch.setattr(aot, "compile_config", lambda config: next(rows))
    assert aot.main([]) == 1
    captured = capsys.readouterr()
    assert "1 of 2 configurations failed" in captured.err
    assert ("SPILLS" if "spill_stores" in failure else "CompilationError") in captured.out


FP64_SCALE = """
from dataclasses import replace
from wc_kernels import aot
from wc_kernels.ops.prefix_attention.triton import aot_configs
picked = {}
for config in aot_configs():
    picked.setdefault((config.kernel.fn.__name__, config.dtype), config)
for config in picked.values():
    row = aot.compile_config(replace(config, signature={**config.signature, "scale": "fp64"}))
    assert row.ok, row
print(len(picked), "compiled")
"""


@pytest.mark.slow
def test_attention_kernels_compile_with_an_fp64_scale():
    """torch.compile launches user Triton kernels with a Python float typed fp64; the kernels
    cast it to fp32 so their accumulators keep one type (an fp64 ``scale`` once failed with
    "Loop-carried variable acc ... re-assigned to fp64" on the GPU). Compiled without the
    interpreter, in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", FP64_SCALE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "compiled" in proc.stdout
