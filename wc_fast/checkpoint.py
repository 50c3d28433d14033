"""Atomic, verified, resumable checkpoints: safetensors weights, a JSON, tensor-only state.

A checkpoint is a directory ``step_00000010/`` holding ``<name>.safetensors`` for each model,
``state.pt`` (optimizer states, RNG states, any extra state) and ``meta.json`` (step, config and
the sha256 of every other file). It is written to a temporary sibling directory, every file and
the directory are fsynced, then it is renamed into place and the parent directory fsynced: after
a crash or power loss a checkpoint is complete or absent. Loading verifies the hashes first
(a truncated, altered or missing file raises :class:`CheckpointError` naming it) and reads
``state.pt`` with ``torch.load(weights_only=True)``, so a checkpoint cannot run code.
Only the newest ``keep_last`` are kept.

A checkpoint of a run that trains a few weights over frozen ones it never changes (LoRA over a
backbone) may hold only the trained weights; its ``meta.json`` then names the frozen weights'
source and their sha256 (a :class:`FrozenBase`), and loading it needs the same frozen weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn

from wc_fast.distributed import full_state_dict, load_full_state_dict

PREFIX = "step_"
_NAME = re.compile(rf"{PREFIX}\d{{8}}")
_TEMPORARY = re.compile(rf"\.{PREFIX}\d{{8}}\..+")
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or from an incompatible configuration."""


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


def _torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _write_files(directory: Path, step: int, models: dict, config: dict, state: dict,
                 base: FrozenBase | None) -> None:
    """Every file of checkpoint ``step`` into ``directory``, ``meta.json`` (with the others'
    hashes and the frozen ``base``, if any) last."""
    files = {f"{name}.safetensors": _write_synced(directory / f"{name}.safetensors",
                                                  safetensors_bytes(_weights(model)))
             for name, model in models.items()}
    files["state.pt"] = _write_synced(directory / "state.pt",
                                      _torch_bytes({**state, "rng": rng_state()}))
    meta = {"step": step, "config": config, "models": sorted(models), "files": files}
    if base is not None:
        meta["base"] = asdict(base)
    _write_synced(directory / "meta.json", json.dumps(meta, indent=2).encode())
    _fsync_dir(directory)


def save(directory: str | os.PathLike, step: int, *,
         models: dict[str, nn.Module | Mapping[str, torch.Tensor]],
         config: dict, state: dict, keep_last: int = 2, base: FrozenBase | None = None) -> Path:
    """Write checkpoint ``step`` atomically and durably under ``directory``; prune to
    ``keep_last``.

    ``models`` maps a name to a module or to its already gathered weights (what
    :func:`wc_fast.distributed.full_state_dict` returns for a sharded model). ``base``: the
    frozen weights the ``models`` weights leave out, when they hold only the trained ones;
    :func:`load` then needs the same. ``state`` may hold
    only tensors and plain containers/values (it is loaded with ``weights_only=True``). A failed
    write (disk full, ...) removes the temporary directory, leaves the checkpoints of other
    steps as they were and raises :class:`CheckpointError` saying so.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    _remove_temporaries(root)
    final = root / f"{PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        _write_files(tmp, step, models, config, state, base)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {final.name} in {root}: {exc}; its "
                              "temporary directory was removed and the checkpoints of other "
                              "steps are untouched") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _remove_temporaries(root: Path) -> None:
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
    """The newest checkpoint directory under ``directory`` (not verified)."""
    found = list_checkpoints(directory)
    if not found:
        raise _none_found(directory)
    return found[-1]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_meta(path: Path) -> dict:
    if not (path / "meta.json").is_file():
        raise CheckpointError(f"checkpoint {path} is damaged: meta.json is missing")
    try:
        return json.loads((path / "meta.json").read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt: meta.json is not valid JSON "
                              f"({exc})") from exc


def verify(path: str | os.PathLike) -> dict:
    """Check every file of checkpoint ``path`` against its recorded sha256; return its meta.

    Checkpoints written before the hashes were recorded load with a warning, unverified.
    """
    path = Path(path)
    meta = _read_meta(path)
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


def _load_state(file: Path) -> dict:
    """``state.pt`` read as tensors and plain values only: unpickling cannot run code."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file} holds objects other than tensors and plain values; "
                              f"refused to unpickle it (it could run code): {exc}") from exc
    except Exception as exc:
        raise CheckpointError(f"checkpoint file {file} is corrupt: {exc}") from exc


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
         restore_rng: bool = True, base: FrozenBase | None = None) -> Checkpoint:
    """Verify checkpoint ``path``, load weights into ``models`` in place and return the rest.

    Nothing is loaded into ``models`` unless every file passed its hash check and ``state.pt``
    unpickled safely. A checkpoint of trained weights over a frozen base loads only with the
    same ``base`` (the models' frozen weights, already in place): another raises
    ``ValueError``, as does none.
    """
    path = Path(path)
    meta = verify(path)
    saved = meta.get("base")
    if saved is not None and models:
        _check_base(path, saved, base)
    state = _load_state(path / "state.pt")
    try:
        for name, model in models.items():
            load_full_state_dict(model, load_file(path / f"{name}.safetensors"),
                                 partial=saved is not None)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt or incompatible: {exc}") from exc
    if restore_rng:
        set_rng_state(state["rng"])
    return Checkpoint(path=path, step=int(meta["step"]), config=meta["config"], state=state)


def load_latest_intact(directory: str | os.PathLike, *, models: dict[str, nn.Module],
                       restore_rng: bool = True, base: FrozenBase | None = None) -> Checkpoint:
    """Load the newest checkpoint under ``directory`` that passes :func:`load`'s checks,
    warning about each newer one skipped as damaged (a frozen base that differs from ``base``
    is no damage: its ``ValueError`` is raised)."""
    found = list_checkpoints(directory)
    if not found:
        raise _none_found(directory)
    skipped = []
    for path in reversed(found):
        try:
            return load(path, models=models, restore_rng=restore_rng, base=base)
        except CheckpointError as exc:
            warnings.warn(f"skipping damaged checkpoint {path.name}: {exc}", stacklevel=2)
            skipped.append(str(exc))
    raise CheckpointError(f"no intact checkpoint in {directory}: " + "; ".join(skipped))


def config_mismatch(saved: dict, current: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """``section.field`` names whose values differ between two config dicts (JSON-normalised).

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
                    diffs.append(f"{name}: checkpoint {a.get(key)!r} vs now {b.get(key)!r}")
        elif section not in ignore and a != b:
            diffs.append(f"{section}: checkpoint {a!r} vs now {b!r}")
    return diffs
