"""Configs as YAML files: the shipped presets (``wc_fast/config/presets/NAME.yaml``), the
embedded base world models (``presets/bases/NAME.yaml``) and a user's own file.

A file holds ``{section: {field: value}}`` over the schema's defaults (the paper's column), an
optional ``preset: NAME`` (the name the run reports; inherited when absent) and an optional
``inherits: [NAME, ...]``: files applied first, in order, each a shipped name (``cpu``,
``parts/recipe``) or a path ending in ``.yaml`` relative to the including file. One file may
configure both entry points: the RL run reads its sections, ``wc_fast.pretrain`` reads
``model`` and ``pretrain``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from wc_fast.config.fields import apply_values
from wc_fast.config.schema import Config, PretrainRun

PRESET_DIR = Path(__file__).resolve().parent / "presets"
# the shipped presets: the files directly in PRESET_DIR (parts/ and bases/ are not presets)
PRESETS = ("paper", "official", "cpu", "gpu", "smoke", "wan", "wan_smoke", "worldplay",
           "worldplay_lora", "worldplay_smoke")
BASES = ("tiny", "wan")  # the shipped embedded base world models (``--base NAME``)
# presets whose model.path the user gives: they validate once it is set
NEEDS_MODEL_PATH = ("wan", "wan_smoke", "worldplay", "worldplay_lora", "worldplay_smoke")
# the fields in which the cpu and gpu presets differ: the run's size, not its algorithm
SIZE_FIELDS = ("rollout.group_size", "rollout.groups_per_rank", "train.steps",
               "train.eval_sequences")
_KEYS = ("preset", "inherits")


def machine_preset(cuda: bool) -> str:
    """The recipe's preset sized for this machine: ``gpu`` with CUDA, ``cpu`` without."""
    return "gpu" if cuda else "cpu"


def _choice(path: str, name: str, options: tuple[str, ...]) -> None:
    if name not in options:
        raise ValueError(f"unknown {path} {name!r}; expected one of {options}")


def shipped_path(name: str) -> Path:
    """The file of shipped config ``name`` (``cpu``, ``parts/recipe``, ``bases/wan``)."""
    return PRESET_DIR / f"{name}.yaml"


def _read(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {str(path)!r} does not exist") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of sections, got "
                         f"{type(data).__name__}")
    return dict(data)


def _parent(entry: object, including: Path) -> Path:
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"{including}: inherits must list config names or .yaml paths, got "
                         f"{entry!r}")
    if entry.endswith((".yaml", ".yml")):
        return (including.parent / entry).resolve()
    return shipped_path(entry)


def resolve_file(path: str | os.PathLike, _chain: tuple[Path, ...] = ()) -> dict:
    """The file at ``path`` with everything it inherits merged in: ``{"preset": NAME or
    absent, section: {field: value}}``, later files overriding earlier ones field by field.
    A cycle of ``inherits`` raises ``ValueError`` naming it."""
    path = Path(path).resolve()
    if path in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, path))
        raise ValueError(f"config files inherit in a cycle: {cycle}")
    data = _read(path)
    inherits = data.get("inherits", [])
    inherits = [inherits] if isinstance(inherits, str) else inherits
    if not isinstance(inherits, list):
        raise ValueError(f"{path}: inherits must be a name or a list, got {inherits!r}")
    merged: dict = {}
    for entry in inherits:
        _merge(merged, resolve_file(_parent(entry, path), (*_chain, path)))
    _merge(merged, {k: v for k, v in data.items() if k != "inherits"})
    return merged


def _merge(into: dict, data: Mapping) -> None:
    for key, value in data.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            into[key].update(value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _apply(cfg: Config | PretrainRun, data: Mapping, source: str) -> None:
    if "preset" in data:
        cfg.preset = data["preset"]
    apply_values(cfg, {k: v for k, v in data.items() if k not in _KEYS}, source)


def load(path: str | os.PathLike, run_type: type = Config) -> Config | PretrainRun:
    """A fresh, unvalidated config of ``run_type`` (:class:`Config` or :class:`PretrainRun`)
    from the file at ``path`` and what it inherits."""
    cfg = run_type()
    _apply(cfg, resolve_file(path), str(path))
    return cfg


def build_preset(name: str) -> Config:
    """A fresh config for preset ``name``, not yet validated: the command line sets its fields
    (``model.path`` of the ``wan`` presets) before validation."""
    _choice("preset", name, PRESETS)
    return load(shipped_path(name), Config)


def build_pretrain_run(name: str) -> PretrainRun:
    """A fresh pretraining config for preset ``name``, not yet validated: the preset's model
    and its file's ``pretrain`` section."""
    _choice("preset", name, PRESETS)
    return load(shipped_path(name), PretrainRun)


def apply_base(cfg: Config | PretrainRun, name: str) -> None:
    """Set a run's model to the embedded base world model ``name`` (``bases/NAME.yaml``):
    ``tiny`` leaves the preset's; ``wan`` selects the embedded Wan world model
    (docs/base_model.md) at its shipped sizes, without what only the tiny model has, and for
    a pretraining run its first stage's pretraining."""
    _choice("--base", name, BASES)
    _apply(cfg, resolve_file(shipped_path(f"bases/{name}")), f"bases/{name}.yaml")
