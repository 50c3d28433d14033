"""Rewards: interaction following (IF) from camera paths and visual quality (VQ); a run's
reward is :func:`build` of its config (:mod:`wc_fast.rewards.registry`)."""

from wc_fast.rewards.critic import VisualQualityScorer, load_critic
from wc_fast.rewards.estimators import CameraEstimator, load_estimator
from wc_fast.rewards.interaction import (
    action_accuracy,
    interaction_score,
    poses_to_labels,
    relative_motion,
    trajectory_score,
)
from wc_fast.rewards.registry import Reward, RewardModels, build, build_reward_models
from wc_fast.rewards.scoring import if_scores, vq_scores

__all__ = [
    "poses_to_labels", "interaction_score", "action_accuracy", "trajectory_score",
    "relative_motion", "CameraEstimator", "Reward", "RewardModels", "build",
    "build_reward_models", "VisualQualityScorer", "load_estimator", "load_critic", "if_scores",
    "vq_scores",
]
