"""Configs saved by a run (a checkpoint's ``meta.json``, ``config.yaml``) read back, including
those of earlier versions: retired fields and sections dropped, renamed or moved ones mapped."""

from __future__ import annotations

import dataclasses

from wc_fast.config.fields import RENAMED_FIELDS, coerce, section_types
from wc_fast.config.schema import PRETRAIN_SECTIONS, Config, PretrainRun, sections
from wc_fast.config.validation import validate, validate_pretrain_run

# fields and values that configs saved by earlier versions may hold: dropped (they had no
# effect) or mapped to their current name
RETIRED_FIELDS = ("train.log_every",)
RENAMED_VALUES = {"optim.optimizer": {"muon_adamw": "muon"},
                  "rollout.candidate_noise": {"noise": "independent"}}
# sections that RL configs saved by earlier versions hold, dropped: the RL run's config held
# the pretraining section until pretraining got its own config (PretrainRun)
RETIRED_SECTIONS = ("pretrain",)


def is_pretrain_dict(data: dict) -> bool:
    """Whether a saved config dict is a pretraining run's (:class:`PretrainRun`: its sections
    and no other) rather than an RL run's."""
    return "pretrain" in data and set(data) <= {"preset", *PRETRAIN_SECTIONS}


def read_saved(data: dict) -> dict:
    """A saved config dict as this version reads it: fields added since at their defaults,
    renamed ones under their names, retired ones dropped (:func:`from_dict`); one this version
    cannot read (an unknown field, an impossible value) is returned as it is, for the
    comparison to name what differs."""
    try:
        return dataclasses.asdict(from_dict(data))
    except (ValueError, TypeError, AttributeError):
        return data


def from_dict(data: dict) -> Config | PretrainRun:
    """Inverse of :func:`wc_fast.config.to_dict`, validated: a :class:`PretrainRun` for a
    pretraining run's dict (:func:`is_pretrain_dict`), else a :class:`Config` (an RL config
    saved by an earlier version may hold a :data:`RETIRED_SECTIONS` section, dropped). Unknown
    sections or fields raise ``ValueError``."""
    pretraining = is_pretrain_dict(data)
    cfg = (PretrainRun if pretraining else Config)(preset=data.get("preset", "paper"))
    names = sections(type(cfg))
    for name, values in data.items():
        if name == "preset" or (not pretraining and name in RETIRED_SECTIONS):
            continue
        if name not in names:
            raise ValueError(f"unknown config section {name!r}")
        for key, value in values.items():
            path = f"{name}.{key}"
            if path in RETIRED_FIELDS:
                continue
            path = RENAMED_FIELDS.get(path, path)
            if path in RENAMED_VALUES:
                value = RENAMED_VALUES[path].get(value, value)
            section_name, key = path.split(".")
            section = getattr(cfg, section_name)
            types_ = section_types(section)
            if key not in types_:
                raise ValueError(f"unknown config field {path}")
            setattr(section, key, coerce(types_[key], value))
    (validate_pretrain_run if pretraining else validate)(cfg)
    return cfg
