"""``python -m wc_fast.tools.export CKPT --out DIR``: the whole weights of a checkpoint's models
as ``DIR/<name>.safetensors`` (``model``, the trained weights, and ``old``, their EMA), from
either format: one file per model (single-process runs) or sharded
(``torch.distributed.checkpoint``, multi-rank runs), read on one process.

The checkpoint is verified first (every file against its sha256). A checkpoint that holds
only the trained weights over a frozen base (LoRA) exports just those, as it holds them.

``--peft``, for a LoRA run: ``DIR/adapter_model.safetensors`` and ``DIR/adapter_config.json``
as peft's ``save_pretrained`` writes them (the adapters of the current model, named from the
module they adapt: the Wan transformer, WorldPlay's double blocks), which peft loads onto the
base (``inject_adapter_in_model`` + ``set_peft_model_state_dict``), and
``DIR/conditioning.safetensors``: the other weights the run trained (the action layers),
under the world model's own names. It reads the base from the run's ``model.path``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from wc_fast.cli import add_debug, run_main
from wc_fast.infra import checkpoint
from wc_fast.infra.extras import require
from wc_fast.infra.run_dir import check_writable_dir
from wc_fast.models.lora import lora_parameters
from wc_fast.models.pretrained import checkpoint_config, load_checkpoint_model


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


def export_peft(path: str | Path, out: str | Path) -> list[Path]:
    """Write the LoRA adapters of checkpoint ``path`` in peft's format, and the other trained
    weights, into directory ``out``; returns the files written."""
    peft = require("peft", user="python -m wc_fast.tools.export --peft")
    path = Path(path)
    meta = checkpoint.verify(path)
    cfg = checkpoint_config(path, meta)
    if not getattr(cfg.model, "lora_rank", 0):
        raise ValueError(f"--peft: checkpoint {path} is not of a LoRA run (model.lora_rank 0)")
    model = load_checkpoint_model(path, torch.device("cpu"))
    out = check_writable_dir(out, "--out")
    root = model.lora_root()
    adapter = {k: v.contiguous() for k, v in peft.get_peft_model_state_dict(root).items()}
    m = cfg.model
    config = peft.LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha or m.lora_rank,
                             target_modules=list(m.lora_targets))
    written = [out / "adapter_model.safetensors", out / "adapter_config.json",
               out / "conditioning.safetensors"]
    save_file(adapter, written[0], metadata={"format": "pt", "step": str(meta["step"])})
    written[1].write_text(json.dumps(config.to_dict(), indent=2, default=list))
    lora = {id(p) for p in lora_parameters(model)}
    trained = {name: p.detach().contiguous() for name, p in model.named_parameters()
               if name in checkpoint.read_weights(path, "model") and id(p) not in lora}
    save_file(trained, written[2], metadata={"step": str(meta["step"])})
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.tools.export",
                                     description="A checkpoint's weights as safetensors.")
    parser.add_argument("checkpoint", help="a checkpoint directory (step_NNNNNNNN)")
    parser.add_argument("--out", required=True, help="directory for <model>.safetensors")
    parser.add_argument("--peft", action="store_true",
                        help="a LoRA run's adapters in peft's format (adapter_model.safetensors, "
                             "adapter_config.json) and its other trained weights "
                             "(conditioning.safetensors)")
    add_debug(parser)
    args = parser.parse_args(argv)
    for file in (export_peft if args.peft else export)(args.checkpoint, args.out):
        print(file)
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.tools.export", main))
