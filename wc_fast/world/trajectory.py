"""Camera trajectories: sequences of action segments that keep the camera in free space.

A trajectory is ``num_segments`` segments of ``segment_frames`` frames; each segment repeats one
action id (one key press). Each segment first draws its speed and turn rate (uniform in
``speed_range``, independently) and its onset (the first frame moves a fraction in
``onset_range`` of that; see :mod:`wc_fast.world.motion`). Then its class (no-op with
probability ``noop_fraction``, else composite with probability ``composite_fraction``, else
basic), then the action uniformly among the actions of that class (composites with a number of
keys in ``composite_keys``) that keep every frame of the segment in free space (see
:func:`wc_fast.world.scene.is_free`) with the camera's tilt (pitch and roll together) within
``max_tilt_deg``. Walls are thus avoided by choosing actions, never by altering them: every
commanded action is the motion that happened. When no action of the drawn class is allowed
(rare: yaw alone is always allowed, so only for composites), the segment is a no-op, and
:attr:`Trajectory.forced_noop` records it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from wc_fast.actions import NUM_ACTIONS, basic_actions, composite_actions, num_primitives
from wc_fast.infra.runtime import uniform
from wc_fast.world.motion import (
    ONSET_RANGE,
    ROTATION_STEP_DEG,
    SPEED_RANGE,
    TRANSLATION_STEP,
    action_deltas,
    chain,
    max_tilt_cos,
    tilt_cos,
)
from wc_fast.world.scene import Scenes, is_free

DEFAULT_MAX_TILT_DEG = 30.0


class Trajectory(NamedTuple):
    """``actions`` ``[n, S*L]`` long, ``c2w`` ``[n, 1 + S*L, 4, 4]`` float64 (start pose first),
    ``forced_noop`` ``[n, S]`` bool (segments that fell back to no-op), ``motion_factors``
    ``[n, S, 3]`` float64: each segment's speed, turn rate and onset (fractions, see
    :mod:`wc_fast.world.motion`)."""

    actions: Tensor
    c2w: Tensor
    forced_noop: Tensor
    motion_factors: Tensor


def _class_masks(composite_keys: tuple[int, ...]) -> Tensor:
    """``[3, 81]`` bool: the action ids of each class (basic, composite, no-op)."""
    masks = torch.zeros(3, NUM_ACTIONS, dtype=torch.bool)
    masks[0, basic_actions()] = True
    composite = torch.tensor(composite_actions())
    keys = num_primitives(composite)
    masks[1, composite[torch.isin(keys, torch.tensor(composite_keys))]] = True
    masks[2, 0] = True
    return masks


def _segment_deltas(n: int, frames: int, gen: torch.Generator, speed_range: tuple[float, float],
                    onset_range: tuple[float, float]) -> tuple[Tensor, Tensor]:
    """Per-frame motion of every action id in one segment of each trajectory
    ``[n, frames, 81, 4, 4]``, and the (speed, turn rate, onset) drawn for it ``[n, 3]``."""
    speed = uniform(gen, n, *speed_range, dtype=torch.float64)
    turn = uniform(gen, n, *speed_range, dtype=torch.float64)
    onset = uniform(gen, n, *onset_range, dtype=torch.float64)
    ramp = torch.ones(n, frames, dtype=torch.float64)
    ramp[:, 0] = onset
    ids = torch.arange(NUM_ACTIONS)[None, None]
    trans_step = (TRANSLATION_STEP * speed[:, None] * ramp)[..., None]
    rot_step = (ROTATION_STEP_DEG * turn[:, None] * ramp)[..., None]
    deltas = action_deltas(ids, translation_step=trans_step, rotation_step_deg=rot_step)
    return deltas, torch.stack([speed, turn, onset], dim=-1)


def _allowed(scenes: Scenes, poses: Tensor, min_tilt_cos: float) -> Tensor:
    """Which of the 81 actions keep a whole segment valid: ``[n, 81]`` bool, from the poses
    ``[n, L, 81, 4, 4]`` each action would reach."""
    free = is_free(scenes, poses[..., :3, 3].transpose(1, 2))  # [n, 81, L]
    level = (tilt_cos(poses) >= min_tilt_cos).transpose(1, 2)
    return (free & level).all(-1)


def _reached(pose: Tensor, deltas: Tensor) -> Tensor:
    """Poses ``[n, L, 81, 4, 4]`` after each frame of ``deltas`` ``[n, L, 81, 4, 4]`` from
    ``pose`` ``[n, 4, 4]``."""
    current = pose[:, None].expand(-1, deltas.shape[2], -1, -1)
    out = []
    for i in range(deltas.shape[1]):
        current = current @ deltas[:, i]
        out.append(current)
    return torch.stack(out, 1)


def _check_range(name: str, bounds: tuple[float, float]) -> None:
    if len(bounds) != 2 or not 0.0 < bounds[0] <= bounds[1] <= 1.0:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high <= 1, got {bounds}")


def generate(scenes: Scenes, start: Tensor, gen: torch.Generator, *, num_segments: int,
             segment_frames: int, composite_fraction: float = 0.5, noop_fraction: float = 0.0,
             max_tilt_deg: float = DEFAULT_MAX_TILT_DEG,
             speed_range: tuple[float, float] = SPEED_RANGE,
             onset_range: tuple[float, float] = ONSET_RANGE,
             composite_keys: tuple[int, ...] = (2, 3, 4)) -> Trajectory:
    """Random valid trajectories from ``start`` ``[n, 4, 4]`` (one per scene).

    ``speed_range=(1, 1), onset_range=(1, 1)`` gives the fixed-step world (every key press
    moves by the largest step on every frame).
    """
    if not 0.0 <= composite_fraction <= 1.0 or not 0.0 <= noop_fraction <= 1.0:
        raise ValueError(f"composite_fraction and noop_fraction must lie in [0, 1], got "
                         f"{composite_fraction} and {noop_fraction}")
    if num_segments < 1 or segment_frames < 1:
        raise ValueError("num_segments and segment_frames must be >= 1")
    _check_range("speed_range", speed_range)
    _check_range("onset_range", onset_range)
    if not composite_keys or not set(composite_keys) <= {2, 3, 4}:
        raise ValueError(f"composite_keys must be a non-empty subset of (2, 3, 4), got "
                         f"{composite_keys}")
    n = start.shape[0]
    masks = _class_masks(tuple(composite_keys))
    min_cos = max_tilt_cos(max_tilt_deg) - 1e-9
    pose = start.to(torch.float64)
    actions, poses, forced, factors = [], [pose], [], []
    rows = torch.arange(n)
    for _ in range(num_segments):
        deltas, drawn = _segment_deltas(n, segment_frames, gen, speed_range, onset_range)
        factors.append(drawn)
        noop = torch.rand(n, generator=gen, dtype=torch.float64) < noop_fraction
        composite = torch.rand(n, generator=gen, dtype=torch.float64) < composite_fraction
        cls = torch.where(noop, 2, composite.long())
        allowed = masks[cls] & _allowed(scenes, _reached(pose, deltas), min_cos)
        stuck = ~allowed.any(-1)
        allowed[stuck, 0] = True
        choice = torch.multinomial(allowed.double(), 1, generator=gen)[:, 0]
        segment = choice[:, None].expand(n, segment_frames)
        path = chain(pose, deltas[rows, :, choice])
        actions.append(segment)
        poses.append(path[:, 1:])
        forced.append(stuck)
        pose = path[:, -1]
    return Trajectory(torch.cat(actions, 1), torch.cat([poses[0][:, None]] + poses[1:], 1),
                      torch.stack(forced, 1), torch.stack(factors, 1))
