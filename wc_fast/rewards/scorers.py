"""The reward models one RL run scores its candidates with, built from the config or handed
to the trainer (a test's fakes, another estimator)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wc_fast.config import Config
from wc_fast.rewards.critic import VisualQualityScorer, load_critic
from wc_fast.rewards.estimators import CameraEstimator, load_estimator


@dataclass(slots=True)
class RewardModels:
    """The IF camera estimator (frames ``[n, F+1, C, H, W]`` -> c2w ``[n, F+1, 4, 4]``) and
    the VQ critic (frames -> scores ``[n, F']``) of a run."""

    estimator: CameraEstimator
    critic: VisualQualityScorer


def build_reward_models(cfg: Config, device: torch.device | str = "cpu") -> RewardModels:
    """The embedded reward estimator and the ``reward.critic`` critic, on ``device``."""
    return RewardModels(estimator=load_estimator("reward", device=device),
                        critic=load_critic(cfg.reward.critic, device=device))
