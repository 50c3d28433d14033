"""Rewards: interaction following (IF) from camera poses and visual quality (VQ)."""

from wc_fast.rewards.interaction import interaction_score, poses_to_labels, relative_motion

__all__ = ["poses_to_labels", "interaction_score", "relative_motion"]
