"""Which committed result files are current: ``studies/results/index.json``.

    python -m studies.results_index [--check]

Every file under ``studies/results/`` is listed with its status. A file outside ``archive/`` is
current by evidence: a doc that describes the present (README.md, docs/*.md but the experiment
log, which tells history) cites it, by its path, a pattern or a bare name, or its folder when
the folder holds no row caches; the study code looks it up today (a row cache of today's
evaluation id, ``studies.replicate.evaluation_id``, that stores the row's training config of
today, for every row of ``studies/rows.yaml``, seeds 0-2, every seed set and base; the JSON files
``studies.memory_table`` tabulates); a current ``studies.final_table`` table is built from it (the
rows its command names, at the evaluation id that has all of them); or it shares its folder and
stem with a current file (a table's data, a run's log). Anything else is superseded, and
belongs in ``archive/`` (same sub-path), where every file is listed as superseded with why.
``--check`` exits 1 when index.json is not what this command writes.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("studies/results")
ARCHIVE = RESULTS / "archive"
INDEX = RESULTS / "index.json"
COMMAND = "python -m studies.results_index"
# docs that tell history: what they cite is no evidence that a file is current
HISTORY_DOCS = ("docs/experiment_log.md",)
STATUSES = ("current", "superseded")
# the evaluation size of the study's and the final table's rows (their defaults)
SIZE = "64x6"
# a row cache: [BASE_]ROW[_sSEED_cfg-TRAINING]_SIZE_SET-EVALUATION.json
ROW_CACHE = re.compile(r"^(?:(?P<base>wan)_)?(?P<row>.+?)"
                       r"(?:_s(?P<seed>\d+)_cfg-(?P<tid>[0-9a-f]{8}))?_(?P<size>\d+x\d+)"
                       r"_(?P<set>eval|validation|final)-(?P<eid>[0-9a-f]{8})\.json$")
CITED = re.compile(r"(?:`|\]\(|\s|^)(?:\.\./)?(studies/results/[A-Za-z0-9_./*{},-]*)")
BARE = re.compile(r"`([A-Za-z0-9_.-]+\.(?:json|md|log))`")


@dataclass(frozen=True)
class Lookups:
    """What the study code reads today: row cache names and (base, seed set) -> evaluation id."""

    names: frozenset[str]
    evaluations: dict[tuple[str, str], str]


def result_files(root: Path = ROOT) -> list[str]:
    """Every file under studies/results/ but the index itself, repository-relative."""
    return sorted(str(p.relative_to(root)) for p in (root / RESULTS).rglob("*")
                  if p.is_file() and p.relative_to(root) != INDEX)


def archived(path: str) -> bool:
    return Path(path).is_relative_to(ARCHIVE)


def lookups(root: Path = ROOT) -> Lookups:
    """The cache names ``studies.replicate`` and ``studies.final_table`` look for today: a
    row's cache is the file of its name and evaluation id whose stored training config is the
    row's today (``studies.replicate.find_cached``), in any results folder."""
    from studies.replicate import ROWS, evaluation_id, find_cached, resolved_config
    from wc_fast.config import BASES
    from wc_fast.eval import SEED_SETS

    folders = sorted({p.parent for p in (root / RESULTS).rglob("*.json")
                      if not p.relative_to(root).is_relative_to(ARCHIVE)})
    names, evaluations = set(), {}
    for base in BASES:
        prefix = "" if base == "tiny" else f"{base}_"
        for seeds in SEED_SETS:
            eid = evaluations[base, seeds] = evaluation_id(64, 6, seeds=seeds, base=base)
            tag = f"{SIZE}_{'eval' if seeds == 'tuning' else seeds}-{eid}"
            names.add(f"{prefix}base_{tag}.json")
            for row in ROWS:
                for seed in range(3):
                    try:  # a row the base cannot train (the warp head's) exits with a usage error
                        with contextlib.redirect_stderr(io.StringIO()):
                            config = resolved_config(row, seed, None, base)
                    except SystemExit:
                        continue
                    names.update(found.name for folder in folders if (found := find_cached(
                        folder, f"{prefix}{row}_s{seed}", tag, config)) is not None)
    return Lookups(frozenset(names), evaluations)


def _expand(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``[abd, acd]`` (a doc's family of files)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [expanded for option in match.group(1).split(",")
            for expanded in _expand(pattern[:match.start()] + option + pattern[match.end():])]


def citations(root: Path = ROOT) -> dict[str, str]:
    """The result-path patterns and bare names the present-tense docs cite -> the first doc."""
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    cited: dict[str, str] = {}
    for doc in docs:
        name = str(doc.relative_to(root))
        if name in HISTORY_DOCS:
            continue
        text = doc.read_text()
        for match in CITED.finditer(text):
            for pattern in _expand(match.group(1).rstrip(".,;:)")):
                cited.setdefault(pattern, name)
        for match in BARE.finditer(text):
            cited.setdefault(match.group(1), name)
    return cited


def cited_by(path: str, cited: dict[str, str], files: Iterable[str]) -> str | None:
    """The doc that cites ``path``: by path or pattern, by bare name, or by a folder of no row
    caches (a folder of row caches is cited for its caches, which the ids decide)."""
    for pattern, doc in cited.items():
        if "/" not in pattern:
            if Path(path).name == pattern:
                return doc
        elif fnmatch.fnmatchcase(path, pattern):
            return doc
        elif pattern.rstrip("/") == str(Path(path).parent):
            siblings = [f for f in files if Path(f).parent == Path(path).parent]
            if not any(ROW_CACHE.match(Path(f).name) for f in siblings):
                return doc
    return None


def _table_rows(first_line: str) -> tuple[str, dict[str, int]] | None:
    """The base and {row: seeds} of a ``studies.final_table`` command at a table's top."""
    match = re.match(r"`python -m studies\.final_table([^`]*)`", first_line)
    if match is None:
        return None
    args = match.group(1).split()
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--")}
    rows = {}
    for entry in filter(None, value.get("--rows", "recipe_kl:3").split(",")):
        row, _, count = entry.partition(":")
        rows[row] = int(count) if count else 1
    return value.get("--base", "tiny"), rows


def table_sources(table: str, files: list[str], root: Path = ROOT) -> list[str]:
    """The row caches a ``studies.final_table`` table was built from: in its folder, for the
    rows and seeds its command names, at each evaluation id that holds all of them."""
    parsed = _table_rows((root / table).read_text().partition("\n")[0])
    if parsed is None:
        return []
    base, rows = parsed
    by_id: dict[str, dict[tuple[str, int], list[str]]] = {}
    for path in files:
        match = ROW_CACHE.match(Path(path).name)
        if Path(path).parent != Path(table).parent or match is None:
            continue
        if (match["base"] or "tiny") == base:
            key = (match["row"], int(match["seed"] or 0))
            by_id.setdefault(match["eid"], {}).setdefault(key, []).append(path)
    wanted = {("base", 0)} | {(row, seed) for row, seeds in rows.items() for seed in range(seeds)}
    return [path for found in by_id.values() if wanted <= set(found)
            for key in wanted for path in found[key]]


def _superseded_reason(path: str, files: list[str], found: Lookups) -> str:
    """Why ``path`` is not current: for a row cache, which id is not today's and what replaces
    it; otherwise that nothing cites or reads it."""
    match = ROW_CACHE.match(Path(path).name)
    if match is None:
        return ("no present-tense doc cites it, no study reads it and no current table is built "
                "from it")
    base = match["base"] or "tiny"
    seeds = "tuning" if match["set"] == "eval" else match["set"]
    today = found.evaluations.get((base, seeds))
    if match["eid"] != today:
        why = (f"evaluation id {match['eid']} is not today's {seeds} evaluation of the {base} "
               f"base ({today}: the base or a shipped model it reads has changed since)")
    else:
        why = (f"training id {match['tid']} is not today's configuration of row "
               f"{match['row']} on the {base} base")
    prefix = f"{match['base']}_" if match["base"] else ""
    stem = f"{prefix}{match['row']}_s{match['seed']}_cfg-" if match["seed"] else f"{prefix}base_"
    replaced = sorted(f for f in files if Path(f).name.startswith(stem)
                      and Path(f).name in found.names and not archived(f))
    return why + (f"; replaced by {replaced[0]}" if replaced else "; no doc or table uses it")


def classify(files: list[str], found: Lookups, cited: dict[str, str],
             root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Each file -> {"status", "evidence"} when current, {"status", "reason"} when not."""
    from studies.memory_table import RESULTS as MEMORY

    live = [f for f in files if not archived(f)]
    evidence: dict[str, str] = {}
    for path in live:
        doc = cited_by(path, cited, live)
        if doc is not None:
            evidence[path] = f"cited by {doc}"
        elif Path(path).name in found.names:
            evidence[path] = "looked up by the study code under today's ids"
        elif Path(path).parent == MEMORY and path.endswith(".json"):
            evidence[path] = "tabulated by python -m studies.memory_table"
    for table in [f for f in live if f in evidence and f.endswith(".md")]:
        for source in table_sources(table, live, root):
            evidence.setdefault(source, f"{table} is built from it")
    for path in live:
        companion = next((f for f in evidence if f != path and Path(f).parent == Path(path).parent
                          and Path(f).stem == Path(path).stem), None)
        if path not in evidence and companion is not None:
            evidence[path] = f"companion of {companion}"
    return {path: {"status": "current", "evidence": evidence[path]} if path in evidence
            else {"status": "superseded", "reason": _superseded_reason(path, files, found)}
            for path in files}


def build(root: Path = ROOT, found: Lookups | None = None) -> dict:
    """The index of the result files under ``root`` (today's lookups unless ``found``)."""
    files = result_files(root)
    return {"command": COMMAND,
            "files": classify(files, found or lookups(root), citations(root), root)}


def render(index: dict) -> str:
    return json.dumps(index, indent=1) + "\n"


def load(path: Path) -> dict:
    """The committed index, checked for shape; a damaged or stale one raises ValueError
    naming ``path`` and what is wrong."""
    try:
        index = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read the results index ({error})") from error
    if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
        raise ValueError(f"{path}: expected an object with a 'files' object")
    root = path.resolve().parents[2]
    for name, entry in index["files"].items():
        if not (root / name).is_file():
            raise ValueError(f"{path}: lists {name}, which does not exist")
        if not isinstance(entry, dict) or entry.get("status") not in STATUSES:
            raise ValueError(f"{path}: {name} has no status of {STATUSES}")
        if entry["status"] == "superseded" and not entry.get("reason"):
            raise ValueError(f"{path}: superseded {name} gives no reason")
    return index


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the committed index is not what this command writes")
    args = parser.parse_args(argv)
    path = root / INDEX
    text = render(build(root))
    if args.check:
        if load(path) != json.loads(text):
            print(f"{INDEX} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        print(f"{INDEX} is current")
        return 0
    path.write_text(text)
    print(f"wrote {INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
