"""Multi-rank runs under faults: a stalled rank is named, a restarted job resumes by itself,
and a run resumes at another world size."""

import json
import shutil
import signal
import time

import pytest
import torch
from rank_processes import RankProcesses
from torch import nn

from wc_fast import config
from wc_fast.infra import checkpoint, elastic
from wc_fast.infra.rank_layout import follow_world_size
from wc_fast.infra.run_dir import RunDirError, claim
from wc_fast.infra.watchdog import EXIT_STALLED, Watchdog
from wc_fast.train import main

SMOKE = ["--preset", "smoke"]


# -- the watchdog --------------------------------------------------------------------------------

class _Clock:
    """A monotonic clock the test advances."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr("wc_fast.infra.watchdog.time.monotonic", fake)
    return fake


def _watch(tmp_path, rank: int, world: int = 3) -> Watchdog:
    """A watchdog whose heartbeats and checks the test drives (its thread is not started)."""
    watch = Watchdog(tmp_path, rank, world, timeout=10.0)
    watch.begin()
    return watch


def test_a_silent_peer_is_named_with_its_last_step_and_a_beating_one_is_not(tmp_path, clock):
    watchers = [_watch(tmp_path, r) for r in range(3)]
    for w in watchers:
        w.step = 4
        w.beat()
    assert watchers[0].stalled() == []
    clock.now += 6
    watchers[0].stalled()
    for w in watchers[:2]:  # rank 2 stops beating
        w.step = 5
        w.beat()
    clock.now += 6  # 12 s since rank 2's last beat, 6 s since the others'
    named = watchers[0].stalled()
    assert [(s.rank, s.step) for s in named] == [(2, 4)]
    assert named[0].silent_s == pytest.approx(12.0)
    assert "watchdog: rank 2 stalled: no heartbeat for 12 s " \
           "(train.collective_timeout_s=10); its last reported step was 4" \
           in named[0].describe(10.0)


def test_a_peer_that_ended_cleanly_is_not_named_but_a_done_mark_left_over_is(tmp_path, clock):
    first = [_watch(tmp_path, r, world=2) for r in range(2)]
    for w in first:
        w.beat(done=True)  # a previous attempt that ended cleanly
    watch = _watch(tmp_path, 0, world=2)  # the next attempt starts watching
    clock.now += 11
    assert [s.rank for s in watch.stalled()] == [1]  # its peer never beat in this attempt
    peer = _watch(tmp_path, 1, world=2)
    peer.beat()
    watch.stalled()
    peer.beat(done=True)
    clock.now += 100
    assert watch.stalled() == []


def test_a_peer_that_never_beat_is_named_without_a_step(tmp_path, clock):
    watch = _watch(tmp_path, 0, world=2)
    clock.now += 10.5
    assert [(s.rank, s.step) for s in watch.stalled()] == [(1, None)]
    assert "it never reported a step" in watch.stalled()[0].describe(10)


def test_a_failed_collective_names_a_peer_silent_for_three_beats(tmp_path, clock, monkeypatch):
    """A collective that timed out on a stopped peer can raise before the watch's timeout:
    leaving the watch with that error names any peer silent for 3 beats; a clean exit or an
    error while every peer beats names none."""
    named = []
    monkeypatch.setattr("wc_fast.infra.watchdog.exit_stalled", lambda found, timeout: named.append(
        [s.rank for s in found]))
    watch, peer = _watch(tmp_path, 0, world=2), _watch(tmp_path, 1, world=2)
    peer.beat()
    watch.stalled()
    clock.now += 2.5 * watch.interval
    watch.__exit__(RuntimeError, RuntimeError("gloo timed out"), None)
    clock.now += 1.0 * watch.interval  # 3.5 beats
    watch.__exit__(None, None, None)
    assert named == []
    watch.__exit__(RuntimeError, RuntimeError("gloo timed out"), None)
    assert named == [[1]]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_collective_timeout_must_be_positive_and_finite(value):
    cfg = config.preset("smoke")
    config.apply_override(cfg, "train.collective_timeout_s", value)
    with pytest.raises(ValueError, match="config train.collective_timeout_s must be "):
        config.validate(cfg)


def _wait_for(condition, deadline_s: float, what: str) -> None:
    """Poll ``condition`` (a file another process writes) until it holds."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _reported_step(out, rank: int) -> int:
    try:
        return json.loads((out / "heartbeat" / f"rank_{rank}.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_a_stopped_rank_is_named_and_its_peer_exits_in_time(tmp_path):
    """SIGSTOP rank 0 (the store's and the lock's holder) mid-run: rank 1 exits within
    collective_timeout_s + 30 s, saying which rank stalled and its last step."""
    timeout = 5
    out = tmp_path / "run"
    args = [*SMOKE, "--steps", "100000", "--out", str(out), "--train.ckpt_every", "1000",
            "--train.reader_gap_every", "0", "--train.collective_timeout_s", str(timeout)]
    with RankProcesses(args, 2, tmp_path / "logs") as ranks:
        _wait_for(lambda: min(_reported_step(out, r) for r in (0, 1)) >= 2, 120,
                  "both ranks to run iteration 2")
        ranks.procs[0].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        ranks.procs[1].wait(timeout=timeout + 30)
        waited = time.monotonic() - stopped
        log = ranks.log(1)
        assert ranks.procs[1].returncode == EXIT_STALLED, log[-2000:]
        lines = [line for line in log.splitlines() if line.startswith("watchdog:")]
        assert len(lines) == 1 and "watchdog: rank 0 stalled" in lines[0], log[-2000:]
        step = int(lines[0].split("last reported step was ")[1].split(".")[0])
        assert step >= 2
        assert waited <= timeout + 30


# -- a restarted job resumes by itself -----------------------------------------------------------

def _elastic_env(monkeypatch, restart: int, run_id: str = "job-a") -> None:
    monkeypatch.setenv(elastic.RESTART_COUNT, str(restart))
    monkeypatch.setenv(elastic.RUN_ID, run_id)


def _used(directory) -> None:
    checkpoint.save(directory, 3, models={"model": nn.Linear(2, 2)}, config={}, state={})
    (directory / "metrics.jsonl").write_text('{"step": 3}\n')


def test_a_restart_of_the_job_that_claimed_the_directory_resumes_it(tmp_path, monkeypatch):
    _elastic_env(monkeypatch, 0)
    elastic.record_job(tmp_path)  # the first start claimed it
    _elastic_env(monkeypatch, 2)
    assert elastic.start_mode(tmp_path, resume=False, overwrite=False) == (False, True)
    _used(tmp_path)
    # --overwrite on the command line deletes the run once, at the first start, never again
    assert elastic.start_mode(tmp_path, resume=False, overwrite=True) == (True, False)


def test_a_first_start_or_another_jobs_restart_into_a_used_directory_is_refused(
        tmp_path, monkeypatch):
    _used(tmp_path)
    _elastic_env(monkeypatch, 0)
    elastic.record_job(tmp_path)
    assert elastic.start_mode(tmp_path, resume=False, overwrite=False) == (False, False)
    _elastic_env(monkeypatch, 1, run_id="job-b")  # e.g. a job whose first start was refused
    resume, overwrite = elastic.start_mode(tmp_path, resume=False, overwrite=False)
    with pytest.raises(RunDirError, match="already holds a run"):
        claim(tmp_path, resume=resume, overwrite=overwrite)
    monkeypatch.delenv(elastic.RUN_ID)  # outside torchrun nothing is recorded or resumed
    monkeypatch.delenv(elastic.RESTART_COUNT)
    assert elastic.job() is None and elastic.restart_count() == 0


def _final_weights(out) -> dict:
    return checkpoint.read_weights(checkpoint.latest(out), "model")


@pytest.mark.slow
def test_a_killed_rank_restarts_the_job_from_its_newest_checkpoint(tmp_path):
    """Two ranks; rank 1 is killed (SIGKILL) mid-run; the job restarted as torchrun restarts
    it (the same rendezvous store, TORCHELASTIC_RESTART_COUNT=1, the same command) resumes
    from the newest complete checkpoint and ends with the uninterrupted job's weights."""
    args = [*SMOKE, "--steps", "4", "--train.ckpt_every", "1", "--train.reader_gap_every",
            "0"]
    reference, out = tmp_path / "reference", tmp_path / "run"
    with RankProcesses([*args, "--out", str(reference)], 2, tmp_path / "logs_ref") as ranks:
        assert ranks.wait(timeout=300) == [0, 0], ranks.log(0)[-2000:]
    job = {elastic.RUN_ID: "job-a"}
    with RankProcesses([*args, "--out", str(out)], 2, tmp_path / "logs_0",
                       {**job, elastic.RESTART_COUNT: "0"}) as first:
        _wait_for(lambda: _reported_step(out, 1) >= 3, 120, "rank 1 to run iteration 3")
        first.procs[1].kill()
        statuses = first.wait(timeout=60)
        assert statuses[1] == -signal.SIGKILL and statuses[0] != 0
        newest = checkpoint.load_latest_intact(out, models={}, restore_rng=False)
        with RankProcesses([*args, "--out", str(out)], 2, tmp_path / "logs_1",
                           {**job, elastic.RESTART_COUNT: "1"}, store=first.store) as second:
            assert second.wait(timeout=300) == [0, 0], second.log(0)[-2000:]
            assert f"resumed from checkpoint {newest.path.name}" in second.log(0)
    want, got = _final_weights(reference), _final_weights(out)
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    rows = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(1, 5))


# -- another world size ---------------------------------------------------------------------------

# measured differences between a run resumed at another world size and the uninterrupted one
# (2 ranks -> 1 and 1 -> 2, 2 steps of the smoke preset): see docs/design.md; a logic error
# (other groups, other noise, a lost optimizer state) moves weights by 1e-3 or more
WORLD_SIZE_ATOL = 5e-5


def _resume_point(run, copy):
    """A copy of ``run`` as if it had been stopped after its next-to-last checkpoint."""
    shutil.copytree(run, copy)
    shutil.rmtree(checkpoint.latest(copy))


def _assert_close(want: dict, got: dict) -> None:
    assert want.keys() == got.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=WORLD_SIZE_ATOL, msg=key)


ARGS = [*SMOKE, "--steps", "2", "--train.ckpt_every", "1", "--train.keep_last", "3",
        "--train.reader_gap_every", "0"]


@pytest.mark.slow
def test_a_run_saved_at_two_ranks_resumes_at_one_with_the_same_global_batch(tmp_path):
    run, resumed = tmp_path / "two", tmp_path / "resumed"
    with RankProcesses([*ARGS, "--out", str(run)], 2, tmp_path / "logs") as ranks:
        assert ranks.wait(timeout=300) == [0, 0], ranks.log(0)[-2000:]
    _resume_point(run, resumed)
    with pytest.warns(UserWarning, match=r"of 2 rank\(s\) at 1: rollout.groups_per_rank 1 -> 2, "
                                         "keeping 2 groups per iteration"):
        assert main([*ARGS, "--out", str(resumed), "--resume"]) == 0
    meta = checkpoint.read_meta(checkpoint.latest(resumed))
    assert (meta["world_size"], meta["config"]["rollout"]["groups_per_rank"]) == (1, 2)
    _assert_close(_final_weights(run), _final_weights(resumed))


@pytest.mark.slow
def test_a_run_saved_at_one_rank_resumes_at_two(tmp_path):
    run, resumed = tmp_path / "one", tmp_path / "resumed"
    assert main([*ARGS, "--out", str(run), "--rollout.groups_per_rank", "2"]) == 0
    _resume_point(run, resumed)
    with RankProcesses([*ARGS, "--out", str(resumed), "--resume"], 2, tmp_path / "logs") as ranks:
        assert ranks.wait(timeout=300) == [0, 0], ranks.log(0)[-2000:]
    meta = checkpoint.read_meta(checkpoint.latest(resumed))
    assert (meta["world_size"], meta["config"]["rollout"]["groups_per_rank"]) == (2, 1)
    _assert_close(_final_weights(run), _final_weights(resumed))


def test_a_global_batch_that_does_not_split_or_was_changed_is_refused(tmp_path):
    saved = config.to_dict(config.preset("smoke"))
    saved["rollout"]["groups_per_rank"] = 3
    cfg = config.preset("smoke")
    cfg.rollout.groups_per_rank = 3
    with pytest.raises(checkpoint.ConfigMismatchError,
                       match=r"1 rank\(s\) x 3 group\(s\) = 3 groups per iteration; resuming at 2 "
                             r"rank\(s\) needs rollout.groups_per_rank x ranks = 3"):
        follow_world_size(cfg, saved, 1, 2, "ckpt")
    cfg.rollout.groups_per_rank = 2  # set on the command line: 4 groups, not the run's 3
    with pytest.raises(checkpoint.ConfigMismatchError, match="rollout.groups_per_rank is 2"):
        follow_world_size(cfg, saved, 1, 2, "ckpt")
    with pytest.raises(checkpoint.ConfigMismatchError, match="rollout.groups_per_rank: 3 -> 2"):
        follow_world_size(cfg, saved, None, 2, "ckpt")  # an older checkpoint: no world size
