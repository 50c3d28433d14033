"""Writing the sharded checkpoints of multi-rank runs through ``torch.distributed.checkpoint``
(DCP); :func:`wc_fast.infra.checkpoint.load` reads them, as it reads the single-file format.

Every rank writes its own part (FSDP2 shards; a replicated weight once, by one rank) of the
current and old models, the optimizers and its RNG states into one temporary directory, in
parallel, instead of gathering everything on rank 0. The guarantees of
:mod:`wc_fast.infra.checkpoint` hold: once every rank's files are written, rank 0 adds ``state.pt``
(the run's tracking state) and commits the directory with
:func:`wc_fast.infra.checkpoint.commit` (``meta.json`` with every file's sha256, written last, then
the rename), so after a crash a checkpoint is complete or absent, loading checks the hashes
and falls back to the newest intact one, and rank 0 alone writes the run directory's
checkpoint names.

``asynchronous``: ``dcp.async_save`` copies the state to CPU memory and writes it from a
background thread while the next iterations run; its collectives use a process group of
their own, so they never interleave with training's. That checkpoint is committed before the
next one starts and before the run ends (:meth:`ShardedWriter.wait`); a crash before then
leaves only a temporary directory, which is never taken for a checkpoint.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from wc_fast.infra import checkpoint


def _model_state(model: nn.Module, keys: Collection[str] | None) -> dict:
    state = get_model_state_dict(model)
    return state if keys is None else {k: v for k, v in state.items() if k in keys}


@dataclass(slots=True)
class _Pending:
    """A checkpoint whose files are being written, and what its commit needs."""

    future: object
    tmp: Path
    step: int
    commit: dict


class ShardedWriter:
    """Writes the sharded checkpoints of a run into ``root`` from every rank of ``group``.
    ``asynchronous``: overlap each write with the following iterations."""

    def __init__(self, root: str | os.PathLike, rank: int, group: dist.ProcessGroup,
                 asynchronous: bool) -> None:
        self.root, self.rank, self.group = Path(root), rank, group
        self.asynchronous = asynchronous
        # the background writes' collectives get a group of their own (gloo: async_save
        # stages on the CPU), so they never interleave with the training's collectives
        self.save_group = dist.new_group(backend="gloo") if asynchronous else group
        self.pending: _Pending | None = None

    def save(self, step: int, *, models: dict[str, nn.Module], optimizers: checkpoint.Optimizers,
             keys: Collection[str] | None, state: dict, config: dict, keep_last: int,
             base: checkpoint.FrozenBase | None, run_id: str | None, world_size: int) -> Path:
        """Checkpoint ``step`` (a collective): ``models`` (only the entries ``keys`` names,
        when given), the ``optimizers`` (the model, its optimizers), every rank's RNG states,
        and rank 0's ``state``; the rest is :func:`wc_fast.infra.checkpoint.commit`'s. Returns the
        checkpoint's path, which exists once it is committed."""
        self.wait()
        final = self.root / f"{checkpoint.PREFIX}{step:08d}"
        tmp = self.root / f".{final.name}.dcp"
        if self.rank == 0:
            checkpoint.remove_temporaries(self.root)
            tmp.mkdir()
        dist.barrier(group=self.group)
        app = {name: _model_state(model, keys) for name, model in models.items()}
        app[checkpoint.OPTIMIZERS] = get_optimizer_state_dict(*optimizers)
        app[checkpoint.rng_key(self.rank)] = checkpoint.rng_state()
        commit = {"state": state, "models": list(models), "config": config,
                  "keep_last": keep_last, "base": base, "run_id": run_id,
                  "world_size": world_size}
        if self.asynchronous:
            future = dcp.async_save(app, checkpoint_id=tmp, process_group=self.save_group)
            self.pending = _Pending(future, tmp, step, commit)
        else:
            dcp.save(app, checkpoint_id=tmp, process_group=self.group)
            self._commit(tmp, step, commit)
        return final

    def wait(self) -> None:
        """Finish and commit the checkpoint being written in the background, if any."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        pending.future.result()
        self._commit(pending.tmp, pending.step, pending.commit)

    def _commit(self, tmp: Path, step: int, commit: dict) -> None:
        """On rank 0, whose save returns once every rank's files and DCP's ``.metadata`` are
        written: ``state.pt``, then :func:`wc_fast.infra.checkpoint.commit`."""
        if self.rank != 0:
            return
        state = {**commit.pop("state"), "rng": checkpoint.rng_state()}
        try:
            checkpoint.write_atomic(tmp / "state.pt", checkpoint.torch_bytes(state))
            checkpoint.commit(self.root, tmp, step, files=checkpoint.hash_files(tmp),
                              checkpoint_format=checkpoint.SHARDED, **commit)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise checkpoint.CheckpointError(
                f"could not commit checkpoint {tmp.name} in {self.root}: {exc}; its temporary "
                "directory was removed and the checkpoints of other steps are untouched"
            ) from exc
