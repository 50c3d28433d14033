"""Per-rank heartbeats and a watchdog that names a stalled rank and ends this one.

Written here rather than taken from the backend: NCCL has a watchdog thread (and a flight
recorder) that aborts a hung collective, gloo has neither. A gloo collective waiting on a peer
that is stopped (SIGSTOP, a frozen node) only fails after the process-group timeout, with an
error that names no rank, and a rank doing work without collectives never notices at all.

Each rank's daemon thread writes ``heartbeat/rank_<r>.json`` in the run directory (rank,
step, pid, a beat counter, the wall time) every ``interval`` seconds and reads its peers'.
A peer whose heartbeat has not changed for ``timeout`` seconds (timed on this rank's
monotonic clock, so clocks of other hosts do not matter) is named in one line on stderr, and
this process exits with :data:`EXIT_STALLED`: under ``torchrun --max-restarts`` the agent then
stops every worker and restarts the job, which resumes from its newest checkpoint.

Files, not the rendezvous store: a ``TCPStore`` served from the stopped rank's process would
block the watchdog's own reads, while a file of a stopped writer just stops changing. The run
directory is shared by every rank already (each one reads the checkpoints on resume).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# the exit status of a rank that gave up on a stalled peer (EX_TEMPFAIL: try again)
EXIT_STALLED = 75
DIRECTORY = "heartbeat"


@dataclass(slots=True)
class Stalled:
    """A peer whose heartbeat stopped: its rank, how long ago it last changed (seconds, on
    this rank's clock) and the step it last reported (``None`` if it never wrote one)."""

    rank: int
    silent_s: float
    step: int | None

    def describe(self, timeout: float) -> str:
        step = "it never reported a step" if self.step is None else \
            f"its last reported step was {self.step}"
        return (f"watchdog: rank {self.rank} stalled: no heartbeat for {self.silent_s:.0f} s "
                f"(train.collective_timeout_s={timeout:g}); {step}. Exiting with status "
                f"{EXIT_STALLED} so that the launcher restarts the job")


def beat_interval(timeout: float) -> float:
    """Seconds between heartbeats for a ``timeout``: ten beats per timeout, between 0.1 s and
    1 s apart."""
    return min(max(timeout / 10, 0.1), 1.0)


class Watchdog:
    """Heartbeat of rank ``rank`` of ``world_size`` in ``directory`` and the watch over its
    peers; a context manager that starts and stops the thread. Set :attr:`step` as the run
    advances (it is reported in the heartbeat)."""

    def __init__(self, directory: str | os.PathLike, rank: int, world_size: int,
                 timeout: float) -> None:
        self.folder = Path(directory) / DIRECTORY
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.interval = beat_interval(timeout)
        self.step: int = 0
        self._beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wc_fast-watchdog", daemon=True)
        # per peer: (the heartbeat content last seen, when it last changed on our clock), and
        # what its file held when the watch began (a previous attempt's, possibly marked done)
        self._seen: dict[int, tuple[object, float]] = {}
        self._initial: dict[int, object] = {}
        self._lock = threading.Lock()  # the thread and an error in the main thread both read

    def __enter__(self) -> Watchdog:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        """Stop; when the run failed with an error, first name a peer gone silent for a few
        beats: a collective that timed out on a stopped peer raises in the main thread, which
        can happen before the watch's own timeout has passed."""
        if kind is not None and issubclass(kind, Exception):
            stalled = self.stalled(older_than=3 * self.interval)
            if stalled:
                exit_stalled(stalled, self.timeout)
        self.stop(done=kind is None)

    def start(self) -> None:
        """Begin the watch, beat once, and start the thread."""
        self.begin()
        self.beat()
        self._thread.start()

    def begin(self) -> None:
        """Take the peers' heartbeat files as they are now as the watch's starting point."""
        self.folder.mkdir(parents=True, exist_ok=True)
        now = time.monotonic()
        with self._lock:
            self._initial = {r: self._read(r) for r in range(self.world_size) if r != self.rank}
            self._seen = {r: (beat, now) for r, beat in self._initial.items()}

    def stop(self, done: bool = True) -> None:
        """Stop beating and watching; ``done``: the run ended cleanly, and a last heartbeat
        says so (peers stop watching it; otherwise they name it if this process lingers)."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join()
        if done:
            self.beat(done=True)

    def _path(self, rank: int) -> Path:
        return self.folder / f"rank_{rank}.json"

    def beat(self, done: bool = False) -> None:
        """Write this rank's heartbeat (``done``: the last one of a clean end)."""
        self._beats += 1
        beat = {"rank": self.rank, "step": self.step, "pid": os.getpid(), "beat": self._beats,
                "time": time.time(), "done": done}
        path = self._path(self.rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(beat))
        os.replace(tmp, path)  # a reader sees the old beat or the new one, never half of one

    def _read(self, rank: int) -> dict | None:
        try:
            beat = json.loads(self._path(rank).read_text())
        except (OSError, ValueError):
            return None
        return beat if isinstance(beat, dict) else None

    def stalled(self, older_than: float | None = None) -> list[Stalled]:
        """Peers whose heartbeat has not changed for ``older_than`` seconds (default: the
        timeout) and that have not ended cleanly; reading their files refreshes the view."""
        limit = self.timeout if older_than is None else older_than
        with self._lock:
            return self._stalled(limit)

    def _stalled(self, limit: float) -> list[Stalled]:
        now, found = time.monotonic(), []
        for rank, (last, since) in self._seen.items():
            beat = self._read(rank)
            if beat != last:
                self._seen[rank] = (beat, now)
                continue
            if beat is not None and beat.get("done") and beat != self._initial[rank]:
                continue
            if now - since > limit:
                step = beat.get("step") if beat is not None else None
                found.append(Stalled(rank, now - since, step if isinstance(step, int) else None))
        return found

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except OSError as exc:  # a passing file-system fault must not end the watch
                if not failed:
                    print(f"watchdog: rank {self.rank} could not write its heartbeat ({exc}); "
                          f"its peers name it as stalled if this lasts "
                          f"{self.timeout:g} s", file=sys.stderr, flush=True)
                failed = True
            stalled = self.stalled()
            if stalled:
                exit_stalled(stalled, self.timeout)


def exit_stalled(stalled: list[Stalled], timeout: float) -> None:
    """Print one line naming the first stalled peer and end the process at once
    (``os._exit``: the main thread may be blocked inside a collective that never returns)."""
    print(stalled[0].describe(timeout), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_STALLED)
