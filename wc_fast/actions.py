"""Action label coding of docs/design.md section 5 (the official WorldCompass coding).

A frame's command is a translation label and a rotation label, each in 0..8:
0 none, 1..4 one primitive, 5..8 two primitives. Translation primitives (bits) are
[forward, backward, right, left] (keys W, S, D, A); rotation primitives are
[yaw right, yaw left, pitch up, pitch down]. Pairs: 5 = bits 0+2, 6 = 0+3, 7 = 1+2, 8 = 1+3.
The full action id is ``trans * 9 + rot`` (81 classes).
"""

from __future__ import annotations

import torch
from torch import Tensor

NUM_LABELS = 9
NUM_ACTIONS = NUM_LABELS * NUM_LABELS
TRANSLATION_PRIMITIVES = ("forward", "backward", "right", "left")
ROTATION_PRIMITIVES = ("yaw_right", "yaw_left", "pitch_up", "pitch_down")
PAIR_BITS = {5: (0, 2), 6: (0, 3), 7: (1, 2), 8: (1, 3)}


def _bits_table() -> tuple[list[int], list[tuple[bool, bool, bool, bool]]]:
    """Label of each 4-bit pattern (-1 where geometrically impossible) and bits of each label."""
    bits_of_label = [(False,) * 4]
    bits_of_label += [tuple(i == j for j in range(4)) for i in range(4)]
    bits_of_label += [tuple(j in PAIR_BITS[label] for j in range(4)) for label in range(5, 9)]
    label_of_pattern = [-1] * 16
    for label, bits in enumerate(bits_of_label):
        label_of_pattern[sum(int(b) << i for i, b in enumerate(bits))] = label
    return label_of_pattern, bits_of_label


_LABEL_OF_PATTERN, _BITS_OF_LABEL = _bits_table()


def bits_to_label(bits: Tensor) -> Tensor:
    """``bits`` bool ``[..., 4]`` -> label ``[...]`` in 0..8 (-1 for an impossible pattern)."""
    weights = torch.tensor([1, 2, 4, 8], device=bits.device)
    pattern = (bits.long() * weights).sum(-1)
    table = torch.tensor(_LABEL_OF_PATTERN, device=bits.device)
    return table[pattern]


def label_to_bits(label: Tensor) -> Tensor:
    """label ``[...]`` in 0..8 -> primitive bits bool ``[..., 4]``."""
    table = torch.tensor(_BITS_OF_LABEL, device=label.device)
    return table[label.long()]


def action_id(trans: Tensor, rot: Tensor) -> Tensor:
    """Full action id ``trans * 9 + rot`` in 0..80."""
    return trans.long() * NUM_LABELS + rot.long()


def split_action(action: Tensor) -> tuple[Tensor, Tensor]:
    """Action id 0..80 -> (translation label, rotation label)."""
    action = action.long()
    return action // NUM_LABELS, action % NUM_LABELS


def _primitives_per_label() -> Tensor:
    return torch.tensor([sum(bits) for bits in _BITS_OF_LABEL])


def num_primitives(action: Tensor) -> Tensor:
    """How many primitives (keys) an action id presses: 0 (no-op) to 4."""
    trans, rot = split_action(action)
    counts = _primitives_per_label().to(action.device)
    return counts[trans] + counts[rot]


def is_basic(action: Tensor) -> Tensor:
    """Exactly one primitive (one translation or one rotation key)."""
    return num_primitives(action) == 1


def is_composite(action: Tensor) -> Tensor:
    """Two or more primitives pressed together."""
    return num_primitives(action) >= 2


def basic_actions() -> list[int]:
    """The 8 basic action ids: 4 translations alone, then 4 rotations alone."""
    return [t * NUM_LABELS for t in range(1, 5)] + list(range(1, 5))


def composite_actions() -> list[int]:
    """All action ids with two or more primitives (72 ids)."""
    ids = torch.arange(NUM_ACTIONS)
    return ids[is_composite(ids)].tolist()


def describe(action: int) -> str:
    """Human-readable name of an action id, e.g. ``forward+yaw_left``."""
    trans, rot = split_action(torch.tensor(action))
    names = [n for n, b in zip(TRANSLATION_PRIMITIVES, _BITS_OF_LABEL[int(trans)], strict=True)
             if b]
    names += [n for n, b in zip(ROTATION_PRIMITIVES, _BITS_OF_LABEL[int(rot)], strict=True) if b]
    return "+".join(names) or "none"
