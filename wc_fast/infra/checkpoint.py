"""Atomic, verified, resumable checkpoints: safetensors weights, a JSON, tensor-only state.

A checkpoint is a directory ``step_00000010/`` holding ``<name>.safetensors`` for each model,
``state.pt`` (optimizer states, RNG states, any extra state) and ``meta.json`` (step, config and
the sha256 of every other file). It is written to a temporary sibling directory, every file and
the directory are fsynced, then it is renamed into place and the parent directory fsynced: after
a crash or power loss a checkpoint is complete or absent. Loading verifies the hashes first
(a truncated, altered or missing file raises :class:`CheckpointError` naming it) and reads
``state.pt`` with ``torch.load(weights_only=True)``, so a checkpoint cannot run code. Every
other way a checkpoint can fail to load (a ``meta.json`` of the wrong shape, a ``state.pt``
missing what the run needs) is a :class:`CheckpointError` too, so a resumed run falls back to
an older one; a checkpoint of another configuration raises :class:`ConfigMismatchError` naming
the fields, before any weight is loaded.

``meta.json`` names the run (its lineage: a fresh run's id, kept by the runs resuming it) and
a write sequence number; only the ``keep_last`` most recently written checkpoints of the run
are kept, whatever their step numbers (a run resumed from an older checkpoint keeps what it
writes, not the newer steps it is replacing).

A checkpoint of a run that trains a few weights over frozen ones it never changes (LoRA over a
backbone) may hold only the trained weights; its ``meta.json`` then names the frozen weights'
source and their sha256 (a :class:`FrozenBase`), and loading it needs the same frozen weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from wc_fast.infra.distributed import full_state_dict, load_full_state_dict, load_optimizer_state

PREFIX = "step_"
# meta.json's format_version: 2 records the format (SINGLE or SHARDED) and the world size;
# checkpoints without one are version 1 (the single-file format)
FORMAT_VERSION = 2
SINGLE, SHARDED = "single", "dcp"
_NAME = re.compile(rf"{PREFIX}\d{{8}}")
_TEMPORARY = re.compile(rf"\.{PREFIX}\d{{8}}\..+")
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or from an incompatible configuration."""


class ConfigMismatchError(CheckpointError):
    """A checkpoint was written under another configuration (no older checkpoint of the run
    can do better: resuming falls back past damage, not past this)."""


def new_run_id() -> str:
    """The lineage id of a fresh run (kept in its checkpoints and by runs resuming them)."""
    return uuid.uuid4().hex


@dataclass(slots=True, frozen=True)
class FrozenBase:
    """The weights a checkpoint leaves out because the run never changes them: where they are
    read from (``model.path``) and the sha256 of their values (:func:`weights_sha256`)."""

    path: str
    sha256: str


def weights_sha256(weights: Mapping[str, torch.Tensor]) -> str:
    """sha256 of named tensors: each name, dtype, shape and bytes, in name order (so it does not
    depend on the files or the order they were loaded from). Streams one tensor at a time to
    the CPU."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        data = tensor.cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(data.numpy())
    return digest.hexdigest()


@dataclass(slots=True)
class Checkpoint:
    """What :func:`load` returns."""

    path: Path
    step: int
    config: dict
    state: dict
    run_id: str | None = None
    world_size: int | None = None  # ranks of the run that wrote it (None: not recorded)


# what a checkpoint's optimizer state is loaded into: the model and its optimizers
Optimizers = tuple[nn.Module, list[torch.optim.Optimizer]]


def rng_state() -> dict:
    """Every global RNG the run may touch, as tensors and plain values (``weights_only``-safe)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"bit_generator": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(cached)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state((np_state["bit_generator"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _weights(model: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(model, Mapping):
        return {k: v.detach().cpu().contiguous() for k, v in model.items()}
    return full_state_dict(model)


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path``, fsync it, and return its sha256."""
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace file ``path`` by ``data`` so that a crash leaves the old or the new content:
    a synced temporary sibling renamed over it, then the directory synced."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        _write_synced(Path(tmp), data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _meta_digest(meta: dict) -> str:
    """sha256 of ``meta.json``'s content other than this digest (canonical JSON)."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def _write_payload(directory: Path, models: dict, state: dict) -> dict[str, str]:
    """The weights of ``models`` and ``state`` (with the RNG states) into ``directory``;
    returns each file's sha256."""
    files = {f"{name}.safetensors": _write_synced(directory / f"{name}.safetensors",
                                                  safetensors_bytes(_weights(model)))
             for name, model in models.items()}
    files["state.pt"] = _write_synced(directory / "state.pt",
                                      torch_bytes({**state, "rng": rng_state()}))
    return files


def hash_files(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (paths relative to it), but ``meta.json``."""
    return {str(p.relative_to(directory)): _sha256(p) for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "meta.json"}


def commit(root: Path, tmp: Path, step: int, *, files: dict[str, str], models: list[str],
           config: dict, keep_last: int, run_id: str | None, world_size: int,
           checkpoint_format: str = SINGLE, base: FrozenBase | None = None) -> Path:
    """Make the written checkpoint directory ``tmp`` (under ``root``, its ``files`` with their
    sha256) checkpoint ``step``: ``meta.json`` (the hashes, ``config``, the run's lineage and
    write sequence, its own digest) is written last and synced, then ``tmp`` is renamed into
    place and ``root`` synced: after a crash the checkpoint is complete or absent. Then only the
    ``keep_last`` most recently written checkpoints of run ``run_id`` are kept."""
    final = root / f"{PREFIX}{step:08d}"
    order = {p: _write_order(p) for p in list_checkpoints(root)}
    run = {"id": run_id, "seq": 1 + max((seq for seq, rid in order.values()
                                         if rid is not _UNREADABLE), default=0)}
    meta = {"step": step, "config": config, "models": sorted(models), "files": files,
            "run": run, "world_size": world_size, "format": checkpoint_format,
            "format_version": FORMAT_VERSION}
    if base is not None:
        meta["base"] = asdict(base)
    meta["sha256"] = _meta_digest(meta)
    _write_synced(tmp / "meta.json", json.dumps(meta, indent=2).encode())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    order[final] = (run["seq"], run_id)
    lineage = sorted((p for p, (_, rid) in order.items() if rid == run_id),
                     key=lambda p: order[p][0])
    for old in lineage[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save(directory: str | os.PathLike, step: int, *,
         models: dict[str, nn.Module | Mapping[str, torch.Tensor]],
         config: dict, state: dict, keep_last: int = 2, base: FrozenBase | None = None,
         run_id: str | None = None, world_size: int = 1) -> Path:
    """Write checkpoint ``step`` atomically and durably under ``directory``; keep only the
    ``keep_last`` most recently written checkpoints of run ``run_id`` (its lineage:
    :func:`new_run_id` for a fresh run, :attr:`Checkpoint.run_id` for a resumed one; ``None``
    is the lineage of every checkpoint saved without one, as older checkpoints were).
    ``world_size``: the ranks of the run (recorded, so that a run resumed at another world
    size can keep its global batch). Checkpoints of other runs, and any whose ``meta.json``
    cannot be read, are left alone.

    ``models`` maps a name to a module or to its already gathered weights (what
    :func:`wc_fast.infra.distributed.full_state_dict` returns for a sharded model). ``base``: the
    frozen weights the ``models`` weights leave out, when they hold only the trained ones;
    :func:`load` then needs the same. ``state`` may hold
    only tensors and plain containers/values (it is loaded with ``weights_only=True``). A failed
    write (disk full, ...) removes the temporary directory, leaves the checkpoints of other
    steps as they were and raises :class:`CheckpointError` saying so.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    remove_temporaries(root)
    final = root / f"{PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        files = _write_payload(tmp, models, state)
        return commit(root, tmp, step, files=files, models=list(models), config=config,
                      keep_last=keep_last, run_id=run_id, world_size=world_size, base=base)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {final.name} in {root}: {exc}; its "
                              "temporary directory was removed and the checkpoints of other "
                              "steps are untouched") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# the run id of a checkpoint whose meta.json cannot be read: equal to no run's id
_UNREADABLE = object()


def _write_order(path: Path) -> tuple[float, object]:
    """(write sequence number, run id) of a checkpoint: (0, None) for one of an older version,
    which records neither; (inf, an id equal to no other) when its ``meta.json`` is unreadable,
    so that loading tries it first and warns that it skips it, and pruning leaves it."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        run = meta.get("run", {"seq": 0, "id": None})
        return int(run["seq"]), run["id"]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return math.inf, _UNREADABLE


def by_write_order(paths: list[Path]) -> list[Path]:
    """Checkpoint directories oldest-written first (by their write sequence, then step: the
    step order for checkpoints that record no sequence; unreadable ones last)."""
    return sorted(paths, key=lambda p: (_write_order(p)[0], p.name))


def remove_temporaries(root: Path) -> None:
    """Delete temporary directories a killed writer left behind (one writer per directory)."""
    for path in root.iterdir():
        if path.is_dir() and _TEMPORARY.fullmatch(path.name):
            shutil.rmtree(path, ignore_errors=True)


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoint directories (``step_NNNNNNNN``) under ``directory``, oldest first; whether
    each is intact is checked when it is loaded."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _NAME.fullmatch(p.name))


def _none_found(directory: str | os.PathLike) -> CheckpointError:
    return CheckpointError(f"no checkpoint found in {directory} (expected {PREFIX}NNNNNNNN/ "
                           "directories written by a previous run)")


def latest(directory: str | os.PathLike) -> Path:
    """The most recently written checkpoint directory under ``directory`` (not verified)."""
    found = list_checkpoints(directory)
    if not found:
        raise _none_found(directory)
    return by_write_order(found)[-1]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# the fields of meta.json and their JSON types (files, run, base, sha256, world_size, format
# and format_version are optional:
# checkpoints of older versions lack them)
_META_FIELDS = {"step": int, "config": dict, "models": list, "files": dict, "run": dict,
                "base": dict, "sha256": str, "world_size": int, "format": str,
                "format_version": int}
_REQUIRED_META = ("step", "config", "models")


def read_meta(path: str | os.PathLike) -> dict:
    """``meta.json`` of checkpoint ``path``, checked for shape (and against its own digest
    where it records one); any fault raises :class:`CheckpointError` naming the file."""
    file = Path(path) / "meta.json"
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path} is damaged: meta.json is missing")
    try:
        meta = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt: {file} is not valid JSON "
                              f"({exc})") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: {file} holds a "
                              f"{type(meta).__name__}, not an object")
    for key in _REQUIRED_META:
        if key not in meta:
            raise CheckpointError(f"checkpoint {path} is corrupt: {file} has no {key!r}")
    for key, kind in _META_FIELDS.items():
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            raise CheckpointError(f"checkpoint {path} is corrupt: {key!r} in {file} must be "
                                  f"a JSON {kind.__name__}, got {meta[key]!r:.80}")
    if "sha256" in meta and meta["sha256"] != _meta_digest(meta):
        raise CheckpointError(f"checkpoint {path} is corrupt: {file} fails its sha256 check "
                              "(altered)")
    if meta.get("format_version", 1) > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version "
                              f"{meta['format_version']}, newer than this wc_fast reads "
                              f"({FORMAT_VERSION}): load it with the version that wrote it")
    if meta.get("format", SINGLE) not in (SINGLE, SHARDED):
        raise CheckpointError(f"checkpoint {path} is corrupt: unknown format "
                              f"{meta['format']!r} in {file}")
    return meta


def verify(path: str | os.PathLike) -> dict:
    """Check every file of checkpoint ``path`` against its recorded sha256; return its meta.

    Checkpoints written before the hashes were recorded load with a warning, unverified.
    """
    path = Path(path)
    meta = read_meta(path)
    if "files" not in meta:
        warnings.warn(f"checkpoint {path} records no sha256 hashes (written by an older "
                      "wc_fast); loading it unverified", stacklevel=2)
        return meta
    for name, digest in meta["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is damaged: {name} is missing")
        if _sha256(file) != digest:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} fails its sha256 check "
                                  "(truncated or altered)")
    return meta


def _load_state(file: Path, required: tuple[str, ...]) -> dict:
    """``state.pt`` read as tensors and plain values only (unpickling cannot run code): a dict
    holding at least the keys ``required``."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file} holds objects other than tensors and plain values; "
                              f"refused to unpickle it (it could run code): {exc}") from exc
    except Exception as exc:
        raise CheckpointError(f"checkpoint file {file} is corrupt: {exc}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint file {file} is corrupt: it holds a "
                              f"{type(state).__name__}, not a dict")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint file {file} is incomplete: it has no "
                              f"{', '.join(map(repr, missing))}")
    return state


# a saved config as the running version reads it (fields added since at their defaults,
# renamed ones under their names): given by the caller, which knows the schema
ReadConfig = Callable[[dict], dict]


def check_config(path: str | os.PathLike, saved: dict, current: dict,
                 ignore: tuple[str, ...] = (), read_config: ReadConfig | None = None) -> None:
    """:class:`ConfigMismatchError` naming each field (``model.dim: 192 -> 64``, checkpoint
    value first) where ``current`` differs from the ``saved`` config of checkpoint ``path``,
    except those ``ignore`` names (:func:`config_mismatch`). ``read_config``: the saved config
    as the running version reads it, so a field added since the checkpoint was written
    compares at its default instead of as missing."""
    if read_config is not None:
        saved = read_config(saved)
    diffs = config_mismatch(saved, current, ignore)
    if diffs:
        raise ConfigMismatchError(f"checkpoint {path} was written with another config "
                                  "(checkpoint -> now): " + "; ".join(diffs))


def _check_base(path: Path, saved: dict, base: FrozenBase | None) -> None:
    """``ValueError`` unless ``base`` is the frozen base ``saved`` in checkpoint ``path``."""
    if base is None:
        raise ValueError(f"checkpoint {path} holds only the weights trained over the frozen "
                         f"weights of {saved['path']}; load it into models built on those, "
                         "passing their FrozenBase")
    if base.sha256 != saved["sha256"]:
        raise ValueError(f"checkpoint {path} was trained over frozen weights from "
                         f"{saved['path']} with sha256 {saved['sha256']}, but the frozen "
                         f"weights read from {base.path} have sha256 {base.sha256}: resume "
                         "with the base weights the run started from (model.path)")


def load(path: str | os.PathLike, *, models: dict[str, nn.Module],
         restore_rng: bool = True, base: FrozenBase | None = None,
         required_state: tuple[str, ...] = (), config: dict | None = None,
         ignore: tuple[str, ...] = (), optimizers: Optimizers | None = None,
         read_config: ReadConfig | None = None) -> Checkpoint:
    """Verify checkpoint ``path``, load weights into ``models`` in place and return the rest.

    Nothing is loaded into ``models`` unless every file passed its hash check, ``state.pt``
    unpickled safely and holds the keys ``required_state`` (and ``rng`` with
    ``restore_rng``), and, given the run's ``config``, the checkpoint's config equals it but
    for the fields ``ignore`` names, the saved one read by ``read_config`` (else
    :class:`ConfigMismatchError`). A checkpoint of
    trained weights over a frozen base loads only with the same ``base`` (the models' frozen
    weights, already in place): another raises ``ValueError``, as does none.

    ``optimizers``: (the model, its optimizers), whose state is loaded too (from ``state.pt``
    of a single-file checkpoint, which must then hold ``optimizers``). Either format loads at
    any world size; loading a sharded one is a collective when a process group is up.
    """
    path = Path(path)
    meta = verify(path)
    if config is not None:
        check_config(path, meta["config"], config, ignore, read_config)
    saved = meta.get("base")
    if saved is not None and models:
        _check_base(path, saved, base)
    missing = [name for name in models if name not in meta["models"]]
    if missing:
        raise CheckpointError(f"checkpoint {path} holds no weights for {missing} (it has "
                              f"{meta['models']})")
    sharded = meta.get("format", SINGLE) == SHARDED
    needs_optimizers = ("optimizers",) if optimizers is not None and not sharded else ()
    state = _load_state(path / "state.pt", (*required_state, *needs_optimizers,
                                            *(("rng",) if restore_rng else ())))
    try:
        if sharded:
            load_sharded(path, models, optimizers, restore_rng)
        else:
            for name, model in models.items():
                load_full_state_dict(model, load_file(path / f"{name}.safetensors"),
                                     partial=saved is not None)
            if optimizers is not None:
                load_optimizer_state(*optimizers, state["optimizers"])
            if restore_rng:
                set_rng_state(state["rng"])
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt or incompatible: {exc}") from exc
    run = meta.get("run", {})
    return Checkpoint(path=path, step=meta["step"], config=meta["config"], state=state,
                      run_id=run.get("id") if isinstance(run.get("id"), str) else None,
                      world_size=meta.get("world_size"))



def read_weights(path: str | os.PathLike, name: str) -> dict[str, torch.Tensor]:
    """The weights of model ``name`` in checkpoint ``path``, whole, on the CPU, from either
    format (unverified: :func:`verify` first where it matters)."""
    path = Path(path)
    if read_meta(path).get("format", SINGLE) == SHARDED:
        return export_weights(path, [name])[name]
    return load_file(path / f"{name}.safetensors")


def weights_bytes(path: str | os.PathLike, meta: dict) -> int:
    """Bytes of the files of checkpoint ``path`` (``meta``: its ``meta.json``) that hold its
    first model's weights (for a sharded checkpoint: every shard, which holds them and more)."""
    if meta.get("format", SINGLE) == SHARDED:
        names = [name for name in meta.get("files", {}) if name.endswith(".distcp")]
    else:
        names = [f"{meta['models'][0]}.safetensors"]
    return sum((Path(path) / name).stat().st_size for name in names)


def check_resumable(directory: str | os.PathLike, config: dict,
                    ignore: tuple[str, ...] = (), read_config: ReadConfig | None = None
                    ) -> dict | None:
    """Before any setup: :class:`CheckpointError` when ``directory`` holds no checkpoint,
    :class:`ConfigMismatchError` when the newest one whose ``meta.json`` reads was written
    with another ``config`` (but for ``ignore``; its own read by ``read_config``); returns
    that ``meta.json`` (``None`` when none reads). Damage is left to
    :func:`load_latest_intact`."""
    found = list_checkpoints(directory)
    if not found:
        raise _none_found(directory)
    for path in reversed(by_write_order(found)):
        try:
            meta = read_meta(path)
        except CheckpointError:
            continue
        check_config(path, meta["config"], config, ignore, read_config)
        return meta
    return None


def load_latest_intact(directory: str | os.PathLike, *, models: dict[str, nn.Module],
                       restore_rng: bool = True, base: FrozenBase | None = None,
                       required_state: tuple[str, ...] = (), config: dict | None = None,
                       ignore: tuple[str, ...] = (), optimizers: Optimizers | None = None,
                       read_config: ReadConfig | None = None) -> Checkpoint:
    """Load the most recently written checkpoint under ``directory`` that passes
    :func:`load`'s checks, warning about each newer one skipped as damaged (a frozen base that
    differs from ``base`` is no damage: its ``ValueError`` is raised; nor is another config:
    its :class:`ConfigMismatchError` is raised)."""
    found = list_checkpoints(directory)
    if not found:
        raise _none_found(directory)
    skipped = []
    for path in reversed(by_write_order(found)):
        try:
            return load(path, models=models, restore_rng=restore_rng, base=base,
                        required_state=required_state, config=config, ignore=ignore,
                        optimizers=optimizers, read_config=read_config)
        except ConfigMismatchError:
            raise
        except CheckpointError as exc:
            warnings.warn(f"skipping damaged checkpoint {path.name}: {exc}", stacklevel=2)
            skipped.append(str(exc))
    raise CheckpointError(f"no intact checkpoint in {directory}: " + "; ".join(skipped))


def config_mismatch(saved: dict, current: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """``section.field: saved -> current`` for each field whose values differ between two
    config dicts (JSON-normalised).

    ``ignore`` holds ``section.field`` names or whole ``section`` names.
    """
    saved, current = json.loads(json.dumps(saved)), json.loads(json.dumps(current))
    diffs = []
    for section in sorted(set(saved) | set(current)):
        a, b = saved.get(section), current.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                name = f"{section}.{key}"
                if section not in ignore and name not in ignore and a.get(key) != b.get(key):
                    diffs.append(f"{name}: {a.get(key)!r} -> {b.get(key)!r}")
        elif section not in ignore and a != b:
            diffs.append(f"{section}: {a!r} -> {b!r}")
    return diffs


# the sharded format's entries besides the models: the optimizers' state, each rank's RNG
OPTIMIZERS = "optimizers"


def rng_key(rank: int) -> str:
    """The sharded format's entry of rank ``rank``'s RNG states."""
    return f"rng_rank{rank}"


def load_sharded(path: Path, models: dict[str, nn.Module],
                 optimizers: Optimizers | None, restore_rng: bool) -> None:
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
    rng = rng_key(rank) if any(k.startswith(rng_key(rank) + ".") for k in saved) \
        else rng_key(0)
    if restore_rng:
        app[rng] = rng_state()
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
        set_rng_state(app[rng])


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
