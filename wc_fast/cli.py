"""Thin command line shared by the entry points: a preset plus ``--section.field VALUE``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from wc_fast import config as config_lib


@dataclass(slots=True)
class RunArgs:
    config: config_lib.Config
    resume: bool
    base: str = "tiny"  # --base, where the entry point takes it


def default_preset() -> str:
    """``paper`` on a CUDA machine, ``cpu`` elsewhere."""
    return "paper" if torch.cuda.is_available() else "cpu"


def parse_run_args(prog: str, description: str, argv: Sequence[str] | None = None, *,
                   steps_field: str = "train.steps", out_field: str = "train.out",
                   with_base: bool = False) -> RunArgs:
    """Parse ``[--preset NAME] [--out DIR] [--steps N] [--resume] [--section.field VALUE]``.

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
                        help="named configuration (default: paper with CUDA, cpu without)")
    parser.add_argument("--out", default=None, help=f"output directory ({out_field})")
    parser.add_argument("--steps", type=int, default=None, help=f"iterations ({steps_field})")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in --out")
    if with_base:
        parser.add_argument("--base", choices=config_lib.BASES, default="tiny",
                            help="embedded base world model: tiny (TinyWorldDiT) or wan (a "
                                 "diffusers WanTransformer3DModel on pixels); default tiny")
    args, rest = parser.parse_known_args(argv)
    cfg = config_lib.build_preset(args.preset or default_preset())
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
    return RunArgs(config=cfg, resume=args.resume, base=getattr(args, "base", "tiny"))


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
