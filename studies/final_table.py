"""The study's rows on the reserved evaluation seeds, with paired 95% intervals, on either base.

    python -m studies.final_table [--base tiny|wan] [--rows recipe_kl:3,recipe,...]
                                  [--seeds final|validation] [--sequences 64] [--clips 6]
                                  [--out runs/replicate] [--cache DIR]

Each (row, seed) is trained as ``studies.replicate`` trains it (in the run folder named as its
cache file, so a row trained for the study under that name is not trained again), on the
embedded base ``--base``; then
``python -m wc_fast.eval --final`` evaluates its final model on the reserved seeds
(``FINAL_EVAL_SEED``, never used for tuning; ``--seeds validation``: the validation seeds,
``VALIDATION_EVAL_SEED``, on which recipes are chosen), and the base model is evaluated the
same way. Each evaluation's JSON is kept in ``--cache`` (``studies/results/<seeds>``), with the
row's resolved training configuration stored in it, under a name carrying the row, the seed, a
hash of that configuration and the id of the evaluation (settings, seed set and every shipped
model it reads); it is found again by its stored configuration
(``studies.replicate.cache_file``), so an interrupted table resumes and a changed config or
asset is evaluated afresh. Every row is then compared with the base sequence by
sequence (``wc_fast.measures.compare``: paired bootstrap over the sequences, and over the
seeds where a row has several), the camera fit first, and the table is written to
``--cache/<base>_table.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from studies.replicate import (
    TITLES,
    cache_file,
    evaluation_id,
    parse_rows,
    resolved_config,
    run,
    run_name,
    store_config,
)
from wc_fast.config import BASES
from wc_fast.measures.bootstrap import sequence_values
from wc_fast.measures.compare import clip_slices, compare

# the table's columns: (set, metric, clip slice, header); the camera fit, which no reward
# reads, first, the estimator beside it and the gap between the two
COLUMNS = (("composite_2key", "fit_accuracy", "all clips", "two keys, camera fit"),
           ("composite_2key", "accuracy", "all clips", "two keys, estimator"),
           ("composite_2key", "reader_gap", "all clips", "two keys, reader gap"),
           ("composite_2key", "fit_accuracy", "clip 1", "two keys, camera fit, clip 1"),
           ("basic", "fit_accuracy", "all clips", "basic, camera fit"),
           ("basic", "accuracy", "all clips", "basic, estimator"),
           ("basic", "psnr", "clip 1", "basic PSNR (dB), clip 1"),
           ("basic", "vq", "clip 1", "basic VQ (critic), clip 1"))
DEFAULT_ROWS = "recipe_kl:3"
# seed set -> the cache folder its evaluations are kept in by default
CACHES = {"final": "studies/results/final", "validation": "studies/results/validation"}


def evaluate_final(checkpoint: Path | None, base: str, sequences: int, clips: int,
                   path: Path, log: Path, seeds: str = "final") -> dict:
    """``python -m wc_fast.eval --final`` (``--validation`` for ``seeds="validation"``) of
    ``checkpoint`` (the base model when ``None``), its JSON result written to ``path`` and its
    console output to ``log``."""
    command = [sys.executable, "-m", "wc_fast.eval", f"--{seeds}", "--base", base,
               "--sequences", str(sequences), "--clips", str(clips), "--json", str(path)]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    for folder in (path.parent, log.parent):
        folder.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as console:
        subprocess.run(command, check=True, stdout=console, stderr=subprocess.STDOUT)
    return json.loads(path.read_text())


def table(base: dict, results: dict[str, list[dict]], draws: int = 10_000) -> list[str]:
    """Markdown: the base's means, then each row's paired change [95% CI] per column."""
    header = "| row | seeds | " + " | ".join(c[3] for c in COLUMNS) + " |"
    lines = [header, "|---|---|" + "---|" * len(COLUMNS)]
    slices = clip_slices(int(base["settings"]["clips"]))
    cells = [f"{sequence_values(base, kind, metric, slices[clips]).mean():.3f}"
             for kind, metric, clips, _ in COLUMNS]
    lines.append("| base model | - | " + " | ".join(cells) + " |")
    for name, trained in results.items():
        # one bootstrap per (set, metric), every clip slice of it at once
        changes = {(r["set"], r["metric"], r["clips"]): r
                   for kind, metric in dict.fromkeys((c[0], c[1]) for c in COLUMNS)
                   for r in compare(base, trained, metrics=(metric,), sets=(kind,),
                                    draws=draws)}
        cells = []
        for kind, metric, clips, _ in COLUMNS:
            row = changes[kind, metric, clips]
            cells.append(f"{row['change']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}]")
        lines.append(f"| {TITLES.get(name, name)} | {len(trained)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", choices=BASES, default="tiny")
    parser.add_argument("--rows", default=DEFAULT_ROWS,
                        help="ROW or ROW:SEEDS, comma-separated (one seed where none is given)")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--out", default="runs/replicate", help="training runs (checkpoints)")
    parser.add_argument("--seeds", choices=tuple(CACHES), default="final",
                        help="the evaluation seed set: final (reserved for final tables) or "
                             "validation (where recipes are chosen)")
    parser.add_argument("--cache", default=None,
                        help="each evaluation's JSON and the table, small files to commit "
                             "(default: studies/results/final or studies/results/validation)")
    parser.add_argument("--table", default=None,
                        help="where the table of this command's rows is written (default: "
                             "--cache/<base>_table.md, the committed table; give another path "
                             "to measure a few rows without replacing it)")
    args = parser.parse_args(argv)
    try:
        rows = parse_rows(args.rows, lambda row: 1)
    except ValueError as error:
        parser.error(str(error))
    out, cache = Path(args.out), Path(args.cache or CACHES[args.seeds])
    tag = f"{args.sequences}x{args.clips}_{args.seeds}-" + evaluation_id(
        args.sequences, args.clips, seeds=args.seeds, base=args.base)
    prefix = "" if args.base == "tiny" else f"{args.base}_"

    def final(checkpoint: Path | None, path: Path) -> dict:
        """The evaluation cached at ``path``, run (and written there) when it is missing."""
        if path.is_file():
            return json.loads(path.read_text())
        return evaluate_final(checkpoint, args.base, args.sequences, args.clips, path,
                              out / f"{path.stem}.log", args.seeds)

    base = final(None, cache / f"{prefix}base_{tag}.json")
    results = {}
    for row, seeds in rows.items():
        results[row] = []
        for seed in range(seeds):
            config = resolved_config(row, seed, None, args.base)
            path = cache_file(cache, f"{prefix}{row}_s{seed}", tag, config, args.base)
            if not path.is_file():
                final(run(row, seed, out / run_name(path, tag), None, base=args.base), path)
                store_config(path, config)
            results[row].append(json.loads(path.read_text()))
    command = "python -m studies.final_table " + " ".join(
        argv if argv is not None else sys.argv[1:])
    lines = [f"`{command.strip()}` ({args.sequences} sequences x {args.clips} clips per set, "
             f"{args.seeds} seeds; change from the base [paired 95% bootstrap interval])", "",
             *table(base, results)]
    doc = Path(args.table) if args.table else cache / f"{args.base}_table.md"
    doc.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
