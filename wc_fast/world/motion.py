"""Per-frame camera motion of each action id (the label coding of :mod:`wc_fast.actions`).

An action is applied in the CAMERA frame: ``c2w[i] = c2w[i-1] @ delta``, so the relative
motion ``inv(c2w[i-1]) @ c2w[i]`` of a frame is exactly its ``delta``.

``delta = [R | t]`` with
- ``t`` the sum of the pressed translation keys, each ``speed * TRANSLATION_STEP`` units along
  its axis (forward +z, backward -z, right +x, left -x; OpenCV camera frame), so a two-key
  translation such as forward+right moves that far along each of the two axes;
- ``R = Ry(yaw) @ Rx(pitch)`` with ``yaw`` = +/-``turn * ROTATION_STEP_DEG`` (right +),
  ``pitch`` = +/-``turn * ROTATION_STEP_DEG`` (up +). This order is the one the label rules
  decompose exactly: the yaw and pitch read back from ``R`` are the commanded angles.

``TRANSLATION_STEP`` and ``ROTATION_STEP_DEG`` are the largest per-frame motions. Like captured
video, the world moves at a speed and turn rate that vary from key press to key press
(:data:`SPEED_RANGE`, drawn per segment, independently for translation and rotation) and
reaches that speed with a lag: the first frame of a key press moves a fraction
(:data:`ONSET_RANGE`) of it. So one command from one history has many plausible futures, all
of whose per-frame labels are the command's (the smallest motion, 0.42 of a step, stays above
the label thresholds).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_fast.actions import NUM_ACTIONS, label_to_bits, split_action

TRANSLATION_STEP = 0.3
ROTATION_STEP_DEG = 6.0
SPEED_RANGE = (0.6, 1.0)  # per key press, a fraction of the largest step (translation, turn)
ONSET_RANGE = (0.7, 1.0)  # first frame of a key press: a fraction of the press's speed

# Signed unit axis of each translation bit (forward, backward, right, left) in the camera frame.
_TRANSLATION_AXES = ((0.0, 0.0, 1.0), (0.0, 0.0, -1.0), (1.0, 0.0, 0.0), (-1.0, 0.0, 0.0))
# (yaw sign, pitch sign) of each rotation bit (yaw right, yaw left, pitch up, pitch down).
_ROTATION_SIGNS = ((1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0))


def rot_y(deg: Tensor) -> Tensor:
    """Rotation about the camera +y axis (yaw right for ``deg > 0``): ``[...]`` -> ``[..., 3, 3]``.
    """
    a = torch.deg2rad(deg)
    c, s, z, o = torch.cos(a), torch.sin(a), torch.zeros_like(a), torch.ones_like(a)
    return torch.stack([c, z, s, z, o, z, -s, z, c], dim=-1).unflatten(-1, (3, 3))


def rot_x(deg: Tensor) -> Tensor:
    """Rotation about the camera +x axis (pitch up for ``deg > 0``): ``[...]`` -> ``[..., 3, 3]``.
    """
    a = torch.deg2rad(deg)
    c, s, z, o = torch.cos(a), torch.sin(a), torch.zeros_like(a), torch.ones_like(a)
    return torch.stack([o, z, z, z, c, -s, z, s, c], dim=-1).unflatten(-1, (3, 3))


Step = float | Tensor  # a scalar, or a tensor that broadcasts against the action ids


def _per_action(step: Step, actions: Tensor) -> Tensor:
    """``step`` as float64 ``[..., 1]``, broadcastable against ``[..., 3]`` / ``[..., 2]``."""
    return torch.as_tensor(step, dtype=torch.float64, device=actions.device)[..., None]


def action_components(actions: Tensor, *, translation_step: Step = TRANSLATION_STEP,
                      rotation_step_deg: Step = ROTATION_STEP_DEG) -> tuple[Tensor, Tensor]:
    """Action ids ``[...]`` -> (translation ``[..., 3]``, (yaw, pitch) degrees ``[..., 2]``).

    Both float64. The steps may be tensors that broadcast against ``actions`` (a speed per
    action).
    """
    trans, rot = split_action(actions)
    t_bits = label_to_bits(trans).to(torch.float64)
    r_bits = label_to_bits(rot).to(torch.float64)
    axes = torch.tensor(_TRANSLATION_AXES, dtype=torch.float64, device=actions.device)
    signs = torch.tensor(_ROTATION_SIGNS, dtype=torch.float64, device=actions.device)
    return (t_bits @ axes * _per_action(translation_step, actions),
            r_bits @ signs * _per_action(rotation_step_deg, actions))


def action_deltas(actions: Tensor, *, translation_step: Step = TRANSLATION_STEP,
                  rotation_step_deg: Step = ROTATION_STEP_DEG) -> Tensor:
    """Relative camera motion of action ids ``[...]`` -> ``[..., 4, 4]`` float64 (steps as in
    :func:`action_components`)."""
    t, angles = action_components(actions, translation_step=translation_step,
                                  rotation_step_deg=rotation_step_deg)
    shape = t.shape[:-1]
    delta = torch.zeros(*shape, 4, 4, dtype=torch.float64, device=actions.device)
    delta[..., :3, :3] = rot_y(angles[..., 0]) @ rot_x(angles[..., 1])
    delta[..., :3, 3] = t
    delta[..., 3, 3] = 1.0
    return delta


def all_action_deltas(**steps: float) -> Tensor:
    """``[81, 4, 4]`` float64: the relative motion of every action id 0..80."""
    return action_deltas(torch.arange(NUM_ACTIONS), **steps)


def chain(start: Tensor, deltas: Tensor) -> Tensor:
    """Poses from a start pose and per-frame relative motions.

    ``start`` ``[..., 4, 4]``, ``deltas`` ``[..., F, 4, 4]`` -> ``[..., F+1, 4, 4]`` where pose 0
    is ``start`` and pose i is ``pose[i-1] @ deltas[i-1]``.
    """
    poses = [start]
    for i in range(deltas.shape[-3]):
        poses.append(poses[-1] @ deltas[..., i, :, :])
    return torch.stack(poses, dim=-3)


def tilt_cos(c2w: Tensor) -> Tensor:
    """Cosine of the angle between the camera's +y axis and the world's +y (down) axis.

    Bounding this angle bounds both pitch (elevation of the viewing direction) and roll.
    """
    return c2w[..., 1, 1]


def max_tilt_cos(max_tilt_deg: float) -> float:
    """``cos(max_tilt_deg)``: the smallest allowed :func:`tilt_cos`."""
    return math.cos(math.radians(max_tilt_deg))
