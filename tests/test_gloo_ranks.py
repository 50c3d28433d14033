"""The multi-rank test helper reports a failing rank, and a clean exit is exit code 0."""

import pytest
from gloo_ranks import spawn_ranks


def _fails_on_rank_one(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("rank one failed on purpose")


def _writes_marker(rank: int, folder: str) -> None:
    with open(f"{folder}/rank{rank}", "w") as f:
        f.write("done")


def test_a_failing_rank_raises_its_error_in_the_caller(tmp_path):
    with pytest.raises(Exception, match="rank one failed on purpose"):
        spawn_ranks(_fails_on_rank_one, (), tmp_path)


def test_every_rank_runs_to_the_end_and_exits_cleanly(tmp_path):
    spawn_ranks(_writes_marker, (str(tmp_path),), tmp_path)
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"]
