"""Graceful stops on SIGTERM / SIGINT (cluster preemption, Ctrl-C).

The first signal asks the run to stop after the current iteration (it then checkpoints and
exits with :data:`EXIT_PREEMPTED`); a second one exits at once with ``128 + signal``. Under
several ranks the request is all-reduced every iteration, so every rank stops after the same
iteration even when only some of them received the signal.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

import torch
import torch.distributed as dist

# the exit status of a run stopped by a signal after writing its checkpoint (128 + SIGTERM,
# what schedulers expect of a process that ended on SIGTERM)
EXIT_PREEMPTED = 143
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Context manager that installs the handlers (main thread only) and restores the previous
    ones on exit; :meth:`agreed` says whether to stop after this iteration."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            os._exit(128 + signum)
        self.signal = signum
        print(f"{signal.Signals(signum).name}: stopping after this iteration with a checkpoint "
              "(send it again to exit at once)", file=sys.stderr, flush=True)

    def agreed(self, world_size: int = 1, group: dist.ProcessGroup | None = None,
               device: torch.device | None = None) -> bool:
        """Whether any rank was asked to stop (a collective when ``world_size`` > 1)."""
        asked = self.signal is not None
        if world_size == 1:
            return asked
        flag = torch.tensor([float(asked)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())
