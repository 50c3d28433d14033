"""``python -m wc_fast.tools.export CKPT --out DIR``: the whole weights of a checkpoint's models
as ``DIR/<name>.safetensors`` (``model``, the trained weights, and ``old``, their EMA), from
either format: one file per model (single-process runs) or sharded
(``torch.distributed.checkpoint``, multi-rank runs), read on one process.

The checkpoint is verified first (every file against its sha256). A checkpoint that holds
only the trained weights over a frozen base (LoRA) exports just those, as it holds them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from wc_fast import checkpoint
from wc_fast.cli import add_debug, run_main
from wc_fast.run_dir import check_writable_dir


def export(path: str | Path, out: str | Path) -> list[Path]:
    """Write the weights of checkpoint ``path``'s models into directory ``out``; returns the
    files written."""
    path = Path(path)
    meta = checkpoint.verify(path)
    weights = {name: checkpoint.read_weights(path, name) for name in meta["models"]}
    out = check_writable_dir(out, "--out")
    written = []
    for name, tensors in weights.items():
        file = out / f"{name}.safetensors"
        save_file({k: v.to(torch.device("cpu")).contiguous() for k, v in tensors.items()},
                  file, metadata={"step": str(meta["step"]), "source": str(path)})
        written.append(file)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.tools.export",
                                     description="A checkpoint's weights as safetensors.")
    parser.add_argument("checkpoint", help="a checkpoint directory (step_NNNNNNNN)")
    parser.add_argument("--out", required=True, help="directory for <model>.safetensors")
    add_debug(parser)
    args = parser.parse_args(argv)
    for file in export(args.checkpoint, args.out):
        print(file)
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.tools.export", main))
