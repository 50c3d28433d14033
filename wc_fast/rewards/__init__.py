"""Rewards: interaction following (IF) from camera poses and visual quality (VQ)."""

from wc_fast.rewards.critic import VisualQualityScorer, load_critic
from wc_fast.rewards.estimators import CameraEstimator, load_estimator
from wc_fast.rewards.interaction import (
    action_accuracy,
    interaction_score,
    poses_to_labels,
    relative_motion,
    trajectory_score,
)
from wc_fast.rewards.scoring import if_scores, vq_scores

__all__ = [
    "poses_to_labels", "interaction_score", "action_accuracy", "trajectory_score",
    "relative_motion", "CameraEstimator",
    "VisualQualityScorer", "load_estimator", "load_critic", "if_scores", "vq_scores",
]
