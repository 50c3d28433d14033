"""Thin command line shared by the entry points: a preset plus ``--section.field VALUE``, and
the way they fail: one line on stderr and exit status 2 (a traceback with ``--debug``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from wc_fast import config as config_lib


@dataclass(slots=True)
class RunArgs:
    config: config_lib.Config
    resume: bool
    overwrite: bool = False
    base: str = "tiny"  # --base, where the entry point takes it


def parse_run_args(prog: str, description: str, argv: Sequence[str] | None = None, *,
                   steps_field: str = "train.steps", out_field: str = "train.out",
                   with_base: bool = False) -> RunArgs:
    """Parse ``[--preset NAME] [--out DIR] [--steps N] [--resume | --overwrite] [--debug]
    [--section.field VALUE]`` (``--debug`` is read by :func:`run_main`).

    ``--out`` and ``--steps`` set ``out_field`` and ``steps_field``. ``with_base``: also
    ``--base NAME``, an embedded base world model (:func:`wc_fast.config.apply_base`) applied
    to the preset before the ``--section.field`` overrides.
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Any config field can be set as --section.field VALUE (e.g. --rollout.steps 8, "
               "--reward.trans_thresholds 0.01,0.02). Sections: "
               + ", ".join(config_lib.SECTIONS) + ".")
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
    add_debug(parser)
    args, rest = parser.parse_known_args(argv)
    cfg = config_lib.build_preset(
        args.preset or config_lib.machine_preset(torch.cuda.is_available()))
    if with_base:
        config_lib.apply_base(cfg, args.base)
    overrides = _pairs(parser, rest)
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
        config_lib.validate(cfg)
    except ValueError as exc:
        parser.error(str(exc))
    return RunArgs(config=cfg, resume=args.resume, overwrite=args.overwrite,
                   base=getattr(args, "base", "tiny"))


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
