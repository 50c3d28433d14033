"""Our action ids and commanded camera path -> WorldPlay's action ids, view matrices and
intrinsics, as HY-WorldPlay's pipeline builds them (``hyvideo/generate.py``: ``parse_pose_string``,
``pose_to_input``; ``hyvideo/generate_custom_trajectory.py``: ``generate_camera_trajectory_local``).

* **Action ids.** WorldPlay labels a latent frame ``trans * 9 + rot`` with the same two 0..8
  labels as :mod:`wc_fast.actions` (translation bits forward, backward, right, left; rotation
  bits yaw right, yaw left, pitch up, pitch down; the same pair codes), so an id passes through
  unchanged. The first latent frame has no motion before it: label 0.
* **Camera path.** One step per latent frame, in the camera's own axes: yaw ``rot_y`` then pitch
  ``rot_x`` right-multiplied onto the rotation, then ``forward`` along the new camera z and
  ``right`` along the new camera x. A pressed key moves by the pipeline's speeds (0.08 units,
  3 degrees per latent frame); keys are intensities in [0, 1] here, so a soft key moves by its
  share. Frame ``t``'s action is the step from frame ``t - 1`` to ``t``.
* **View matrices** are world-to-camera ``inv(c2w)``; the world is the camera of the path's
  start (the pipeline's frame 0, our prompt frame). The world matters: PRoPE's text keys are
  not camera-transformed (``WorldPlayWorldModel._cache_from`` re-expresses a cache in its last
  frame's camera exactly).
* **Intrinsics** are the pipeline's default ``K`` (fx = fy = 969.70 px on a 1920 x 1080 frame)
  normalised as ``pose_to_input`` does: ``fx / (2 cx)``, ``fy / (2 cy)``, principal point 0.5.
  PRoPE keeps only the focal lengths.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_fast.models.tiny.dit import key_table

FORWARD_SPEED = 0.08  # units per latent frame (parse_pose_string)
TURN_DEGREES = 3.0  # yaw and pitch per latent frame
DEFAULT_K = ((969.6969696969696, 0.0, 960.0), (0.0, 969.6969696969696, 540.0), (0.0, 0.0, 1.0))


def action_keys(actions: Tensor) -> Tensor:
    """Action ids ``[...]`` (0..80) -> key intensities ``[..., 8]`` (forward, backward, right,
    left, yaw right, yaw left, pitch up, pitch down)."""
    return key_table().to(actions.device)[actions.long(), :8]


def step_matrices(keys: Tensor, *, speed: float = FORWARD_SPEED,
                  degrees: float = TURN_DEGREES) -> Tensor:
    """Key intensities ``[..., 8]`` -> the camera's local step ``[..., 4, 4]`` per frame (the
    motion ``generate_camera_trajectory_local`` right-multiplies onto the pose)."""
    forward = (keys[..., 0] - keys[..., 1]) * speed
    right = (keys[..., 2] - keys[..., 3]) * speed
    yaw = (keys[..., 4] - keys[..., 5]) * math.radians(degrees)
    pitch = (keys[..., 6] - keys[..., 7]) * math.radians(degrees)
    cy, sy, cp, sp = yaw.cos(), yaw.sin(), pitch.cos(), pitch.sin()
    zero, one = torch.zeros_like(yaw), torch.ones_like(yaw)
    rot_y = torch.stack([cy, zero, sy, zero, one, zero, -sy, zero, cy], -1).unflatten(-1, (3, 3))
    rot_x = torch.stack([one, zero, zero, zero, cp, -sp, zero, sp, cp], -1).unflatten(-1, (3, 3))
    rotation = rot_y @ rot_x
    move = torch.stack([right, zero, forward], -1).unsqueeze(-1)
    step = torch.zeros(*keys.shape[:-1], 4, 4, dtype=keys.dtype, device=keys.device)
    step[..., :3, :3] = rotation
    step[..., :3, 3:] = rotation @ move
    step[..., 3, 3] = 1.0
    return step


def camera_path(keys: Tensor, start: Tensor | None = None, **speeds: float) -> Tensor:
    """Camera-to-world poses ``[B, F, 4, 4]`` after each frame's step ``keys`` ``[B, F, 8]``,
    from ``start`` ``[B, 4, 4]`` (identity by default)."""
    steps = step_matrices(keys, **speeds)
    pose = torch.eye(4, dtype=keys.dtype, device=keys.device).expand(keys.shape[0], 4, 4)
    pose = pose if start is None else start
    poses = []
    for f in range(keys.shape[1]):
        pose = pose @ steps[:, f]
        poses.append(pose)
    return torch.stack(poses, dim=1)


def history_cameras(actions: Tensor, **speeds: float) -> Tensor:
    """Camera-to-world poses ``[B, F, 4, 4]`` of a history whose first frame is the prompt (the
    world origin; its action ignored) and whose frame ``t`` followed action ``actions[:, t]``."""
    keys = action_keys(actions).double()
    keys[:, 0] = 0.0
    return camera_path(keys, **speeds)


def view_matrices(c2w: Tensor) -> Tensor:
    """World-to-camera ``[..., 4, 4]`` of camera-to-world ``c2w`` (rigid: ``[R^T, -R^T t]``)."""
    rt = c2w[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(c2w)
    out[..., :3, :3] = rt
    out[..., :3, 3:] = -rt @ c2w[..., :3, 3:]
    out[..., 3, 3] = 1.0
    return out


def rebase(c2w: Tensor, origin: Tensor) -> Tensor:
    """Poses ``[B, F, 4, 4]`` re-expressed in the frame of camera ``origin`` ``[B, 4, 4]``."""
    return view_matrices(origin).unsqueeze(1) @ c2w


def intrinsics(frames: int, k: tuple = DEFAULT_K) -> Tensor:
    """The normalised intrinsics ``[frames, 3, 3]`` ``pose_to_input`` makes of pixel ``k``."""
    fx, fy, cx, cy = k[0][0], k[1][1], k[0][2], k[1][2]
    out = torch.tensor([[fx / (2 * cx), 0.0, 0.5], [0.0, fy / (2 * cy), 0.5], [0.0, 0.0, 1.0]],
                       dtype=torch.float64)
    return out.expand(frames, 3, 3).clone()
