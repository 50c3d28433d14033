"""How a worker that ``torchrun --max-restarts`` restarted treats its run directory.

torchrun restarts every worker of a job when one fails (killed, out of memory, a stalled peer
named by :mod:`wc_fast.infra.watchdog`), with ``TORCHELASTIC_RESTART_COUNT`` one higher each time.
A restarted worker finds the directory its own first start claimed, now holding that job's
checkpoints and ``metrics.jsonl``: it resumes from the newest intact checkpoint (as
``--resume`` does), or starts over when the job wrote none yet, instead of refusing the used
directory as a fresh run must.

"Its own": rank 0 records the job in ``elastic_job.json`` once it has claimed the directory
(the torchrun run id, the host, and the pid of the torchrun agent that launched it, which
stays the same across restarts). A restart into a directory the job never claimed (its first
start was refused, or the agent is another one) is a first start again, refused as usual.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from wc_fast.infra import checkpoint

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
RUN_ID = "TORCHELASTIC_RUN_ID"
JOB_FILE = "elastic_job.json"


def restart_count() -> int:
    """How many times torchrun has restarted this job's workers (0 outside torchrun)."""
    return int(os.environ.get(RESTART_COUNT, "0") or 0)


def job() -> dict | None:
    """This torchrun job's identity, the same in every attempt (``None`` outside torchrun)."""
    if RUN_ID not in os.environ:
        return None
    return {"run_id": os.environ[RUN_ID], "host": socket.gethostname(), "agent": os.getppid()}


def start_mode(directory: str | os.PathLike, resume: bool, overwrite: bool
               ) -> tuple[bool, bool]:
    """``(resume, overwrite)`` for this start into ``directory`` (call it on rank 0 holding the
    directory's lock): the command line's, except in a restart of the job that claimed the
    directory, which resumes if the job wrote a checkpoint and starts over if not."""
    current = job()
    if restart_count() == 0 or current is None or recorded_job(directory) != current:
        return resume, overwrite
    if checkpoint.list_checkpoints(directory):
        return True, False
    return False, True


def recorded_job(directory: str | os.PathLike) -> dict | None:
    """The job recorded in ``directory`` (``None`` when none is, or the record is damaged)."""
    try:
        found = json.loads((Path(directory) / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def record_job(directory: str | os.PathLike) -> None:
    """Note that this torchrun job has claimed ``directory`` (nothing outside torchrun)."""
    current = job()
    if current is not None:
        checkpoint.write_atomic(Path(directory) / JOB_FILE, json.dumps(current).encode())
