"""The GPU check's CPU dry run (``GPU_CHECK_DRY_RUN=1 bash bench/gpu_check.sh OUT``).

What the GPU machine's one or two tries depend on, proven here without a GPU: the script runs
to the end with exit 0, every GPU-marked test is collected and skips, the benchmark files are
collected (imported), and the output folder respects the limits of what comes back from the
GPU machine (at most 8 plain files, none in a subfolder, each under 16 MiB). The RL-iteration
step is left out (``GPU_CHECK_SKIP_RL=1``): its smoke preset has its own test in
``test_studies.py`` and takes minutes on a busy 2-core machine.
"""

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from studies.gpu_targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]
MAX_FILES, MAX_BYTES = 8, 16 * 2**20

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                       reason="the GPU check is a bash script using coreutils' timeout"),
]


def _env(**extra: str) -> dict[str, str]:
    # without the variables of a pytest-xdist worker (pytest-benchmark would take the nested
    # pytest for an xdist run and refuse --benchmark-only)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "GPU_CHECK_SKIP_RL", "GPU_CHECK_BUDGET_S",
                         "GPU_CHECK_STEPS")
           and not k.startswith("PYTEST_XDIST") and k != "PYTEST_CURRENT_TEST"}
    env.update(PYTHON=sys.executable, **extra)
    return env


def _gpu_test_ids() -> set[tuple[str, str]]:
    """(JUnit classname, name) of the GPU-marked tests, collected on their own."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                           "-p", "no:cacheprovider", "tests/"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = set()
    for line in proc.stdout.splitlines():
        if "::" in line:  # tests/test_x.py[::Class]::test[params] (params may hold "::")
            base, bracket, params = line.strip().partition("[")
            path, *classes, name = base.split("::")
            ids.add((".".join([path.removesuffix(".py").replace("/", "."), *classes]),
                     name + bracket + params))
    return ids


def _junit_outcomes(path: Path) -> dict[tuple[str, str], str]:
    """(classname, name) -> passed, skipped, failure or error; modules skipped whole at import
    leave no test of theirs in the report (nor in ``--collect-only``) and are left out."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
        if not case.get("classname") and kinds == ["skipped"]:
            continue  # a whole module skipped at import (the native extension is not built)
        outcomes[case.get("classname"), case.get("name")] = kinds[0] if kinds else "passed"
    return outcomes


def test_dry_run_passes_and_respects_the_output_limits(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "bench/gpu_check.sh", str(out)], cwd=ROOT,
                          env=_env(GPU_CHECK_DRY_RUN="1", GPU_CHECK_SKIP_RL="1",
                                   GPU_CHECK_BUDGET_S="150"),
                          capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]

    entries = list(out.iterdir())
    assert 0 < len(entries) <= MAX_FILES, [e.name for e in entries]
    assert all(e.is_file() and not e.is_symlink() for e in entries), [e.name for e in entries]
    assert all(e.stat().st_size < MAX_BYTES for e in entries)
    names = {e.name for e in entries}
    assert {"gpu_check.log", "summary.txt", "gpu_tests.xml"} <= names, names

    # the steps ran in priority order: what has no GPU number yet first
    ran = re.findall(r"^=== gpu_check: (.+) \(limit", log, re.MULTILINE)
    assert ran == ["GPU tests", "fused-op benchmarks", "fused-op profile",
                   "attention benchmarks", "model benchmarks"], ran
    # the profile ran (on the CPU, the reference backend at a thousandth of the shapes)
    assert "=== gpu_check: fused-op profile done in" in log and "host syncs per call" in log, \
        log[-4000:]
    # the benchmark files were collected (imported): three collect-only runs, none empty
    counts = [int(n) for n in re.findall(r"^(\d+) tests? collected in ", log, re.MULTILINE)]
    assert len(counts) == 3 and min(counts) > 0, log[-4000:]

    # every GPU-marked test is in the report, and each one skipped
    outcomes = _junit_outcomes(out / "gpu_tests.xml")
    expected = _gpu_test_ids()
    assert expected, "no GPU-marked tests collected"
    assert set(outcomes) == expected, (sorted(expected - set(outcomes))[:10],
                                       sorted(set(outcomes) - expected)[:10])
    assert set(outcomes.values()) == {"skipped"}, {k: v for k, v in outcomes.items()
                                                   if v != "skipped"}
    summary = (out / "summary.txt").read_text()
    cases = sum(1 for _ in ET.parse(out / "gpu_tests.xml").getroot().iter("testcase"))
    assert f"gpu_tests.xml: {cases} tests, 0 failed, 0 errors" in summary, summary
    # the targets table: one row per target, and a CPU run measures none of them
    rows = summary.split("\ntargets\n", 1)[1].splitlines()[2:]
    assert len(rows) == len(TARGETS), summary
    assert all(re.split(r"\s{2,}", row)[3].startswith("MISSING: ") for row in rows), summary


def test_steps_are_picked_by_name(tmp_path):
    """GPU_CHECK_STEPS=profile runs that step alone: no benchmark, test or RL output."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "bench/gpu_check.sh", str(out)], cwd=ROOT,
                          env=_env(GPU_CHECK_DRY_RUN="1", GPU_CHECK_STEPS="profile"),
                          capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert {e.name for e in out.iterdir()} == {"gpu_check.log", "summary.txt"}
    ran = re.findall(r"^=== gpu_check: (.+) \(limit", log, re.MULTILINE)
    assert ran == ["fused-op profile"], ran
