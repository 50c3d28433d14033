"""Run configuration: the schema (:mod:`.schema`, slotted dataclasses), the shipped presets as
YAML files (:mod:`.files`, ``wc_fast/config/presets``), fields set by name (:mod:`.fields`),
validation (:mod:`.validation`) and saved configs read back (:mod:`.saved`).

Presets: ``cpu`` and ``gpu`` are the RL recipe that raises action following on the embedded
world model, sized for a 2-core machine and for one GPU (they differ only in
:data:`SIZE_FIELDS`; the command line picks one by the machine, :func:`machine_preset`);
``wan`` is the same recipe on a Wan backbone; ``paper`` and ``official`` reproduce the two
columns of docs/design.md section 4; ``smoke`` is a random tiny model through the whole trainer
in seconds; the ``worldplay`` presets run WorldCompass's own backbone. An RL run is a
:class:`Config`; a pretraining run a :class:`PretrainRun` (the preset's model and a
``pretrain`` section), so no pretraining field is part of an RL run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wc_fast.config.fields import apply_override, apply_values, to_dict
from wc_fast.config.files import (
    BASES,
    NEEDS_MODEL_PATH,
    PRESET_DIR,
    PRESETS,
    SIZE_FIELDS,
    apply_base,
    build_preset,
    build_pretrain_run,
    load,
    machine_preset,
    resolve_file,
    shipped_path,
)
from wc_fast.config.saved import RETIRED_SECTIONS, from_dict, is_pretrain_dict, read_saved
from wc_fast.config.schema import *  # noqa: F403 - the schema is this package's namespace
from wc_fast.config.schema import Config, PretrainRun
from wc_fast.config.validation import (
    MAX_GIB_PER_RANK,
    memory_estimate,
    validate,
    validate_model,
    validate_pretrain_run,
)


def preset(name: str) -> Config:
    """A fresh, validated config for preset ``name`` (the ``wan`` presets raise
    ``ValueError`` naming ``model.path`` until it is set: use :func:`build_preset`)."""
    cfg = build_preset(name)
    validate(cfg)
    return cfg


@dataclass(frozen=True, slots=True)
class RunKind:
    """What an entry point's command line configures: its config class, how a preset or a
    file and ``--base`` set it up, and its validation."""

    config_type: type
    build: Callable[[str], Any]  # preset name -> a fresh, unvalidated config
    validate: Callable[[Any], None]


RL_RUN = RunKind(Config, build_preset, validate)
PRETRAIN_RUN = RunKind(PretrainRun, build_pretrain_run, validate_pretrain_run)

__all__ = ["BASES", "MAX_GIB_PER_RANK", "NEEDS_MODEL_PATH", "PRESETS", "PRESET_DIR",
           "PRETRAIN_RUN", "RETIRED_SECTIONS", "RL_RUN", "SIZE_FIELDS", "RunKind", "apply_base",
           "apply_override",
           "apply_values", "build_preset", "build_pretrain_run", "from_dict",
           "is_pretrain_dict", "load", "machine_preset", "memory_estimate", "preset",
           "read_saved",
           "resolve_file", "shipped_path", "to_dict", "validate", "validate_model",
           "validate_pretrain_run"]
