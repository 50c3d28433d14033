"""What a checkpoint of a run that trains part of its model must hold: the trained tensors
(current and old model), the optimizers' state of those tensors and small metadata; no frozen
weight and no reference model. Shared by the tiny, Wan and WorldPlay tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

# metadata beside the tensors: meta.json, the safetensors headers, the pickled RNG states,
# step counters and parameter-group settings of state.pt
METADATA_BYTES = 256 * 1024


def tensor_bytes(path: Path) -> tuple[set[str], int]:
    """The tensor names in a safetensors file and their bytes."""
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        return keys, sum(f.get_tensor(k).nbytes for k in keys)


def optimizer_tensors(state: dict) -> list[torch.Tensor]:
    """The per-weight state tensors (moments) of every optimizer in a loaded ``state.pt``."""
    return [t for opt in state["optimizers"] for per_param in opt["state"].values()
            for t in per_param.values() if torch.is_tensor(t) and t.dim() > 0]


def assert_holds_only_the_trained(ckpt: Path, trained: dict[str, torch.Tensor]) -> None:
    """``ckpt`` holds the ``trained`` tensors (by name) in ``model`` and ``old``, at most two
    optimizer moments per trained element, and on disk nothing more than those plus
    :data:`METADATA_BYTES`."""
    trained_bytes = sum(t.nbytes for t in trained.values())
    for name in ("model", "old"):
        keys, size = tensor_bytes(ckpt / f"{name}.safetensors")
        assert keys == set(trained), name
        assert size == trained_bytes, name
    state = torch.load(ckpt / "state.pt", weights_only=True)
    moments = optimizer_tensors(state)
    trained_numel = sum(t.numel() for t in trained.values())
    assert 0 < sum(t.numel() for t in moments) <= 2 * trained_numel
    expected = 2 * trained_bytes + sum(t.nbytes for t in moments)
    on_disk = sum(f.stat().st_size for f in ckpt.iterdir())
    assert expected <= on_disk <= expected + METADATA_BYTES, (on_disk, expected)
