"""Atomic, resumable checkpoints: safetensors weights + a small JSON + torch-saved state.

A checkpoint is a directory ``step_00000010/`` holding ``<name>.safetensors`` for each model,
``state.pt`` (optimizer states, RNG states, any extra state) and ``meta.json`` (step, config).
It is written to a temporary sibling directory and renamed into place, so a crash never leaves
a half-written checkpoint under a final name; only the newest ``keep_last`` are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from wc_fast.distributed import full_state_dict, load_full_state_dict

PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or from an incompatible configuration."""


@dataclass(slots=True)
class Checkpoint:
    """What :func:`load` returns."""

    path: Path
    step: int
    config: dict
    state: dict


def rng_state() -> dict:
    """Every global RNG the run may touch."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _weights(model: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(model, Mapping):
        return {k: v.detach().cpu().contiguous() for k, v in model.items()}
    return full_state_dict(model)


def save(directory: str | os.PathLike, step: int, *,
         models: dict[str, nn.Module | Mapping[str, torch.Tensor]],
         config: dict, state: dict, keep_last: int = 2) -> Path:
    """Write checkpoint ``step`` atomically under ``directory``; prune to ``keep_last``.

    ``models`` maps a name to a module or to its already gathered weights (what
    :func:`wc_fast.distributed.full_state_dict` returns for a sharded model).
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        for name, model in models.items():
            save_file(_weights(model), tmp / f"{name}.safetensors")
        torch.save({**state, "rng": rng_state()}, tmp / "state.pt")
        meta = {"step": step, "config": config, "models": sorted(models)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``directory``, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and p.name.startswith(PREFIX) and (p / "meta.json").is_file())


def latest(directory: str | os.PathLike) -> Path:
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(f"no checkpoint found in {directory} (expected {PREFIX}NNNNNNNN/ "
                              "directories written by a previous run)")
    return found[-1]


def load(path: str | os.PathLike, *, models: dict[str, nn.Module],
         restore_rng: bool = True) -> Checkpoint:
    """Load weights into ``models`` in place and return the rest; clear errors on damage."""
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise CheckpointError(f"{path} is not a checkpoint (no meta.json)")
    try:
        meta = json.loads((path / "meta.json").read_text())
        for name, model in models.items():
            load_full_state_dict(model, load_file(path / f"{name}.safetensors"))
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt or incompatible: {exc}") from exc
    if restore_rng:
        set_rng_state(state["rng"])
    return Checkpoint(path=path, step=int(meta["step"]), config=meta["config"], state=state)


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
