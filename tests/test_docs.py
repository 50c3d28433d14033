"""The docs stand on the repository: every path they cite exists, the README stays short, and
every table row the README quotes is a line of the generated result file it cites."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a repository path in a doc: after a backtick, a link's parenthesis or a space
CITED = re.compile(r"(?:`|\]\(|\s|^)((?:\.\./)?(?:docs|studies|wc_fast|wc_kernels|bench|tests|"
                   r"csrc|examples|configs|\.ci)/[A-Za-z0-9_./*{},-]+)")
# a markdown link's target, a relative path (an address or an anchor alone is no path)
LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s#]+)")
# a placeholder in a cited path (NAME, DIR, {0,1,2}, ...): any name
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\{[^}]*\}")


def _exists(doc: Path, cited: str) -> bool:
    """Whether ``cited`` names a file or folder: as written, or with its placeholders and a
    trailing ``_`` as wildcards (a family of files)."""
    base = doc.parent if cited.startswith("../") else ROOT
    pattern = PLACEHOLDER.sub("*", cited.rstrip("/"))
    if pattern.endswith("_"):
        pattern += "*"
    return (base / cited).exists() or any(base.glob(pattern))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_cites_exists(doc):
    cited = {m.group(1).rstrip(".,;:)") for m in CITED.finditer(doc.read_text())}
    assert cited or doc.name not in ("README.md", "design.md")
    assert sorted(p for p in cited if not _exists(doc, p)) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_a_doc_makes_leads_to_a_file(doc):
    """A markdown link's target, relative to the doc, exists (its anchor aside)."""
    targets = {m.group(1) for m in LINK.finditer(doc.read_text())}
    assert sorted(t for t in targets if not (doc.parent / t).exists()) == []


def test_the_readme_is_read_in_five_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("doc", ["README.md", "docs/results.md"])
def test_quoted_result_tables_are_lines_of_the_generated_files(doc):
    """A result table in the README or docs/results.md follows a link to the generated file
    that holds it (written by ``python -m studies.final_table``); each of its lines is a line
    of that file, so the two docs quote the same numbers and neither drifts from the source."""
    text = (ROOT / doc).read_text()
    tables = re.findall(r"\[`(studies/results/[^`]+\.md)`\]\([^)]*\)[^|]*?\n\n((?:\|.*\n)+)",
                        text)
    assert len(tables) >= 2
    for source, table in tables:
        lines = set((ROOT / source).read_text().splitlines())
        missing = [row for row in table.splitlines() if row not in lines]
        assert missing == [], source
