"""Setting a config's fields by name: from command-line text (``--section.field VALUE``) and
from the values of a YAML file or a saved config (lists for tuples, numbers written as text)."""

from __future__ import annotations

import dataclasses
import typing
import warnings
from collections.abc import Mapping
from typing import Literal

from wc_fast.config.schema import PRETRAIN_SECTIONS, SECTIONS, Config, PretrainRun, sections

# where a section of the other entry point's config belongs, for the error that names it
OTHER_RUN = {"pretrain": "python -m wc_fast.pretrain",
             **{name: "python -m wc_fast.train" for name in SECTIONS
                if name not in PRETRAIN_SECTIONS}}
# fields that moved to another section: the command line and config files still take the
# old path, with a FutureWarning naming the new one
MOVED_FIELDS = {"nft.context_kv": "update.context_kv", "nft.micro_batch": "update.micro_batch",
                "nft.compile": "update.compile"}
# fields saved configs of earlier versions may hold under an old name or section
RENAMED_FIELDS = {"rollout.exploration": "rollout.candidate_noise", **MOVED_FIELDS}


def section_types(section: object) -> dict[str, object]:
    """The annotated type of each field of a section dataclass instance."""
    return typing.get_type_hints(type(section))


def parse_text(path: str, kind: object, text: str) -> object:
    """Parse command-line ``text`` as the annotated type ``kind`` of field ``path``."""
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind in (int, float, str) or typing.get_origin(kind) is Literal:
            return text if typing.get_origin(kind) is Literal else kind(text)
        if typing.get_origin(kind) is tuple:
            (item, _) = typing.get_args(kind)
            return tuple(item(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--{path}: cannot parse {text!r} as {getattr(kind, '__name__', kind)}"
                         ) from None
    raise TypeError(f"--{path}: unsupported field type {kind}")


def _number(value: object, kind: type) -> object:
    """A float field's number written as text (YAML 1.1 reads ``1e-4`` as a string) or as an
    integer, as a float; anything else unchanged, for validation to name."""
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def coerce(kind: object, value: object) -> object:
    """A file's value as the field's type: lists become tuples, numbers become floats where
    the field is a float; the types themselves are checked by validation."""
    if typing.get_origin(kind) is tuple and isinstance(value, (list, tuple)):
        (item, _) = typing.get_args(kind)
        return tuple(_number(v, item) if isinstance(item, type) else v for v in value)
    return _number(value, kind) if isinstance(kind, type) else value


def field_of(cfg: Config | PretrainRun, path: str) -> tuple[object, str, object]:
    """The section object, field name and annotated type of ``section.field`` in ``cfg``
    (a :data:`MOVED_FIELDS` path resolves to its new one, with a ``FutureWarning``);
    ``ValueError`` naming the field (and the entry point whose section it is) otherwise."""
    if path in MOVED_FIELDS and isinstance(cfg, Config):
        warnings.warn(f"config field {path!r} is deprecated: it is {MOVED_FIELDS[path]!r}",
                      FutureWarning, stacklevel=3)
        path = MOVED_FIELDS[path]
    parts = path.split(".")
    names = sections(type(cfg))
    if len(parts) == 2 and parts[0] not in names and parts[0] in OTHER_RUN:
        raise ValueError(f"config field {path!r} belongs to {OTHER_RUN[parts[0]]}; this run's "
                         f"sections are {names}")
    if len(parts) != 2 or parts[0] not in names:
        raise ValueError(f"unknown config field {path!r}; expected section.field with section "
                         f"in {names}")
    section = getattr(cfg, parts[0])
    types_ = section_types(section)
    if path in RENAMED_FIELDS:
        raise ValueError(f"config field {path!r} is now {RENAMED_FIELDS[path]!r}")
    if parts[1] not in types_:
        raise ValueError(f"unknown config field {path!r}; {parts[0]} has fields "
                         f"{tuple(types_)}")
    return section, parts[1], types_[parts[1]]


def apply_override(cfg: Config | PretrainRun, path: str, text: str) -> None:
    """Set ``section.field`` of ``cfg`` from its command-line text, e.g. ``rollout.steps=8``."""
    section, name, kind = field_of(cfg, path)
    setattr(section, name, parse_text(path, kind, text))


def apply_values(cfg: Config | PretrainRun, values: Mapping[str, object], source: str) -> None:
    """Set the fields of ``cfg`` from a ``{section: {field: value}}`` mapping read from
    ``source`` (a file, for the errors): sections of the other entry point are skipped, so one
    file configures both; unknown sections or fields raise ``ValueError`` naming ``source``."""
    names = sections(type(cfg))
    for name, fields in values.items():
        if name not in names and name in OTHER_RUN:
            continue
        if name not in names:
            known = tuple(dict.fromkeys(SECTIONS + PRETRAIN_SECTIONS))
            raise ValueError(f"{source}: unknown config section {name!r}; expected one of "
                             f"{known}")
        if not isinstance(fields, Mapping):
            raise ValueError(f"{source}: section {name!r} must map field names to values, got "
                             f"{fields!r}")
        for key, value in fields.items():
            try:
                section, field, kind = field_of(cfg, f"{name}.{key}")
            except ValueError as exc:
                raise ValueError(f"{source}: {exc}") from None
            setattr(section, field, coerce(kind, value))


def to_dict(cfg: Config | PretrainRun) -> dict:
    """Plain nested dict (JSON-serialisable) of ``cfg``."""
    return dataclasses.asdict(cfg)
