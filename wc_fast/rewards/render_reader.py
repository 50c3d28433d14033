"""A camera reader that needs no learned network: re-render the embedded world and keep the
motion that explains each frame best (analysis by synthesis).

The learned estimators and the classical fit are validated on true renders; on generated key
combinations they disagree with each other (docs/replication.md, "Why the estimators and the
fit disagree"). The world itself can read a generated clip whose scene and start pose are
known: follow the clip frame by frame from the start pose, each next pose the previous one
moved by the candidate motion whose render is closest to the frame (mean squared error). The
candidates are the world's own key presses at a few sizes, so the reading is what the world
would have to do to show the frame. Only the embedded world can be read this way (its scenes
are redrawn from their seeds), so this reader validates the others and serves as an oracle
reward for diagnosis; it is not a reward for a real backbone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from wc_fast.world import Scenes, render
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, action_deltas

NUM_ACTIONS = 81
# the sizes the two-stage reader tries, as fractions of the largest step: the key presses at
# the middle size first, then the closest presses at each size (the world's steps span 0.42-1)
READ_FACTORS = (0.5, 0.75, 1.0)
# key presses the first stage keeps for the second (a press at the wrong size can look closer
# than the right press at its middle size)
PRESSES = 4
# sequences rendered at once against every candidate (bounds memory: candidates x chunk)
_CHUNK = 8


def _check_factors(factors: Sequence[float]) -> None:
    if not factors or any(f <= 0 for f in factors):
        raise ValueError(f"factors must be a non-empty sequence of numbers > 0, got {factors!r}")


def press_motions(actions: Tensor, factors: Sequence[float]) -> Tensor:
    """Relative camera motions ``[..., K*K, 4, 4]`` float64 of action ids ``[...]``, with the
    translation at each of ``factors`` of the largest step and the rotation at each of them."""
    _check_factors(factors)
    return torch.stack([action_deltas(actions, translation_step=s * TRANSLATION_STEP,
                                      rotation_step_deg=r * ROTATION_STEP_DEG)
                        for s in factors for r in factors], -3)


def motion_grid(factors: Sequence[float]) -> Tensor:
    """Distinct relative camera motions ``[M, 4, 4]`` float64: every action id with its
    translation and its rotation each at every size of ``factors`` (the no-op once)."""
    deltas = press_motions(torch.arange(NUM_ACTIONS), factors).flatten(0, 1)
    unique, inverse = torch.unique((deltas.flatten(1) * 1e9).round(), dim=0,
                                   return_inverse=True)
    first = torch.full((len(unique),), len(deltas), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(deltas)), reduce="amin")
    return deltas[first.sort().values]


def closest_motions(scenes: Scenes, pose: Tensor, motions: Tensor, frame: Tensor,
                    k: int = 1) -> Tensor:
    """Indices ``[n, k]`` of the ``k`` motions of ``motions`` ``[n, M, 4, 4]`` from ``pose``
    ``[n, 4, 4]`` whose renders in ``scenes`` are closest to ``frame`` ``[n, 3, R, R]``, the
    closest first."""
    n = pose.shape[0]
    best = []
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        candidates = pose[lo:hi, None] @ motions[lo:hi]
        shown = render(scenes.index(torch.arange(lo, hi)), candidates,
                       resolution=frame.shape[-1])
        # mean squared error per render
        err = (shown.double() - frame[lo:hi, None].expand_as(shown).double()).square().mean(
            (-3, -2, -1))
        best.append(err.topk(k, dim=1, largest=False).indices)
    return torch.cat(best)


def _track(scenes: Scenes, start: Tensor, frames: Tensor, step) -> Tensor:
    """Poses ``[n, T, 4, 4]`` from ``start`` ``[n, 4, 4]``, each next one the previous moved by
    ``step(pose, frame)`` ``[n, 4, 4]``."""
    if frames.dim() != 5 or start.shape != (frames.shape[0], 4, 4):
        raise ValueError(f"frames must be [n, T, 3, R, R] and start [n, 4, 4], got "
                         f"{tuple(frames.shape)} and {tuple(start.shape)}")
    poses = [start.to(torch.float64)]
    for t in range(1, frames.shape[1]):
        poses.append(poses[-1] @ step(poses[-1], frames[:, t]))
    return torch.stack(poses, 1)


def render_track(scenes: Scenes, start: Tensor, frames: Tensor, grid: Tensor) -> Tensor:
    """Poses ``[n, T, 4, 4]`` float64 of frames ``[n, T, 3, R, R]`` whose frame 0 is seen from
    ``start`` ``[n, 4, 4]``: each next pose the previous one moved by the motion of ``grid``
    ``[M, 4, 4]`` whose render is closest to the frame (an exhaustive search)."""
    def step(pose: Tensor, frame: Tensor) -> Tensor:
        motions = grid[None].expand(pose.shape[0], -1, -1, -1)
        return grid[closest_motions(scenes, pose, motions, frame)[:, 0]]
    return _track(scenes, start, frames, step)


def press_track(scenes: Scenes, start: Tensor, frames: Tensor,
                factors: Sequence[float] = READ_FACTORS, presses: int = PRESSES) -> Tensor:
    """As :func:`render_track` in two stages, with a fraction of the full grid's renders: the
    ``presses`` key presses (of the 81) at the middle size of ``factors`` whose renders are
    closest, then each of them at each pair of sizes (translation, rotation)."""
    _check_factors(factors)
    middle = [sorted(factors)[len(factors) // 2]]
    every_press = press_motions(torch.arange(NUM_ACTIONS), middle)[:, 0]  # [81, 4, 4]

    def step(pose: Tensor, frame: Tensor) -> Tensor:
        n = pose.shape[0]
        chosen = closest_motions(scenes, pose, every_press[None].expand(n, -1, -1, -1), frame,
                                 k=presses)  # [n, presses] action ids
        sizes = press_motions(chosen, factors).flatten(1, 2)  # [n, presses*K*K, 4, 4]
        return sizes[torch.arange(n), closest_motions(scenes, pose, sizes, frame)[:, 0]]
    return _track(scenes, start, frames, step)


def anchored(window: Tensor, start: Tensor) -> Tensor:
    """A camera window ``[n, T, 4, 4]`` (any first pose) moved to start at ``start``
    ``[n, 4, 4]``: the same relative motions from the known start pose."""
    w = window.double()
    return start.double()[:, None] @ torch.linalg.inv(w[:, :1]) @ w
