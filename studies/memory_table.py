"""Each measured preset's per-GPU peak memory as one Markdown table, generated from the JSON
files of ``python -m studies.memory --preset P [--nproc N] [--kl | --no-kl] --json F``, so the
README and the docs quote one source.

    python -m studies.memory_table [--results studies/results/memory] [--out TABLE.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.memory import GIB, PHASES

RESULTS = Path("studies/results/memory")
# what fits: 72 GB of an 80 GB GPU, the rest left for what a fake device does not see
BAR_BYTES = 72e9
# presets in the order a reader meets them: the paper's model on one GPU, on 8, then Wan
ORDER = ("worldplay_lora", "worldplay", "wan")


def rows(results: Path) -> list[dict]:
    """The measurements of ``results`` made with ``--preset`` (comparisons left out), in
    :data:`ORDER`, without the KL first."""
    found = [json.loads(path.read_text()) for path in sorted(results.glob("*.json"))]
    runs = [r for r in found if r.get("preset") in ORDER]
    return sorted(runs, key=lambda r: (ORDER.index(r["preset"]), r["nproc"], r["kl"]))


def table(results: Path = RESULTS) -> str:
    """The Markdown table, with the command that generates it."""
    lines = [f"`python -m studies.memory_table --results {results}` (rank 0 of the GPUs "
             "named; GiB at each phase's peak of the second iteration, on fake tensors)", "",
             "| preset | GPUs | KL | setup | " + " | ".join(PHASES) + " | peak (GB) | "
             "fits 72 GB |",
             "|---|---|---|---|" + "---|" * len(PHASES) + "---|---|"]
    for r in rows(results):
        phases = " | ".join(f"{r['by_phase'][p]['peak_bytes'] / GIB:.1f}"
                            for p in ("setup", *PHASES))
        fits = "yes" if r["peak_bytes"] <= BAR_BYTES else "no"
        lines.append(f"| {r['preset']} | {r['nproc']} | {'yes' if r['kl'] else 'no'} | "
                     f"{phases} | {r['peak_bytes'] / 1e9:.1f} | {fits} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=None,
                        help="write the table here (default: RESULTS/table.md)")
    args = parser.parse_args(argv)
    text = table(args.results)
    out = args.results / "table.md" if args.out is None else args.out
    out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
