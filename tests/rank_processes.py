"""Start ``python -m wc_fast.train`` as the ranks of one job, each its own process, as
torchrun's workers are (so one can be stopped or killed on its own).

The test process hosts the rendezvous ``TCPStore`` on a port the kernel picks (no port is
chosen, released and raced for); the ranks connect to it as torchrun's workers connect to
their agent's store (``TORCHELASTIC_USE_AGENT_STORE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torch.distributed import TCPStore

REPO = Path(__file__).resolve().parents[1]


def checkout_env() -> dict[str, str]:
    """This checkout first on ``PYTHONPATH``, one torch thread per rank."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


class RankProcesses:
    """``world`` ranks of ``python -m wc_fast.train args``; each rank's output goes to
    ``logs/rank_<r>.log`` (a file: a full pipe would stall the rank). ``store``: the
    rendezvous store to meet in (a new one by default; pass the previous attempt's
    :attr:`store` to restart a job as torchrun does). A context manager that kills whatever
    still runs on exit."""

    def __init__(self, args: list[str], world: int, logs: Path,
                 extra_env: dict[str, str] | None = None, store: TCPStore | None = None
                 ) -> None:
        self.store = store or TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        logs.mkdir(parents=True, exist_ok=True)
        self.logs = [logs / f"rank_{r}.log" for r in range(world)]
        env = {**checkout_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port),
               "WORLD_SIZE": str(world), "TORCHELASTIC_USE_AGENT_STORE": "True",
               **(extra_env or {})}
        self.procs = []
        for rank in range(world):
            with self.logs[rank].open("w") as err:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "wc_fast.train", *args],
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=err, stderr=subprocess.STDOUT))

    def __enter__(self) -> RankProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def wait(self, timeout: float) -> list[int]:
        """Wait for every rank to end; their exit statuses."""
        return [proc.wait(timeout=timeout) for proc in self.procs]
