"""Version floors: what pyproject.toml claims is what is tested, and an older torch is refused
at import with a clear message."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import wc_kernels

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _floor(package: str) -> tuple[int, int]:
    major, minor = re.search(rf'"{package}>=(\d+)\.(\d+)', PYPROJECT).groups()
    return int(major), int(minor)


def test_pyproject_floors_are_the_tested_versions():
    """torch 2.11 and Triton 3.6: the GPU image's (H200 check of 2026-11-30), Triton 3.6 also
    on CPU (interpreter tests, sm_90 AOT compile)."""
    assert _floor("torch") == wc_kernels.TORCH_MIN == (2, 11)
    assert _floor("triton") == (3, 6)
    assert 'requires-python = ">=3.10"' in PYPROJECT


@pytest.mark.parametrize("version", ["2.11.0", "2.11.0+cu130", "2.11.0a0+git1234",
                                     "2.13.0+cpu", "3.0.0"])
def test_tested_torch_versions_pass(version):
    wc_kernels.check_torch_version(version)


@pytest.mark.parametrize("version", ["2.10.1", "2.6.0+cu124", "1.13.1", "unknown"])
def test_older_torch_is_refused_with_both_versions(version):
    with pytest.raises(ImportError, match=rf"needs torch >= 2\.11.*installed: torch "
                                          rf"{re.escape(version)}"):
        wc_kernels.check_torch_version(version)


def test_import_with_an_older_torch_fails_with_the_message():
    """``import wc_kernels`` itself raises under a torch that reports 2.10."""
    code = ("import torch; torch.__version__ = '2.10.0'\n"
            "try:\n    import wc_kernels\nexcept ImportError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "needs torch >= 2.11" in proc.stdout and "torch 2.10.0" in proc.stdout, proc.stdout


@pytest.mark.parametrize(("triton_version", "numpy_version", "clash"),
                         [("3.6.0", "2.4.6", True), ("3.7.1", "2.4.0", True),
                          ("3.6.0", "2.3.5", False), ("3.8.0", "2.4.6", False),
                          ("3.9.0", "2.4.6", False)])
def test_interpreter_numpy_clash(monkeypatch, triton_version, numpy_version, clash):
    """Triton's interpreter before 3.8 fails under NumPy >= 2.4: tests/conftest.py then skips
    the tests that hit it, naming the fix."""
    numpy = pytest.importorskip("numpy")
    triton = pytest.importorskip("triton")
    import conftest

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(numpy, "__version__", numpy_version)
    reason = conftest.interpreter_numpy_clash()
    assert (reason is not None) == clash
    if clash:
        assert f"Triton {triton_version}" in reason and 'pip install "numpy<2.4"' in reason
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert conftest.interpreter_numpy_clash() is None
