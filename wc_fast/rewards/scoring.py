"""Reward functions over a batch of candidate clips: IF and VQ score per candidate.

Both take ``frames`` ``[n, F+1, C, H, W]``: the previous clip's last frame first, then the
candidate's ``F`` new frames, and run their model once on the whole batch (no per-candidate
loop).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence

import torch
from torch import Tensor

from wc_fast.actions import split_action
from wc_fast.config import VqMode
from wc_fast.rewards.critic import VisualQualityScorer
from wc_fast.rewards.estimators import CameraEstimator
from wc_fast.rewards.interaction import interaction_score

VQ_MODES = typing.get_args(VqMode)


def _check_frames(frames: Tensor) -> None:
    if not isinstance(frames, Tensor) or frames.dim() != 5 or frames.shape[1] < 2:
        raise ValueError(f"frames must be [n, F+1, C, H, W] with F >= 1, got "
                         f"{tuple(getattr(frames, 'shape', ()))}")


def camera_poses(estimator: CameraEstimator, frames: Tensor) -> Tensor:
    """The estimator's c2w ``[n, F+1, 4, 4]`` of ``frames`` ``[n, F+1, C, H, W]`` (no grad)."""
    _check_frames(frames)
    with torch.no_grad():
        return estimator(frames)


def if_scores(estimator: CameraEstimator, frames: Tensor, actions: Tensor, *,
              trans_thresholds: Sequence[float], rot_threshold_deg: float) -> Tensor:
    """Interaction-following score per candidate, ``[n]`` (docs/design.md section 5).

    ``actions`` ``[n, F]`` or ``[F]`` (one command shared by all candidates) are the commanded
    action ids 0..80 of the new frames; the estimator's poses of ``frames`` are turned into
    labels and compared, best over ``trans_thresholds``.
    """
    _check_frames(frames)
    actions = torch.as_tensor(actions)
    if actions.shape[-1] != frames.shape[1] - 1 or actions.dim() not in (1, 2):
        raise ValueError(f"actions must be [n, F] or [F] with F={frames.shape[1] - 1}, got "
                         f"{tuple(actions.shape)}")
    c2w = camera_poses(estimator, frames)
    trans_gt, rot_gt = split_action(actions.to(c2w.device))
    return interaction_score(c2w, trans_gt, rot_gt, trans_thresholds=trans_thresholds,
                             rot_threshold_deg=rot_threshold_deg)


def stride_frames(num_new: int, stride: int) -> list[int]:
    """Indices (into ``frames``, the context frame being 0) of the new frames that VQ scores:
    every ``stride``-th new frame counting the first new frame as 1 (frames ``stride``,
    ``2*stride``, ...), or the last new frame when ``stride > num_new``."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    picked = list(range(stride, num_new + 1, stride))
    return picked or [num_new]


def vq_scores(critic: VisualQualityScorer, frames: Tensor, *, stride: int, mode: str = "stride",
              prompt: str | None = None) -> Tensor:
    """Visual quality score per candidate, ``[n]`` (docs/design.md section 6).

    - ``"stride"`` (paper): mean critic score over the new frames picked by
      :func:`stride_frames` (every ``stride``-th new frame).
    - ``"drift"`` (official code): the same mean minus the score of the first (context) frame,
      i.e. how much quality the candidate gained or lost relative to where it started.
    """
    _check_frames(frames)
    if mode not in VQ_MODES:
        raise ValueError(f"mode must be one of {VQ_MODES}, got {mode!r}")
    picked = stride_frames(frames.shape[1] - 1, stride)
    index = [0, *picked] if mode == "drift" else picked
    with torch.no_grad():
        scores = critic(frames[:, index], prompt=prompt)
    mean = scores[:, -len(picked):].mean(1)
    return mean - scores[:, 0] if mode == "drift" else mean
