"""Thin command line shared by the entry points: a preset plus ``--section.field VALUE`` (each
listed by ``--help`` with its type, default and help, grouped by section), and the way they
fail: one line on stderr and exit status 2 (a traceback with ``--debug``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import yaml

from wc_fast import config as config_lib


@dataclass(slots=True)
class RunArgs:
    config: config_lib.Config | config_lib.PretrainRun
    resume: bool
    overwrite: bool = False
    base: str = "tiny"  # --base, where the entry point takes it


def parse_run_args(prog: str, description: str, argv: Sequence[str] | None = None, *,
                   kind: config_lib.RunKind = config_lib.RL_RUN,
                   steps_field: str = "train.steps", out_field: str = "train.out",
                   with_base: bool = False) -> RunArgs:
    """Parse ``[--preset NAME] [--out DIR] [--steps N] [--resume | --overwrite] [--debug]
    [--section.field VALUE]`` (``--debug`` is read by :func:`run_main`) into a config of
    ``kind`` (an RL run's, or a pretraining run's).

    ``--out`` and ``--steps`` set ``out_field`` and ``steps_field``. ``with_base``: also
    ``--base NAME``, an embedded base world model (``kind.apply_base``) applied to the preset
    before the ``--section.field`` overrides.
    """
    names = config_lib.sections(kind.config_type)
    base = " [--base NAME]" if with_base else ""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, allow_abbrev=False,
        usage=f"{prog} [-h] [--preset NAME]{base} [--out DIR] [--steps N] "
              "[--resume | --overwrite] [--print-config] [--debug] [--section.field VALUE ...]",
        epilog="Any config field can be set as --section.field VALUE (e.g. --model.depth 4, "
               "--model.lora_targets to_q,to_k); the defaults listed are the fields' own, "
               "which --preset (and --base) change for some. Sections: "
               + ", ".join(names) + ".")
    parser.add_argument("--preset", choices=config_lib.PRESETS, default=None,
                        help="named configuration (default: the recipe sized for this machine, "
                             "gpu with CUDA, cpu without)")
    parser.add_argument("--out", default=None, help=f"output directory ({out_field})")
    parser.add_argument("--steps", type=int, default=None, help=f"iterations ({steps_field})")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the latest checkpoint in --out")
    start.add_argument("--overwrite", action="store_true",
                       help="start afresh in an --out that holds another run, deleting its "
                            "checkpoints and metrics.jsonl (without it such an --out is refused)")
    if with_base:
        parser.add_argument("--base", choices=config_lib.BASES, default="tiny",
                            help="embedded base world model: tiny (TinyWorldDiT) or wan (a "
                                 "diffusers WanTransformer3DModel on pixels); default tiny")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (preset, base and overrides applied) "
                             "as YAML and exit")
    add_debug(parser)
    paths = _add_config_fields(parser, kind.config_type)
    args, rest = parser.parse_known_args(argv)
    cfg = kind.build(args.preset or config_lib.machine_preset(torch.cuda.is_available()))
    if with_base:
        kind.apply_base(cfg, args.base)
    given = vars(args)
    overrides = [(path, ",".join(given[path]) if isinstance(given[path], list) else given[path])
                 for path in paths if path in given]
    overrides += _pairs(parser, rest)
    if args.out is not None:
        overrides.append((out_field, args.out))
    if args.steps is not None:
        overrides.append((steps_field, str(args.steps)))
    for path, text in overrides:
        try:
            config_lib.apply_override(cfg, path, text)
        except (ValueError, TypeError) as exc:
            parser.error(str(exc))
    try:
        kind.validate(cfg)
    except ValueError as exc:
        parser.error(str(exc))
    if args.print_config:
        sys.stdout.write(config_yaml(cfg))
        sys.exit(0)
    return RunArgs(config=cfg, resume=args.resume, overwrite=args.overwrite,
                   base=getattr(args, "base", "tiny"))


def config_yaml(cfg: config_lib.Config | config_lib.PretrainRun) -> str:
    """The resolved ``cfg`` as YAML, sections in the schema's order (tuples as lists);
    ``yaml.safe_load`` of it gives :func:`wc_fast.config.to_dict` of ``cfg`` with lists."""
    plain = json.loads(json.dumps(config_lib.to_dict(cfg)))
    return yaml.safe_dump(plain, sort_keys=False)


def _add_config_fields(parser: argparse.ArgumentParser, config_type: type) -> list[str]:
    """An option ``--section.field`` per field of ``config_type``, one argument group per
    section, each with its type, default and ``help`` metadata; returns the fields' paths.
    Values stay text (a tuple field's several values joined by commas):
    :func:`wc_fast.config.apply_override` parses them."""
    paths = []
    for section in dataclasses.fields(config_type):
        if section.name == "preset":
            continue
        section_type = section.default_factory
        doc = (section_type.__doc__ or "").strip().split("\n\n")[0]
        # the docstring's first paragraph, without its reStructuredText markup
        doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc).replace("``", "")
        group = parser.add_argument_group(f"{section.name} section", " ".join(doc.split()))
        hints = typing.get_type_hints(section_type)
        for item in dataclasses.fields(section_type):
            path = f"{section.name}.{item.name}"
            text = item.metadata.get("help", "")
            # a field of several values takes them space- or comma-separated (1 3 or 1,3)
            several = typing.get_origin(hints[item.name]) is tuple
            group.add_argument(f"--{path}", dest=path, default=argparse.SUPPRESS,
                               nargs="+" if several else None,
                               metavar=_metavar(hints[item.name]),
                               help=f"{text} (default: {_shown(item.default)})"
                               .replace("%", "%%"))
            paths.append(path)
    return paths


def _metavar(kind: object) -> str:
    """How ``--help`` shows a field's type: ``INT``, ``{a,b}`` for choices, ``FLOAT`` for a
    tuple of floats."""
    if typing.get_origin(kind) is typing.Literal:
        return "{" + ",".join(typing.get_args(kind)) + "}"
    if typing.get_origin(kind) is tuple:  # shown by argparse as T [T ...]
        return typing.get_args(kind)[0].__name__.upper()
    return getattr(kind, "__name__", str(kind)).upper()


def _shown(value: object) -> str:
    """A default as it would be typed on the command line."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if value == "" else str(value)


def add_debug(parser: argparse.ArgumentParser) -> None:
    """The ``--debug`` flag :func:`run_main` honours."""
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (default: one line)")


def run_main(prog: str, main: Callable[[list[str]], int],
             argv: Sequence[str] | None = None) -> int:
    """``main(argv)``, with any error (not a usage error, which argparse reports itself) as
    one line ``prog: error: Type: message`` on stderr and exit status 2; with ``--debug`` in
    ``argv`` the error propagates with its traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return main(argv)
    except Exception as exc:
        if "--debug" in argv:
            raise
        message = " ".join(str(exc).split()) or "(no message)"
        print(f"{prog}: error: {type(exc).__name__}: {message}", file=sys.stderr)
        return 2


def _pairs(parser: argparse.ArgumentParser, rest: list[str]) -> list[tuple[str, str]]:
    """``["--a.b", "1", "--c.d=2"]`` -> ``[("a.b", "1"), ("c.d", "2")]``."""
    pairs, i = [], 0
    while i < len(rest):
        item = rest[i]
        if not item.startswith("--") or len(item) == 2:
            parser.error(f"unexpected argument {item!r}")
        key, eq, value = item[2:].partition("=")
        if not eq:
            if i + 1 >= len(rest):
                parser.error(f"--{key} needs a value")
            value = rest[i + 1]
            i += 1
        pairs.append((key, value))
        i += 1
    return pairs
