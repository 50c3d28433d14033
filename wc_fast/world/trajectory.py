"""Camera trajectories: sequences of action segments that keep the camera in free space.

A trajectory is ``num_segments`` segments of ``segment_frames`` frames; each segment repeats one
action id. Its class is drawn first (no-op with probability ``noop_fraction``, else composite
with probability ``composite_fraction``, else basic), then the action uniformly among the
actions of that class that keep every frame of the segment in free space (see
:func:`wc_fast.world.scene.is_free`) with the camera's tilt (pitch and roll together) within
``max_tilt_deg``. Walls are thus avoided by choosing actions, never by altering them: every
commanded action is exactly the motion that happened. When no action of the drawn class is
allowed (rare: yaw alone is always allowed, so only for composites), the segment is a no-op,
and :attr:`Trajectory.forced_noop` records it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from wc_fast.actions import NUM_ACTIONS, basic_actions, composite_actions
from wc_fast.world.motion import action_deltas, all_action_deltas, chain, max_tilt_cos, tilt_cos
from wc_fast.world.scene import Scenes, is_free

DEFAULT_MAX_TILT_DEG = 30.0


class Trajectory(NamedTuple):
    """``actions`` ``[n, S*L]`` long, ``c2w`` ``[n, 1 + S*L, 4, 4]`` float64 (start pose first),
    ``forced_noop`` ``[n, S]`` bool (segments that fell back to no-op)."""

    actions: Tensor
    c2w: Tensor
    forced_noop: Tensor


def _class_masks() -> Tensor:
    """``[3, 81]`` bool: the action ids of each class (basic, composite, no-op)."""
    masks = torch.zeros(3, NUM_ACTIONS, dtype=torch.bool)
    masks[0, basic_actions()] = True
    masks[1, composite_actions()] = True
    masks[2, 0] = True
    return masks


def _allowed(scenes: Scenes, pose: Tensor, powers: Tensor, min_tilt_cos: float) -> Tensor:
    """Which of the 81 actions keep a whole segment valid: ``[n, 81]`` bool.

    ``pose`` ``[n, 4, 4]``; ``powers`` ``[L, 81, 4, 4]`` (each action applied 1..L times).
    """
    poses = pose[:, None, None] @ powers[None]  # [n, L, 81, 4, 4]
    free = is_free(scenes, poses[..., :3, 3].transpose(1, 2))  # [n, 81, L]
    level = (tilt_cos(poses) >= min_tilt_cos).transpose(1, 2)
    return (free & level).all(-1)


def generate(scenes: Scenes, start: Tensor, gen: torch.Generator, *, num_segments: int,
             segment_frames: int, composite_fraction: float = 0.5, noop_fraction: float = 0.0,
             max_tilt_deg: float = DEFAULT_MAX_TILT_DEG) -> Trajectory:
    """Random valid trajectories from ``start`` ``[n, 4, 4]`` (one per scene)."""
    if not 0.0 <= composite_fraction <= 1.0 or not 0.0 <= noop_fraction <= 1.0:
        raise ValueError(f"composite_fraction and noop_fraction must lie in [0, 1], got "
                         f"{composite_fraction} and {noop_fraction}")
    if num_segments < 1 or segment_frames < 1:
        raise ValueError("num_segments and segment_frames must be >= 1")
    n = start.shape[0]
    deltas = all_action_deltas()
    powers = [deltas]
    for _ in range(segment_frames - 1):
        powers.append(powers[-1] @ deltas)
    powers_t = torch.stack(powers)
    masks = _class_masks()
    min_cos = max_tilt_cos(max_tilt_deg) - 1e-9
    pose = start.to(torch.float64)
    actions, poses, forced = [], [pose], []
    for _ in range(num_segments):
        noop = torch.rand(n, generator=gen, dtype=torch.float64) < noop_fraction
        composite = torch.rand(n, generator=gen, dtype=torch.float64) < composite_fraction
        cls = torch.where(noop, 2, composite.long())
        allowed = masks[cls] & _allowed(scenes, pose, powers_t, min_cos)
        stuck = ~allowed.any(-1)
        allowed[stuck, 0] = True
        choice = torch.multinomial(allowed.double(), 1, generator=gen)[:, 0]
        segment = choice[:, None].expand(n, segment_frames)
        path = chain(pose, action_deltas(segment))
        actions.append(segment)
        poses.append(path[:, 1:])
        forced.append(stuck)
        pose = path[:, -1]
    return Trajectory(torch.cat(actions, 1), torch.cat([poses[0][:, None]] + poses[1:], 1),
                      torch.stack(forced, 1))
