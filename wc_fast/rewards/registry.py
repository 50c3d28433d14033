"""The reward of an RL run, chosen by name in its config (section ``reward``): the camera
reader (``reward.if_reader``) and the IF score of its paths (``reward.if_kind``), the VQ
critic (``reward.critic``). :func:`build` is the one entry point; the trainer calls what it
returns and never asks which reward it holds.

The names are the ``Literal`` choices of the config's schema (validated before a run starts);
each maps here to its implementation, and a test keeps the two in step. A reward this table
does not hold (another estimator, a test's fake) reaches the trainer as its ``rewards``
argument, a :class:`RewardModels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from safetensors import SafetensorError
from torch import Tensor

from wc_fast.actions import split_action
from wc_fast.config import Config, RewardConfig
from wc_fast.rewards.adapters import DepthAnything3Estimator, HPSv3Scorer
from wc_fast.rewards.camera_fit import fit_path
from wc_fast.rewards.critic import VisualQualityScorer, load_critic
from wc_fast.rewards.estimators import CameraEstimator, load_estimator, load_estimator_file
from wc_fast.rewards.interaction import action_accuracy, interaction_score, trajectory_score
from wc_fast.rewards.motion_spread import soft_interaction_score
from wc_fast.rewards.render_reader import press_track
from wc_fast.rewards.scoring import camera_poses, vq_scores
from wc_fast.world import sequence_scenes


class ScoredGroup(Protocol):
    """What a reward reads of one group besides its frames (a ``GroupRollout``)."""

    clip_actions: Tensor  # [F] the commanded action ids of the clip's new frames
    clip_index: int  # 1 for the first clip after the prompt
    prompt_seed: int | None  # the seed its world and prompt were drawn from, when known


@dataclass(slots=True)
class RewardModels:
    """The IF camera estimator (frames ``[n, F+1, C, H, W]`` -> c2w ``[n, F+1, 4, 4]``) and
    the VQ critic (frames -> scores ``[n, F']``) of a run."""

    estimator: CameraEstimator
    critic: VisualQualityScorer


def _device_name(device: torch.device | str) -> str:
    return str(torch.device(device))


def _estimator_file(path: str, device: torch.device | str) -> CameraEstimator:
    """The estimator file ``reward.reader_checkpoint`` names; ValueError naming the field when
    it is missing or holds no estimator."""
    try:
        return load_estimator_file(path, device=device)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, SafetensorError) as err:
        raise ValueError(f"reward.reader_checkpoint {path!r} is not a readable estimator file "
                         f"(NAME.safetensors with NAME.json beside it, as python -m "
                         f"wc_fast.tools.train_reward_models --out writes): {err}") from err


def _estimator(rw: RewardConfig, device: torch.device | str) -> CameraEstimator:
    if rw.if_reader == "depth_anything_3":
        return DepthAnything3Estimator(rw.reader_checkpoint, device=_device_name(device))
    if rw.reader_checkpoint:
        return _estimator_file(rw.reader_checkpoint, device)
    return load_estimator("reward", device=device)


# reward.critic -> (reward section, device) -> the VQ critic
CRITICS: dict[str, Callable[[RewardConfig, torch.device | str], VisualQualityScorer]] = {
    "reward": lambda rw, device: load_critic("reward", device=device),
    "eval": lambda rw, device: load_critic("eval", device=device),
    "hpsv3": lambda rw, device: HPSv3Scorer(rw.critic_checkpoint, device=_device_name(device)),
}


def build_reward_models(cfg: Config, device: torch.device | str = "cpu") -> RewardModels:
    """The estimator (Depth Anything 3 with ``reward.if_reader depth_anything_3``, else the
    estimator file ``reward.reader_checkpoint`` when set, else the embedded reward estimator)
    and the ``reward.critic`` critic, on ``device``."""
    return RewardModels(estimator=_estimator(cfg.reward, device),
                        critic=CRITICS[cfg.reward.critic](cfg.reward, device))


def _estimated(models: RewardModels, group: ScoredGroup, frames: Tensor) -> Tensor:
    return camera_poses(models.estimator, frames)


def _fitted(models: RewardModels, group: ScoredGroup, frames: Tensor) -> Tensor:
    return fit_path(frames.detach().float().cpu()).to(frames.device)


def _rendered(models: RewardModels, group: ScoredGroup, frames: Tensor) -> Tensor:
    """A clip-1 group's paths read by re-rendering its world: the scene and the prompt's pose
    are redrawn from the group's prompt seed."""
    if group.prompt_seed is None or group.clip_index != 1:
        raise ValueError("reward.if_reader render reads clip 1 of a group whose prompt "
                         f"seed is known; got clip {group.clip_index}, seed "
                         f"{group.prompt_seed}")
    scenes, start = sequence_scenes(group.prompt_seed, 1)
    g = frames.shape[0]
    c2w = press_track(scenes.index(torch.zeros(g, dtype=torch.long)),
                      start.expand(g, 4, 4), frames.detach().float().cpu())
    return c2w.to(frames.device)


# reward.if_reader -> (models, group, frames [G, F+1, C, H, W]) -> camera paths [G, F+1, 4, 4]
READERS: dict[str, Callable[[RewardModels, ScoredGroup, Tensor], Tensor]] = {
    "estimator": _estimated, "depth_anything_3": _estimated, "render": _rendered,
    "fit": _fitted,
}
# reward.if_reader names that read with several readers, and how their IF scores [R, G]
# combine into one [G]: agreement the lowest (credit only as far as they agree), ensemble the
# mean; the first reader's paths are the group's (motion spread, reader gap)
JOINT_READERS: dict[str, tuple[tuple[str, ...], Callable[[Tensor], Tensor]]] = {
    "agreement": (("estimator", "fit"), lambda scores: scores.amin(0)),
    "ensemble": (("estimator", "fit"), lambda scores: scores.mean(0)),
}


def _only(scores: Tensor) -> Tensor:
    """The IF of a single reader, ``[1, G]`` -> ``[G]``."""
    return scores[0]


def _by_labels(score: Callable[..., Tensor], c2w: Tensor, actions: Tensor,
               rw: RewardConfig) -> Tensor:
    trans_gt, rot_gt = split_action(actions.to(c2w.device))
    return score(c2w, trans_gt, rot_gt, trans_thresholds=rw.trans_thresholds,
                 rot_threshold_deg=rw.rot_threshold_deg)


def _label(c2w: Tensor, actions: Tensor, rw: RewardConfig) -> Tensor:
    return _by_labels(interaction_score, c2w, actions, rw)


def _action(c2w: Tensor, actions: Tensor, rw: RewardConfig) -> Tensor:
    return _by_labels(action_accuracy, c2w, actions, rw)


def _soft(c2w: Tensor, actions: Tensor, rw: RewardConfig) -> Tensor:
    return soft_interaction_score(c2w.double(), actions, trans_threshold=min(rw.trans_thresholds),
                                  rot_threshold_deg=rw.rot_threshold_deg)


def _trajectory(c2w: Tensor, actions: Tensor, rw: RewardConfig) -> Tensor:
    a, b = rw.trajectory_weights
    return trajectory_score(c2w.double(), actions.to(c2w.device), translation_weight=a,
                            rotation_weight=b)


# reward.if_kind -> (paths [G, F+1, 4, 4], commanded actions [F], reward section) -> IF [G]
IF_SCORES: dict[str, Callable[[Tensor, Tensor, RewardConfig], Tensor]] = {
    "label": _label, "soft": _soft, "action": _action, "trajectory": _trajectory,
}


@dataclass(slots=True)
class GroupScores:
    """One group's rewards: IF and VQ per candidate ``[G]``, the camera paths the IF read
    ``[G, F+1, 4, 4]`` (the first reader's) and, when the camera fit was one of the readers,
    its paths (for the reader gap, which then needs no second fit)."""

    s_if: Tensor
    s_vq: Tensor
    c2w: Tensor
    fitted: Tensor | None = None


@dataclass(slots=True)
class Reward:
    """A run's reward function: ``reward(group, frames)`` scores a group's decoded reward
    frames ``[G, F+1, C, H, W]`` (the clip's context frame first)."""

    cfg: RewardConfig
    models: RewardModels

    def __call__(self, group: ScoredGroup, frames: Tensor) -> GroupScores:
        rw = self.cfg
        names, combine = JOINT_READERS.get(rw.if_reader, ((rw.if_reader,), _only))
        paths = {name: READERS[name](self.models, group, frames) for name in names}
        c2w = paths[names[0]]
        s_if = combine(torch.stack([IF_SCORES[rw.if_kind](p, group.clip_actions, rw)
                                    .to(c2w.device) for p in paths.values()]))
        s_vq = vq_scores(self.models.critic, frames, stride=rw.vq_stride, mode=rw.vq_mode)
        return GroupScores(s_if=s_if, s_vq=s_vq, c2w=c2w, fitted=paths.get("fit"))

    def reader_gap(self, group: ScoredGroup, frames: Tensor, scores: GroupScores) -> float:
        """Mean over the group's candidates of the label IF of the reward's paths
        (``scores.c2w``) minus that of the classical camera fit of the same ``frames`` (the
        fit the reward made, when it made one): reward the policy gets from its reader alone."""
        rw = self.cfg
        fitted = (scores.fitted if scores.fitted is not None
                  else fit_path(frames.detach().float().cpu()))
        reads = [_label(path.double().cpu(), group.clip_actions.cpu(), rw)
                 for path in (scores.c2w, fitted)]
        return float((reads[0] - reads[1]).mean())


def build(cfg: Config, device: torch.device | str = "cpu",
          models: RewardModels | None = None) -> Reward:
    """The reward function ``cfg.reward`` names, its models built on ``device`` unless given."""
    rw = cfg.reward
    for path, name, table in (("reward.if_reader", rw.if_reader, READERS | JOINT_READERS),
                              ("reward.if_kind", rw.if_kind, IF_SCORES),
                              ("reward.critic", rw.critic, CRITICS)):
        if name not in table:
            raise ValueError(f"{path} must be one of {tuple(table)}, got {name!r}")
    return Reward(cfg=rw, models=build_reward_models(cfg, device) if models is None else models)
