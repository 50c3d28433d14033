"""Print a short table from pytest-benchmark JSON files and pytest JUnit XML reports.

Usage: ``python bench/summarize.py FILE...`` (``.json``: benchmark results, ``.xml``: test
results). Benchmarks are listed by group with their median time per round and the
``extra_info`` figures; test reports as pass/fail/skip counts plus the failing tests' names.
Missing files are reported, not fatal: the GPU check prints whatever finished.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

EXTRA_KEYS = ("us_per_call", "gb_per_s", "pct_of_copy")


def benchmark_rows(path: Path) -> list[tuple[str, ...]]:
    data = json.loads(path.read_text())
    rows = []
    for bench in sorted(data.get("benchmarks", []), key=lambda b: (b["group"] or "", b["name"])):
        extra = bench.get("extra_info", {})
        shown = [f"{k}={extra[k]}" for k in EXTRA_KEYS if k in extra]
        shown += [f"{k}={v}" for k, v in extra.items() if k not in EXTRA_KEYS
                  and k not in ("calls_per_round", "bytes_per_call", "copy_gb_per_s")]
        rows.append((bench["group"] or "", bench["name"].split("[")[-1].rstrip("]"),
                     f"{bench['stats']['median'] * 1e3:.3f}", " ".join(shown)))
    return rows


def junit_summary(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    lines = [f"{path.name}: {counts['tests']} tests, {counts['failures']} failed, "
             f"{counts['errors']} errors, {counts['skipped']} skipped"]
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            lines.append(f"  FAILED {case.get('classname')}::{case.get('name')}")
    return lines


def format_rows(rows: list[tuple[str, ...]]) -> str:
    header = ("group", "benchmark", "median ms/round", "extra")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    rows: list[tuple[str, ...]] = []
    for name in paths:
        path = Path(name)
        if not path.is_file():
            print(f"{name}: missing (step did not finish)")
        elif path.suffix == ".xml":
            print("\n".join(junit_summary(path)))
        else:
            rows += benchmark_rows(path)
    if rows:
        print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
