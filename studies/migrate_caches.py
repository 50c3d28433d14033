"""Store each current row's resolved training configuration in its committed cache files.

    python -m studies.migrate_caches

A cache file ``[BASE_]ROW_sSEED_cfg-XXXXXXXX_TAG.json`` under ``studies/results/*/`` whose
``XXXXXXXX`` is the id :func:`studies.replicate.training_id` gives that (row, seed, base)
today holds the numbers of that row as it is configured now: its resolved config is written
into the file under ``"config"``, so the cache can be looked up by the stored config instead of
by the id. Files of no current row are left as they are. Running it again changes nothing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from studies.replicate import ROWS, training_args, training_id
from wc_fast.cli import parse_run_args
from wc_fast.config import to_dict

RESULTS = Path(__file__).resolve().parent / "results"
NAME = re.compile(r"(?:(?P<base>wan)_)?(?P<row>.+)_s(?P<seed>\d+)_cfg-(?P<id>[0-9a-f]{8})_.+\.json")


def current_id(row: str, seed: int, base: str) -> str | None:
    """The id of (row, seed) on ``base`` today; None for a row the base cannot train."""
    try:
        return training_id(row, seed, None, base)
    except SystemExit:
        return None


def migrate(results: Path = RESULTS) -> list[Path]:
    """Write the resolved config into every cache file of a current row; the files written."""
    written = []
    for path in sorted(results.glob("*/*_cfg-*.json")):
        match = NAME.fullmatch(path.name)
        if match is None or match["row"] not in ROWS:
            continue
        row, seed, base = match["row"], int(match["seed"]), match["base"] or "tiny"
        if current_id(row, seed, base) != match["id"]:
            continue
        config = to_dict(parse_run_args("replicate", "", training_args(row, seed, None, base),
                                        with_base=True).config)
        text = path.read_text()
        data = json.loads(text)
        if data.get("config") != config:
            data["config"] = config
            path.write_text(json.dumps(data, indent=2) + ("\n" if text.endswith("\n") else ""))
            written.append(path)
    return written


if __name__ == "__main__":
    for path in migrate():
        print(path)
    sys.exit(0)
