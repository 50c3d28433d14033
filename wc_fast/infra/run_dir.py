"""The output directory of a run: checked before any setup, held by one writer at a time, and
never silently reused.

- :func:`check_writable_dir` / :func:`check_writable_file`: a path that names a file, lies under
  one, or cannot be written fails at once, before minutes of model and reward-model loading.
- :class:`RunLock`: an exclusive ``fcntl.flock`` on ``run.lock`` in the directory, which records
  the holder's pid, host and start time. A second writer is refused with an error naming the
  holder. The kernel drops the lock when its holder dies (also on ``kill -9``), so a lock file
  still naming a process is stale; it is taken over with a warning naming that process (unless
  that process runs on this host, a file system that does not enforce the lock: refused).
- :func:`claim`: a fresh run into a directory that already holds a run (checkpoints or
  ``metrics.jsonl``) is refused unless it resumes that run or ``overwrite`` deletes it.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
import warnings
from pathlib import Path

from wc_fast.infra import checkpoint

LOCK_NAME = "run.lock"
METRICS_NAME = "metrics.jsonl"


class RunDirError(RuntimeError):
    """A run directory cannot be used: not writable, held by another writer, or holding
    another run."""


def check_writable_dir(path: str | os.PathLike, field: str) -> Path:
    """Create directory ``path`` (the value of config ``field``) if needed and prove a file can
    be created in it; ``RunDirError`` naming the field otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{field} {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise RunDirError(f"{field} {path} is not a writable directory: {exc.strerror or exc}"
                          ) from exc
    return path


def check_writable_file(path: str | os.PathLike, what: str) -> Path:
    """Check that file ``path`` (``what``, e.g. ``--json``) can be written later, without
    creating it: its parent directory is created and probed with a temporary file."""
    path = Path(path)
    if path.is_dir():
        raise RunDirError(f"{what} {path} is a directory, not a file")
    check_writable_dir(path.parent, f"{what}'s directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise RunDirError(f"{what} {path} is not writable")
    return path


def _running_here(holder: dict) -> bool:
    """Whether ``holder`` names another process alive on this host."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) \
            or pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _holder_text(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on host {holder.get('host')} (since "
            f"{holder.get('since')}: {holder.get('command')})")


class RunLock:
    """Exclusive lock of a run directory for as long as the context is entered."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _read(self, fd: int) -> dict | None:
        """The holder recorded in the lock file (``None`` when it is empty or unreadable)."""
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 1 << 16).decode(errors="replace")
        try:
            holder = json.loads(text) if text.strip() else None
        except ValueError:
            return {"pid": None, "host": None, "since": None, "command": text[:200]}
        return holder if isinstance(holder, dict) else None

    def acquire(self) -> None:
        """Take the lock or raise ``RunDirError`` naming its holder; warn when taking over a
        stale one."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = self._read(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunDirError(f"cannot lock {self.path}: {exc}") from exc
            who = _holder_text(holder) if holder else "another process"
            raise RunDirError(f"{self.path.parent} is in use by {who}: one run writes a "
                              "directory at a time; wait for it, stop it, or choose another "
                              "--out") from None
        stale = self._read(fd)
        if stale and _running_here(stale):
            os.close(fd)
            raise RunDirError(f"{self.path.parent} is in use by {_holder_text(stale)}, which "
                              f"is running (this file system did not enforce the lock); if "
                              f"that is no wc_fast run, delete {self.path}")
        if stale:
            warnings.warn(f"taking over the stale lock {self.path} of {_holder_text(stale)}: "
                          "that process no longer holds it (it ended without releasing it)",
                          stacklevel=2)
        mine = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the lock file (a clean end) and unlock; the file stays, so a process waiting
        on it never locks a file another one has just replaced."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def previous_run(directory: str | os.PathLike) -> list[str]:
    """What in ``directory`` belongs to an earlier run: its checkpoints and a non-empty
    ``metrics.jsonl`` (names; empty for a new directory)."""
    root = Path(directory)
    found = [p.name for p in checkpoint.list_checkpoints(root)]
    metrics = root / METRICS_NAME
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_NAME)
    return found


def claim(directory: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """Refuse a fresh run into a directory holding another run unless ``overwrite``, which
    first deletes that run's checkpoints and ``metrics.jsonl`` (call it holding the lock)."""
    if resume:
        return
    found = previous_run(directory)
    if not found:
        return
    if not overwrite:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise RunDirError(f"{directory} already holds a run ({shown}): continue it with "
                          "--resume, or start over with --overwrite (which deletes its "
                          "checkpoints and metrics.jsonl), or choose another --out")
    root = Path(directory)
    for name in found:
        target = root / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
