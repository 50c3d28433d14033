"""``python -m wc_fast.tools.compare BASE.json TRAINED.json [TRAINED.json ...]``: the paired
change of every metric from a base model's evaluation to a trained model's (one file per
training seed), with 95% bootstrap intervals, as a Markdown table
(:mod:`wc_fast.measures.compare`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from wc_fast.cli import run_main
from wc_fast.measures.compare import compare, markdown


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.tools.compare",
                                     description="Paired changes with bootstrap intervals.")
    parser.add_argument("base", help="the base model's `python -m wc_fast.eval --json` file")
    parser.add_argument("trained", nargs="+", help="the trained model's, one per training seed")
    parser.add_argument("--out", default=None, help="also write the table (Markdown) here")
    parser.add_argument("--json", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    base = json.loads(Path(args.base).read_text())
    trained = [json.loads(Path(p).read_text()) for p in args.trained]
    rows = compare(base, trained)
    text = "\n".join(markdown(rows))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.tools.compare", main))
