"""How differently the candidates of a group move: the exploration RL can select from.

WorldCompass selects among G candidates of one command; if they all move the camera the same
way, no selection can teach following the command better. ``motion_spread`` measures the
within-group spread of the estimated per-frame camera motion in units of the estimator's own
error on ground-truth renders, so a value well above 1 means the candidates really move
differently (not just that the estimator reads noise).
"""

from __future__ import annotations

import torch
from torch import Tensor

from wc_fast.rewards.estimators import CameraEstimator, delta_to_params
from wc_fast.rewards.interaction import relative_motion
from wc_fast.world import batch_seed, sample_clips

MOVED = (0, 2, 3, 4)  # tx, tz, yaw, pitch: the pose parameters actions move
ERROR_DATA_SEED = 9100  # ground-truth clips for the estimator's error (no training stream)


def camera_motion(c2w: Tensor) -> Tensor:
    """Per-frame camera motion ``[..., F, 4]`` float64 of poses ``[..., F+1, 4, 4]``: the
    translation along x and z and the yaw and pitch of each frame, each in units of the world's
    largest per-frame step."""
    return delta_to_params(relative_motion(c2w.double()))[..., list(MOVED)]


@torch.no_grad()
def estimator_motion_error(estimator: CameraEstimator, *, clips: int = 64,
                           seed: int = ERROR_DATA_SEED, **options: object) -> float:
    """Mean absolute error of the estimated per-frame camera motion (:func:`camera_motion`,
    step units) on ground-truth renders of the world; ``options`` go to ``sample_clips``."""
    data = sample_clips(clips, seed=batch_seed(seed, 0), **options)
    device = next((p.device for p in getattr(estimator, "parameters", list)()), None)
    frames = data.frames if device is None else data.frames.to(device)
    est = camera_motion(estimator(frames).cpu())
    return float((est - camera_motion(data.c2w)).abs().mean())


def motion_spread(motion: Tensor, error: float) -> float:
    """Within-group spread of candidate motions ``[G, F, 4]``: the standard deviation over
    the ``G`` candidates, averaged over frames and components, divided by ``error``."""
    if motion.dim() != 3 or motion.shape[0] < 2:
        raise ValueError(f"motion must be [G, F, 4] with G >= 2, got {tuple(motion.shape)}")
    if not error > 0:
        raise ValueError(f"error must be > 0, got {error}")
    return float(motion.std(dim=0).mean()) / error
