"""studies/results/index.json: every result file with its status, none of the superseded ones
cited as current, and the command that writes and checks it."""

from pathlib import Path

import pytest

from studies import results_index as ri

ROOT = Path(__file__).resolve().parents[1]
OLD, NEW = "01d0e1d0", "9e0e1d00"
FOUND = ri.Lookups(frozenset({f"base_64x6_validation-{NEW}.json",
                              f"recipe_s0_cfg-aaaaaaaa_64x6_validation-{NEW}.json"}),
                   {("tiny", "validation"): NEW})


def test_the_index_lists_every_result_file_once_with_a_status():
    index = ri.load(ROOT / ri.INDEX)["files"]
    assert sorted(index) == ri.result_files()
    for path, entry in index.items():
        assert entry["status"] == ("superseded" if ri.archived(path) else "current"), path


def test_no_present_tense_doc_cites_a_superseded_file():
    index = ri.load(ROOT / ri.INDEX)["files"]
    cited = ri.citations()
    superseded = [p for p, e in index.items() if e["status"] == "superseded"]
    assert [(p, ri.cited_by(p, cited, superseded)) for p in superseded
            if ri.cited_by(p, cited, superseded)] == []


def _write(root: Path, path: str, text: str = "{}") -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


@pytest.fixture
def tree(tmp_path):
    """A repository with a README, a history doc and result files of every kind."""
    results = "studies/results/validation"
    _write(tmp_path, "README.md", f"Numbers: [`{results}/tiny_table.md`](x) and `chaos.json`.\n")
    _write(tmp_path, "docs/experiment_log.md", "Once: `studies/results/old/note.md`.\n")
    _write(tmp_path, f"{results}/tiny_table.md",
           "`python -m studies.final_table --seeds validation --rows recipe_if_only` (...)\n")
    for name in (f"base_64x6_validation-{OLD}.json", f"base_64x6_validation-{NEW}.json",
                 f"recipe_if_only_s0_cfg-bbbbbbbb_64x6_validation-{OLD}.json",
                 f"recipe_s0_cfg-cccccccc_64x6_validation-{OLD}.json",
                 f"recipe_s0_cfg-aaaaaaaa_64x6_validation-{NEW}.json"):
        _write(tmp_path, f"{results}/{name}")
    for name in ("chaos/chaos.json", "chaos/chaos.log", "old/note.md", "archive/old/gone.md"):
        _write(tmp_path, f"studies/results/{name}")
    return tmp_path


def test_files_are_current_by_evidence_and_superseded_with_a_reason(tree):
    files = ri.build(tree, FOUND)["files"]
    status = {Path(p).name: e["status"] for p, e in files.items()}
    assert [n for n, s in status.items() if s == "superseded"] == [
        "gone.md", "note.md", f"recipe_s0_cfg-cccccccc_64x6_validation-{OLD}.json"]
    evidence = {Path(p).name: e.get("evidence", "") for p, e in files.items()}
    assert evidence["chaos.json"] == "cited by README.md"
    assert evidence["chaos.log"].startswith("companion of")
    assert evidence[f"recipe_s0_cfg-aaaaaaaa_64x6_validation-{NEW}.json"].startswith("looked up")
    # the table's command names recipe_if_only: built from the one evaluation that has it
    assert evidence[f"base_64x6_validation-{OLD}.json"].endswith("tiny_table.md is built from it")
    reason = files[f"studies/results/validation/recipe_s0_cfg-cccccccc_64x6_validation-{OLD}"
                   ".json"]["reason"]
    assert OLD in reason and "replaced by studies/results/validation/recipe_s0_cfg-aaaaaaaa" \
        in reason


def test_check_fails_on_a_stale_index_and_passes_on_a_written_one(tree, monkeypatch, capsys):
    monkeypatch.setattr(ri, "lookups", lambda root: FOUND)
    assert ri.main([], root=tree) == 0
    assert ri.main(["--check"], root=tree) == 0
    _write(tree, "studies/results/chaos/new.json")
    assert ri.main(["--check"], root=tree) == 1
    assert "stale" in capsys.readouterr().err


@pytest.mark.parametrize("text,error", [
    ("{not json", "cannot read"),
    ('{"files": {"studies/results/missing.json": {"status": "current"}}}', "missing.json"),
    ('{"files": {"README.md": {"status": "maybe"}}}', "no status"),
    ('{"files": {"README.md": {"status": "superseded"}}}', "no reason")])
def test_a_damaged_index_is_an_error_naming_the_file(tree, text, error):
    _write(tree, str(ri.INDEX), text)
    with pytest.raises(ValueError, match=error) as raised:
        ri.load(tree / ri.INDEX)
    assert "index.json" in str(raised.value)
