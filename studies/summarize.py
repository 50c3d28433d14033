"""Print a short table from pytest-benchmark JSON files and pytest JUnit XML reports.

Usage: ``python -m studies.summarize FILE...`` (``.json``: benchmark results,
``studies/rl_iteration.py``'s or ``studies/wan_iteration.py``'s result, ``.xml``: test results).
Benchmarks are listed by group with their median time per round and the ``extra_info``
figures; test reports as pass/fail/skip counts plus the failing tests' names; an RL iteration
as both sides' times, the speedup and the train phase's share of the matmul rate; a Wan
iteration as each variant's phase times, peak memory and MFU. Then the speed targets
(``studies/gpu_targets.py``), one row each: measured value, threshold, PASS / FAIL / MISSING.
Missing or unreadable files are reported, not fatal: the GPU check prints whatever finished.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from studies.gpu_targets import Results, target_rows

EXTRA_KEYS = ("us_per_call", "gb_per_s", "pct_of_copy", "kernel_pct_of_copy")


def benchmark_rows(data: dict) -> list[tuple[str, ...]]:
    rows = []
    for bench in sorted(data.get("benchmarks", []), key=lambda b: (b["group"] or "", b["name"])):
        extra = bench.get("extra_info", {})
        shown = [f"{k}={extra[k]}" for k in EXTRA_KEYS if k in extra]
        shown += [f"{k}={v}" for k, v in extra.items() if k not in EXTRA_KEYS
                  and k not in ("calls_per_round", "bytes_per_call", "copy_gb_per_s")]
        rows.append((bench["group"] or "", bench["name"].split("[")[-1].rstrip("]"),
                     f"{bench['stats']['median'] * 1e3:.3f}", " ".join(shown)))
    return rows


def rl_iteration_summary(path: Path, data: dict) -> list[str]:
    """``studies/rl_iteration.py --json``: per-phase seconds of both sides, speedup, FLOP share."""
    ours, theirs = data["ours_phases_s"], data["official_style_phases_s"]
    phases = " ".join(f"{k} {ours[k]:.2f}/{theirs.get(k, float('nan')):.2f}" for k in ours)
    return [f"{path.name}: preset {data['preset']} on {data['device']}: ours "
            f"{data['ours_s']:.2f} s, official-style {data['official_style_s']:.2f} s, "
            f"speedup {data['speedup']:.2f}x",
            f"  phases ours/official-style s: {phases}",
            f"  train phase {_flops(data['train_flops_per_s'])} = "
            f"{100 * data['flop_fraction']:.0f}% of a large matmul's "
            f"{_flops(data['matmul_flops_per_s'])}; MFU ({data['compute_dtype']}) "
            f"{100 * data['mfu']:.0f}%"]


def wan_iteration_summary(path: Path, data: dict) -> list[str]:
    """``studies/wan_iteration.py --json``: per-variant phase seconds, peak memory and MFU."""
    blocks = f" layers={data['layers']}" if data.get("layers") is not None else ""
    lines = [f"{path.name}: {data['shape']}{blocks} on {data['device_name']}, "
             f"{data['resolution']}px, "
             f"{data['clip_frames']} latent frames per clip, G={data['group_size']}, "
             f"{data['steps']} steps; {data['matmul_dtype']} matmul "
             f"{_flops(data['matmul_flops_per_s'])}"]
    for row in data["variants"]:
        p = row["phases_s"]
        peak = f"{row['peak_mib'] / 1024:.1f} GiB" if row["peak_mib"] is not None else "-"
        spec = f", {100 * row['mfu_spec']:.0f}% of spec" if row["mfu_spec"] is not None else ""
        lines.append(f"  {row['variant']}: rollout {p['rollout']:.2f} s, reward "
                     f"{p['reward']:.2f} s, train {p['train']:.2f} s, peak {peak}, train "
                     f"{_flops(row['train_flops_per_s'])} = {100 * row['mfu_measured']:.0f}% "
                     f"of the matmul{spec}")
    return lines


def _flops(rate: float) -> str:
    return f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.1f} GFLOP/s"


def junit_counts(root: ET.Element) -> dict[str, int]:
    """A JUnit report's ``tests``, ``failures``, ``errors`` and ``skipped`` summed over suites."""
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return {k: sum(int(s.get(k, 0)) for s in suites)
            for k in ("tests", "failures", "errors", "skipped")}


def junit_summary(path: Path, root: ET.Element) -> list[str]:
    counts = junit_counts(root)
    lines = [f"{path.name}: {counts['tests']} tests, {counts['failures']} failed, "
             f"{counts['errors']} errors, {counts['skipped']} skipped"]
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            lines.append(f"  FAILED {case.get('classname')}::{case.get('name')}")
    return lines


def gpu_test_counts(root: ET.Element) -> dict[str, int]:
    """The counts ``gpu_targets.Results.gpu_tests`` holds: tests, failed, skipped, passed."""
    counts = junit_counts(root)
    failed = counts["failures"] + counts["errors"]
    return {"tests": counts["tests"], "failed": failed, "skipped": counts["skipped"],
            "passed": counts["tests"] - failed - counts["skipped"]}


BENCHMARK_HEADER = ("group", "benchmark", "median ms/round", "extra")
TARGET_HEADER = ("target", "measured", "threshold", "result")


def format_rows(rows: list[tuple[str, ...]], header: tuple[str, ...] = BENCHMARK_HEADER) -> str:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    rows: list[tuple[str, ...]] = []
    results = Results()
    for name in paths:
        path = Path(name)
        if not path.is_file():
            print(f"{name}: missing (step did not finish)")
        elif path.stat().st_size == 0:  # pytest-benchmark leaves it empty when none ran
            print(f"{name}: empty (no benchmark finished)")
        elif path.suffix == ".xml":
            try:
                root = ET.parse(path).getroot()
            except ET.ParseError as exc:
                print(f"{name}: unreadable ({exc})")
                continue
            print("\n".join(junit_summary(path, root)))
            results.gpu_tests = gpu_test_counts(root)
        else:
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                print(f"{name}: unreadable ({exc})")
                continue
            if "speedup" in data:
                print("\n".join(rl_iteration_summary(path, data)))
                results.rl_iteration = data
            elif "variants" in data:
                print("\n".join(wan_iteration_summary(path, data)))
                results.wan_iteration = data
            else:
                rows += benchmark_rows(data)
                results.benchmarks.update((b["name"], b) for b in data.get("benchmarks", []))
    if rows:
        print(format_rows(rows))
    print("\ntargets")
    print(format_rows(target_rows(results), TARGET_HEADER))
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
