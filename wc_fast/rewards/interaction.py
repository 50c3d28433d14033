"""Interaction-following (IF) score: camera poses -> per-frame action labels -> accuracy.

docs/design.md section 5. Everything is vectorized over leading dimensions (groups, candidates),
frames and translation thresholds; there is no per-frame Python loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from wc_fast.actions import bits_to_label
from wc_fast.world.motion import ROTATION_STEP_DEG, SPEED_RANGE, TRANSLATION_STEP, action_deltas

PAPER_TRANS_THRESHOLDS = (0.01, 0.02, 0.03, 0.04, 0.05)
COS_60 = 0.5


def _check_poses(c2w: Tensor) -> None:
    if not isinstance(c2w, Tensor) or not c2w.is_floating_point():
        raise TypeError(f"c2w must be a floating-point tensor, got "
                        f"{getattr(c2w, 'dtype', type(c2w).__name__)}")
    if c2w.dim() < 3 or c2w.shape[-2:] != (4, 4) or c2w.shape[-3] < 2:
        raise ValueError(f"c2w must have shape [..., F+1, 4, 4] with F >= 1, got "
                         f"{tuple(c2w.shape)}")
    if not bool(torch.isfinite(c2w).all()):
        raise ValueError("c2w must be finite, got NaN or inf")


def _check_threshold(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def relative_motion(c2w: Tensor) -> Tensor:
    """``rel[i] = inv(c2w[i-1]) @ c2w[i]``: ``[..., F+1, 4, 4]`` -> ``[..., F, 4, 4]`` (fp64)."""
    c2w = c2w.to(torch.float64)
    return torch.linalg.inv(c2w[..., :-1, :, :]) @ c2w[..., 1:, :, :]


def _translation_bits(t: Tensor, thresholds: Tensor) -> Tensor:
    """``t`` ``[..., F, 3]``, thresholds ``[M]`` -> bits ``[M, ..., F, 4]``.

    Bits are (forward, backward, right, left); a frame moves when ``|t|`` exceeds the threshold.
    """
    norm = t.norm(dim=-1)
    moving = norm.unsqueeze(0) > thresholds.reshape(-1, *([1] * norm.dim()))
    unit = t / norm.clamp_min(torch.finfo(t.dtype).tiny).unsqueeze(-1)
    ang_z = torch.rad2deg(torch.acos(unit[..., 2].clamp(-1.0, 1.0)))
    ang_x = torch.rad2deg(torch.acos(unit[..., 0].clamp(-1.0, 1.0)))
    direction = torch.stack([ang_z < 60.0, ang_z > 120.0, ang_x < 60.0, ang_x > 120.0], dim=-1)
    return direction.unsqueeze(0) & moving.unsqueeze(-1)


def rotation_angles(rel: Tensor) -> tuple[Tensor, Tensor]:
    """(pitch, yaw) in degrees of relative rotations ``[..., 4, 4]`` (or ``[..., 3, 3]``)."""
    r = rel[..., :3, :3]
    pitch = torch.atan2(r[..., 2, 1], r[..., 2, 2])
    yaw = torch.atan2(-r[..., 2, 0], torch.sqrt(r[..., 0, 0] ** 2 + r[..., 1, 0] ** 2))
    return torch.rad2deg(pitch), torch.rad2deg(yaw)


def _rotation_labels(rel: Tensor, rot_threshold_deg: float) -> Tensor:
    pitch, yaw = rotation_angles(rel)
    tau = rot_threshold_deg
    bits = torch.stack([yaw > tau, yaw < -tau, pitch > tau, pitch < -tau], dim=-1)
    return bits_to_label(bits)


def _labels_multi(c2w: Tensor, trans_thresholds: Sequence[float], rot_threshold_deg: float
                  ) -> tuple[Tensor, Tensor]:
    """Translation labels for every threshold ``[M, ..., F]`` and rotation labels ``[..., F]``."""
    rel = relative_motion(c2w)
    thresholds = torch.tensor(trans_thresholds, dtype=torch.float64, device=c2w.device)
    trans = bits_to_label(_translation_bits(rel[..., :3, 3], thresholds))
    return trans, _rotation_labels(rel, rot_threshold_deg)


def poses_to_labels(c2w: Tensor, *, trans_threshold: float, rot_threshold_deg: float
                    ) -> tuple[Tensor, Tensor]:
    """Per-frame (translation, rotation) labels 0..8 from camera-to-world poses.

    ``c2w`` ``[..., F+1, 4, 4]`` (the previous clip's last pose first) -> two LongTensors
    ``[..., F]``. A translation counts when its norm exceeds ``trans_threshold``; a rotation
    when |yaw| or |pitch| exceeds ``rot_threshold_deg``.
    """
    _check_poses(c2w)
    tau_t = _check_threshold("trans_threshold", trans_threshold)
    tau_r = _check_threshold("rot_threshold_deg", rot_threshold_deg)
    trans, rot = _labels_multi(c2w, (tau_t,), tau_r)
    return trans[0], rot


def _check_labels(name: str, gt: object, frames: int) -> None:
    if not isinstance(gt, Tensor) or gt.dtype.is_floating_point or gt.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of labels 0..8")
    if gt.dim() == 0 or gt.shape[-1] != frames:
        raise ValueError(f"{name} must have shape [..., F={frames}] (one label per new "
                         f"frame), got {tuple(gt.shape)}")
    if gt.numel() and (int(gt.min()) < 0 or int(gt.max()) > 8):
        raise ValueError(f"{name} labels must lie in 0..8")


def _checked_labels(c2w: Tensor, trans_gt: Tensor, rot_gt: Tensor,
                    trans_thresholds: Sequence[float], rot_threshold_deg: float
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validated ``(trans [M, ..., F], rot [..., F], trans_gt, rot_gt)`` on ``c2w``'s device."""
    _check_poses(c2w)
    if len(trans_thresholds) == 0:
        raise ValueError("trans_thresholds must name at least one threshold")
    thresholds = [_check_threshold("trans_thresholds", t) for t in trans_thresholds]
    tau_r = _check_threshold("rot_threshold_deg", rot_threshold_deg)
    frames = c2w.shape[-3] - 1
    _check_labels("trans_gt", trans_gt, frames)
    _check_labels("rot_gt", rot_gt, frames)
    trans, rot = _labels_multi(c2w, thresholds, tau_r)
    return trans, rot, trans_gt.to(c2w.device), rot_gt.to(c2w.device)


def action_accuracy(
    c2w: Tensor,
    trans_gt: Tensor,
    rot_gt: Tensor,
    *,
    trans_thresholds: Sequence[float] = PAPER_TRANS_THRESHOLDS,
    rot_threshold_deg: float = 1.0,
) -> Tensor:
    """Fraction of frames whose full action (translation AND rotation label) was followed.

    Same inputs and threshold rule as :func:`interaction_score` (best translation threshold),
    without partial credit: the evaluation's action accuracy ``[...]``.
    """
    trans, rot, trans_gt, rot_gt = _checked_labels(c2w, trans_gt, rot_gt, trans_thresholds,
                                                   rot_threshold_deg)
    hit = (trans == trans_gt) & (rot == rot_gt).unsqueeze(0)
    return hit.double().mean(-1).amax(0).to(c2w.dtype)


def interaction_score(
    c2w: Tensor,
    trans_gt: Tensor,
    rot_gt: Tensor,
    *,
    trans_thresholds: Sequence[float] = PAPER_TRANS_THRESHOLDS,
    rot_threshold_deg: float = 1.0,
) -> Tensor:
    """IF score ``[...]``: best over translation thresholds of (trans acc + rot acc) / 2.

    ``c2w`` ``[..., F+1, 4, 4]``; ``trans_gt``, ``rot_gt`` ``[..., F]`` commanded labels 0..8
    (broadcastable against the pose batch, e.g. one command shared by G candidates).
    """
    trans, rot, trans_gt, rot_gt = _checked_labels(c2w, trans_gt, rot_gt, trans_thresholds,
                                                   rot_threshold_deg)
    trans_acc = (trans == trans_gt).double().mean(-1)
    rot_acc = (rot == rot_gt).double().mean(-1)
    score = (trans_acc + rot_acc.unsqueeze(0)) / 2
    return score.amax(0).to(c2w.dtype)


def trajectory_score(c2w: Tensor, actions: Tensor, *, translation_weight: float = 1.0,
                     rotation_weight: float = 1.0) -> Tensor:
    """World-R1's continuous trajectory reward: ``exp(-(a * e_t + b * e_R))`` ``[...]``.

    ``e_t`` is the mean over frames of the L2 distance between the estimated and the commanded
    per-frame translation, ``e_R`` the mean geodesic angle between the two rotations, both in
    units of the world's largest per-frame step (:data:`wc_fast.world.motion.TRANSLATION_STEP`,
    ``ROTATION_STEP_DEG``), so a whole step of error in either costs a factor ``e``. The
    commanded motion of a key is the middle of its speed range: the world draws the speed per
    key press, and the command does not say which. ``c2w`` ``[..., F+1, 4, 4]``, ``actions``
    ``[..., F]`` (broadcast against the poses) -> 1 for exact middle-speed poses, falling
    monotonically with either error.
    """
    _check_poses(c2w)
    for name, w in (("translation_weight", translation_weight),
                    ("rotation_weight", rotation_weight)):
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {w!r}")
    actions = torch.as_tensor(actions, device=c2w.device)
    if actions.shape[-1] != c2w.shape[-3] - 1:
        raise ValueError(f"actions must have one entry per frame ({c2w.shape[-3] - 1}), got "
                         f"shape {tuple(actions.shape)}")
    speed = sum(SPEED_RANGE) / 2
    want = action_deltas(actions, translation_step=speed * TRANSLATION_STEP,
                         rotation_step_deg=speed * ROTATION_STEP_DEG)
    got = relative_motion(c2w)
    e_t = (got[..., :3, 3] - want[..., :3, 3]).norm(dim=-1) / TRANSLATION_STEP
    diff = want[..., :3, :3].transpose(-1, -2) @ got[..., :3, :3]
    cos = ((diff.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2).clamp(-1.0, 1.0)
    e_r = torch.rad2deg(torch.acos(cos)) / ROTATION_STEP_DEG
    error = translation_weight * e_t.mean(-1) + rotation_weight * e_r.mean(-1)
    return torch.exp(-error).to(c2w.dtype)
