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
    """Parse ``[--preset NAME | --config FILE] [--out DIR] [--steps N] [--resume |
    --overwrite] [--print-config] [--debug] [--section.field VALUE]`` (``--debug`` is read by
    :func:`run_main`) into a config of ``kind`` (an RL run's, or a pretraining run's).

    ``--config FILE`` is a YAML file (:mod:`wc_fast.config.files`; it may inherit a preset);
    ``--preset NAME`` the shipped file of that name. ``--out`` and ``--steps`` set
    ``out_field`` and ``steps_field``. ``with_base``: also ``--base NAME``, an embedded base
    world model (``bases/NAME.yaml``) applied to the preset or file before the
    ``--section.field`` overrides. ``--help`` lists every field with its value in the chosen
    preset or file.
    """
    fields = (out_field, steps_field)
    start = _start_parser(prog, description, kind, fields, with_base)
    first, _ = start.parse_known_args(argv)
    if first.config is not None:
        cfg = config_lib.load(first.config, kind.config_type)
    else:
        cfg = kind.build(first.preset or config_lib.machine_preset(torch.cuda.is_available()))
    if with_base:
        config_lib.apply_base(cfg, first.base)
    parser = _start_parser(prog, description, kind, fields, with_base, add_help=True)
    paths = _add_config_fields(parser, cfg)
    args, rest = parser.parse_known_args(argv)
    given = vars(args)
    overrides = [(path, ",".join(given[path]) if isinstance(given[path], list) else given[path])
                 for path in paths if path in given]
    overrides += config_pairs(parser, rest)
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


def _start_parser(prog: str, description: str, kind: config_lib.RunKind,
                  fields: tuple[str, str], with_base: bool, add_help: bool = False
                  ) -> argparse.ArgumentParser:
    """The options besides the config fields (``fields``: those ``--out`` and ``--steps``
    set). Parsed once without ``--help`` to find the preset or file, whose values the full
    parser's ``--help`` then shows."""
    names = config_lib.sections(kind.config_type)
    base = " [--base NAME]" if with_base else ""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, allow_abbrev=False, add_help=add_help,
        usage=f"{prog} [-h] [--preset NAME | --config FILE]{base} [--out DIR] [--steps N] "
              "[--resume | --overwrite] [--print-config] [--debug] [--section.field VALUE ...]",
        epilog="Any config field can be set as --section.field VALUE (e.g. --model.depth 4, "
               "--model.lora_targets to_q,to_k); the defaults listed are the chosen preset's "
               "or file's (with --base applied). Sections: " + ", ".join(names) + ".")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=config_lib.PRESETS, default=None,
                        help="a shipped configuration, wc_fast/config/presets/NAME.yaml "
                             "(default: the recipe sized for this machine, gpu with CUDA, cpu "
                             "without)")
    source.add_argument("--config", default=None, metavar="FILE",
                        help="a YAML config file: {section: {field: value}}, optionally "
                             "'inherits: [PRESET or FILE.yaml, ...]' applied first")
    parser.add_argument("--out", default=None, help=f"output directory ({fields[0]})")
    parser.add_argument("--steps", type=int, default=None, help=f"iterations ({fields[1]})")
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
                        help="print the resolved config (preset or file, base and overrides "
                             "applied) as YAML and exit")
    add_debug(parser)
    return parser


def config_yaml(cfg: config_lib.Config | config_lib.PretrainRun) -> str:
    """The resolved ``cfg`` as YAML, sections in the schema's order (tuples as lists);
    ``yaml.safe_load`` of it gives :func:`wc_fast.config.to_dict` of ``cfg`` with lists."""
    plain = json.loads(json.dumps(config_lib.to_dict(cfg)))
    return yaml.safe_dump(plain, sort_keys=False)


def _add_config_fields(parser: argparse.ArgumentParser,
                       cfg: config_lib.Config | config_lib.PretrainRun) -> list[str]:
    """An option ``--section.field`` per field of ``cfg``'s schema, one argument group per
    section, each with its type, its value in ``cfg`` as the default and its ``help``
    metadata; returns the fields' paths.
    Values stay text (a tuple field's several values joined by commas):
    :func:`wc_fast.config.apply_override` parses them."""
    paths = []
    for section in dataclasses.fields(type(cfg)):
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
                               help=f"{text} (default: "
                                    f"{_shown(getattr(getattr(cfg, section.name), item.name))})"
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


def config_pairs(parser: argparse.ArgumentParser, rest: list[str]) -> list[tuple[str, str]]:
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
