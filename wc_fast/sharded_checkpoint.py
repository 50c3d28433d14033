"""Sharded checkpoints of multi-rank runs through ``torch.distributed.checkpoint`` (DCP).

Every rank writes its own part (FSDP2 shards; a replicated weight once, by one rank) of the
current and old models, the optimizers and its RNG states into one temporary directory, in
parallel, instead of gathering everything on rank 0. The guarantees of
:mod:`wc_fast.checkpoint` hold: once every rank's files are written, rank 0 adds ``state.pt``
(the run's tracking state) and commits the directory with
:func:`wc_fast.checkpoint.commit` (``meta.json`` with every file's sha256, written last, then
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
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from wc_fast import checkpoint

OPTIMIZERS = "optimizers"


def _rng_key(rank: int) -> str:
    return f"rng_rank{rank}"


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
        and rank 0's ``state``; the rest is :func:`wc_fast.checkpoint.commit`'s. Returns the
        checkpoint's path, which exists once it is committed."""
        self.wait()
        final = self.root / f"{checkpoint.PREFIX}{step:08d}"
        tmp = self.root / f".{final.name}.dcp"
        if self.rank == 0:
            checkpoint.remove_temporaries(self.root)
            tmp.mkdir()
        dist.barrier(group=self.group)
        app = {name: _model_state(model, keys) for name, model in models.items()}
        app[OPTIMIZERS] = get_optimizer_state_dict(*optimizers)
        app[_rng_key(self.rank)] = checkpoint.rng_state()
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
        written: ``state.pt``, then :func:`wc_fast.checkpoint.commit`."""
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


def load_sharded(path: Path, models: dict[str, nn.Module],
                 optimizers: checkpoint.Optimizers | None, restore_rng: bool) -> None:
    """Load sharded checkpoint ``path`` into ``models`` (the entries it holds: a checkpoint of
    trained weights leaves the frozen ones as they are), the ``optimizers`` and, with
    ``restore_rng``, this rank's RNG states (rank 0's when it was written at fewer ranks),
    at any world size (DCP reshards)."""
    saved = FileSystemReader(path).read_metadata().state_dict_metadata
    app: dict = {}
    for name, model in models.items():
        state = get_model_state_dict(model)
        app[name] = {k: v for k, v in state.items() if f"{name}.{k}" in saved}
    if optimizers is not None:
        app[OPTIMIZERS] = get_optimizer_state_dict(*optimizers)
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng = _rng_key(rank) if any(k.startswith(_rng_key(rank) + ".") for k in saved) \
        else _rng_key(0)
    if restore_rng:
        app[rng] = checkpoint.rng_state()
    with warnings.catch_warnings():
        # one process reading a checkpoint of several is intended here (a resume at one
        # rank, wc_fast.eval): DCP warns about it all the same
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(app, checkpoint_id=path, no_dist=not dist.is_initialized())
    for name, model in models.items():
        partial = len(app[name]) < len(get_model_state_dict(model))
        set_model_state_dict(model, app[name], options=StateDictOptions(strict=not partial))
    if optimizers is not None:
        set_optimizer_state_dict(*optimizers, app[OPTIMIZERS])
    if restore_rng:
        checkpoint.set_rng_state(app[rng])


def export_weights(path: Path, names: Collection[str]) -> dict[str, dict[str, torch.Tensor]]:
    """The whole weights of the models ``names`` in sharded checkpoint ``path``, read on one
    process (no process group needed)."""
    # what torch.distributed.checkpoint.format_utils.dcp_to_torch_save does, for some keys
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    app: dict = {}
    _load_state_dict(app, storage_reader=FileSystemReader(path),
                     planner=_EmptyStateDictLoadPlanner(keys=set(names)), no_dist=True)
    return {name: {k: v.contiguous() for k, v in app[name].items()} for name in names}
