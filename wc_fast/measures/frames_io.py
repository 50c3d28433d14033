"""``--save-frames DIR``: one ``.npz`` per evaluation set, so anyone can recompute a metric.

``DIR/<set>.npz`` holds (``n`` sequences, ``T = 1 + clips * clip_frames`` frames):

- ``generated`` ``[n, T, 3, H, W]`` float32 in [-1, 1]: the model's rollout (frame 0 is the
  given world prompt);
- ``ground_truth`` ``[n, T, 3, H, W]`` float32: the world rendered along the true camera path;
- ``actions`` ``[n, T-1]`` int64: the commanded action id of each new frame (0..80);
- ``c2w_true`` ``[n, T, 4, 4]`` float64: the camera path the world rendered (each key press at
  its drawn speed);
- ``c2w_commanded`` ``[n, T, 4, 4]`` float64: the commanded actions chained from the same start
  pose at the middle of the world's speed range (what the command alone says);
- ``c2w_fit`` ``[n, T, 4, 4]`` float64: the classical camera fit of ``generated``
  (:mod:`wc_fast.rewards.camera_fit`), first pose the identity.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from wc_fast.world.motion import (
    ROTATION_STEP_DEG,
    SPEED_RANGE,
    TRANSLATION_STEP,
    action_deltas,
    chain,
)

NPZ_KEYS = ("generated", "ground_truth", "actions", "c2w_true", "c2w_commanded", "c2w_fit")


def commanded_path(start: Tensor, actions: Tensor) -> Tensor:
    """Poses ``[n, 1 + K, 4, 4]`` float64 of actions ``[n, K]`` from ``start`` ``[n, 4, 4]``,
    every key press at the middle of :data:`~wc_fast.world.motion.SPEED_RANGE`."""
    speed = sum(SPEED_RANGE) / 2
    deltas = action_deltas(actions, translation_step=speed * TRANSLATION_STEP,
                           rotation_step_deg=speed * ROTATION_STEP_DEG)
    return chain(start.double(), deltas)


def save_set(directory: str | Path, kind: str, *, generated: Tensor, ground_truth: Tensor,
             actions: Tensor, c2w_true: Tensor, c2w_fit: Tensor) -> Path:
    """Write ``directory/<kind>.npz`` with the keys of :data:`NPZ_KEYS`; returns its path."""
    path = Path(directory) / f"{kind}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"generated": generated.float(), "ground_truth": ground_truth.float(),
              "actions": actions.long(), "c2w_true": c2w_true.double(),
              "c2w_commanded": commanded_path(c2w_true[:, 0], actions),
              "c2w_fit": c2w_fit.double()}
    np.savez_compressed(path, **{k: torch.as_tensor(v).cpu().numpy() for k, v in arrays.items()})
    return path
