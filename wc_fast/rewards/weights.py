"""Shipped weight files of the embedded reward models (``wc_fast/assets/``).

Each model is ``NAME.safetensors`` (float16 tensors) plus ``NAME.json`` (architecture,
hyper-parameters and how it was trained).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

ASSETS = Path(__file__).resolve().parent.parent / "assets"
REGENERATE = {
    "camera_reward": "python -m wc_fast.tools.train_reward_models --which reward",
    "camera_eval": "python -m wc_fast.tools.train_reward_models --which eval",
    "critic": "python -m wc_fast.tools.train_reward_models --which critic",
    "critic_eval": "python -m wc_fast.tools.train_reward_models --which critic_eval",
}


def asset_paths(name: str, directory: Path | str | None = None) -> tuple[Path, Path]:
    """(weights, metadata) paths of model ``name``."""
    base = ASSETS if directory is None else Path(directory)
    return base / f"{name}.safetensors", base / f"{name}.json"


def save_model(module: nn.Module, name: str, meta: dict, directory: Path | str | None = None
               ) -> Path:
    """Write ``module``'s state as float16 safetensors and ``meta`` as JSON; returns the path."""
    weights, meta_path = asset_paths(name, directory)
    weights.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(weights))
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return weights


def load_model_files(name: str, directory: Path | str | None = None
                     ) -> tuple[dict[str, torch.Tensor], dict]:
    """(float32 state dict, metadata) of model ``name``.

    Raises ``FileNotFoundError`` naming the missing path and the command that regenerates it.
    """
    weights, meta_path = asset_paths(name, directory)
    for path in (weights, meta_path):
        if not path.is_file():
            how = REGENERATE.get(name, "the training command of this model")
            raise FileNotFoundError(f"reward model file {path} is missing; regenerate it with "
                                    f"`{how}`")
    state = {k: v.to(torch.float32) for k, v in load_file(str(weights)).items()}
    return state, json.loads(meta_path.read_text())
