"""Multi-rank runs under faults: a stalled rank is named, a restarted job resumes by itself,
and a run resumes at another world size."""

import json
import signal
import time

import pytest
from rank_processes import RankProcesses

from wc_fast import config
from wc_fast.watchdog import EXIT_STALLED, Watchdog

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
    monkeypatch.setattr("wc_fast.watchdog.time.monotonic", fake)
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
