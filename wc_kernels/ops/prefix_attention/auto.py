"""``prefix_attention(backend="auto")`` per device: the committed table of measured choices
(``auto.yaml`` beside this file), keyed by device name, since H100 and H200 may differ."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from wc_kernels._backend import BACKENDS

TABLE = Path(__file__).with_name("auto.yaml")


@dataclass(frozen=True, slots=True)
class Choice:
    """The backend to use at head dim ``head_dim``, with gradients (``grad``) or without."""

    head_dim: int
    grad: bool
    backend: str


def parse_table(data: object) -> dict[str, tuple[Choice, ...]]:
    """``{device name: [{head_dim, grad, backend}, ...]}`` as choices; a malformed table
    raises ``ValueError`` naming the device and the field."""
    if not isinstance(data, dict):
        raise ValueError(f"auto table: expected a mapping of device name to rows, got "
                         f"{type(data).__name__}")
    table = {}
    for device, rows in data.items():
        if not isinstance(device, str) or not isinstance(rows, list):
            raise ValueError(f"auto table: {device!r} must be a device name holding a list of "
                             f"rows, got {type(rows).__name__}")
        choices = []
        for row in rows:
            if not isinstance(row, dict) or set(row) != {"head_dim", "grad", "backend"}:
                raise ValueError(f"auto table: each row of {device!r} needs exactly head_dim, "
                                 f"grad and backend, got {row!r}")
            head_dim, grad, backend = row["head_dim"], row["grad"], row["backend"]
            if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
                raise ValueError(f"auto table: {device!r} head_dim must be a positive int, "
                                 f"got {head_dim!r}")
            if not isinstance(grad, bool):
                raise ValueError(f"auto table: {device!r} grad must be true or false, "
                                 f"got {grad!r}")
            if backend not in BACKENDS or backend == "auto":
                raise ValueError(f"auto table: {device!r} backend must be one of "
                                 f"{BACKENDS[1:]}, got {backend!r}")
            choices.append(Choice(head_dim, grad, backend))
        keys = [(c.head_dim, c.grad) for c in choices]
        if len(set(keys)) != len(keys):
            raise ValueError(f"auto table: {device!r} lists a (head_dim, grad) twice: {keys}")
        table[device] = tuple(choices)
    return table


@functools.cache
def load_table(path: Path = TABLE) -> dict[str, tuple[Choice, ...]]:
    """The table in ``path``, read once."""
    import yaml

    return parse_table(yaml.safe_load(path.read_text()) or {})


@functools.cache
def device_name(device: torch.device) -> str:
    """The name the table keys ``device`` by: the CUDA device's name, or its type."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


@torch.compiler.assume_constant_result
def listed_backend(device: torch.device, head_dim: int, grad: bool) -> tuple[str, ...]:
    """The table's backend for this device and shape, as a one-element tuple (empty when the
    device or the shape is not listed). A trace-time constant under ``torch.compile``."""
    for choice in load_table().get(device_name(device), ()):
        if (choice.head_dim, choice.grad) == (head_dim, grad):
            return (choice.backend,)
    return ()
