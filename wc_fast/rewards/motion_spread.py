"""How differently the candidates of a group move: the exploration RL can select from.

WorldCompass selects among G candidates of one command; if they all move the camera the same
way, no selection can teach following the command better. ``motion_spread`` measures, along
each direction of motion the command moves (x or z translation, yaw, pitch), the within-group
spread of the estimated per-frame camera motion in units of the estimator's own error along
that direction on ground-truth renders, averaged over the commanded directions. A value well
above 1 means the candidates really move differently (not just that the estimator reads
noise). Directions the command does not move are left out: there the world never varies, and
averaging them in would dilute the measure.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wc_fast.rewards.estimators import CameraEstimator, delta_to_params
from wc_fast.rewards.interaction import relative_motion
from wc_fast.world import batch_seed, sample_clips
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, action_components

MOVED = (0, 2, 3, 4)  # tx, tz, yaw, pitch: the pose parameters actions move
ERROR_DATA_SEED = 9100  # ground-truth clips for the estimator's error (no training stream)


def camera_motion(c2w: Tensor) -> Tensor:
    """Per-frame camera motion ``[..., F, 4]`` float64 of poses ``[..., F+1, 4, 4]``: the
    translation along x and z and the yaw and pitch of each frame, each in units of the world's
    largest per-frame step."""
    return delta_to_params(relative_motion(c2w.double()))[..., list(MOVED)]


@torch.no_grad()
def estimator_motion_error(estimator: CameraEstimator, *, clips: int = 64,
                           seed: int = ERROR_DATA_SEED, **options: object) -> Tensor:
    """Mean absolute error ``[4]`` of the estimated per-frame camera motion
    (:func:`camera_motion`, step units) along each direction, over the ground-truth frames
    that move along it; ``options`` go to ``sample_clips`` (a new action every frame, so
    every direction gets frames)."""
    options = {"segment_frames": 1, **options}
    data = sample_clips(clips, seed=batch_seed(seed, 0), **options)
    device = next((p.device for p in getattr(estimator, "parameters", list)()), None)
    frames = data.frames if device is None else data.frames.to(device)
    est = camera_motion(estimator(frames).cpu())
    true = camera_motion(data.c2w)
    moving = true.abs() > 0.1
    err = ((est - true).abs() * moving).sum(dim=(0, 1)) / moving.sum(dim=(0, 1)).clamp_min(1)
    return err.float()


def commanded_directions(actions: Tensor) -> Tensor:
    """Which of the four directions (x, z translation, yaw, pitch) action ids ``[...]`` move:
    bool ``[4]`` (any of the given frames)."""
    t, angles = action_components(actions.reshape(-1), translation_step=1.0,
                                  rotation_step_deg=1.0)
    return torch.cat([t[:, [0, 2]], angles], dim=-1).ne(0).any(dim=0)


def motion_spread(motion: Tensor, error: Tensor, directions: Tensor) -> float:
    """Within-group spread of candidate motions ``[G, F, 4]`` along the commanded
    ``directions`` (bool ``[4]``): the standard deviation over the ``G`` candidates, averaged
    over frames, divided by that direction's ``error`` (``[4]``), then averaged over the
    directions. NaN for a command that moves nothing."""
    if motion.dim() != 3 or motion.shape[0] < 2 or motion.shape[-1] != len(MOVED):
        raise ValueError(f"motion must be [G, F, 4] with G >= 2, got {tuple(motion.shape)}")
    error = torch.as_tensor(error, dtype=torch.float64)
    if error.shape != (len(MOVED),) or not bool((error > 0).all()):
        raise ValueError(f"error must be 4 values > 0, got {error.tolist()}")
    if not bool(directions.any()):
        return float("nan")
    per_direction = motion.double().std(dim=0).mean(dim=0) / error
    return float(per_direction[directions].mean())


def soft_interaction_score(c2w: Tensor, actions: Tensor, *, trans_threshold: float,
                           rot_threshold_deg: float, width: float = 0.1) -> Tensor:
    """A smooth IF: per frame and direction (x, z translation, yaw, pitch), the probability-like
    score that the label rules would call it right, ``sigmoid((d * m - thr) / width)`` along a
    commanded direction ``d`` (moved far enough the right way) and ``sigmoid((thr - |m|) /
    width)`` along the others (did not move), averaged. ``m`` is the estimated motion in units
    of the largest step, ``thr`` the label threshold in those units. c2w ``[n, F+1, 4, 4]``,
    actions ``[n, F]`` or ``[F]`` -> ``[n]``.

    Unlike the label IF, a candidate that almost turned scores above one that did not turn
    at all, so a group's candidates are ranked by how close they came.
    """
    motion = camera_motion(c2w)
    t_dir, r_dir = action_components(torch.as_tensor(actions).to(c2w.device),
                                     translation_step=1.0, rotation_step_deg=1.0)
    direction = torch.cat([t_dir[..., [0, 2]], r_dir], dim=-1).sign()
    thr = motion.new_tensor([trans_threshold / TRANSLATION_STEP] * 2
                            + [rot_threshold_deg / ROTATION_STEP_DEG] * 2)
    moved = torch.sigmoid((direction * motion - thr) / width)
    still = torch.sigmoid((thr - motion.abs()) / width)
    return torch.where(direction != 0, moved, still).mean(dim=(-2, -1))
