"""The embedded synthetic world: procedural rooms, a torch ray caster and camera trajectories.

Conventions (docs/design.md sections 3 and 5): OpenCV camera frame (+x right, +y down, +z forward),
camera-to-world poses, frames ``[B, F, C, H, W]`` in [-1, 1]. The action of new frame ``i`` is
the camera-frame motion from frame ``i-1``: ``c2w[i] = c2w[i-1] @ delta(action)``, with fixed
per-frame steps :data:`TRANSLATION_STEP` (units) and :data:`ROTATION_STEP_DEG` (degrees).
"""

from wc_fast.world.dataset import (
    ClipDataset,
    Clips,
    batch_seed,
    iter_clips,
    sample_clips,
    sample_sequences,
    sequence_scenes,
)
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, action_deltas
from wc_fast.world.render import DEFAULT_FOV_DEG, render
from wc_fast.world.scene import Scenes, sample_scenes, start_poses
from wc_fast.world.trajectory import Trajectory, generate

__all__ = [
    "ClipDataset", "Clips", "DEFAULT_FOV_DEG", "ROTATION_STEP_DEG", "Scenes", "TRANSLATION_STEP",
    "Trajectory", "action_deltas", "batch_seed", "generate", "iter_clips", "render",
    "sample_clips", "sample_scenes", "sample_sequences", "sequence_scenes", "start_poses",
]
