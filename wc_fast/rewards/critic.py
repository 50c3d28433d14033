"""Visual quality (VQ) scorers: frames -> one score per frame (the role of HPSv3).

Two embedded critics, small per-frame CNNs trained with a ranking loss. The ``reward`` critic
(RL's VQ reward) scores clean renders of the synthetic world above degraded ones (see
:mod:`wc_fast.rewards.degrade`). The ``eval`` critic (``python -m wc_fast.eval``'s VQ) is also
trained to score true renders above the base world model's generations of the same frames,
which the reward critic never saw and often scores above clean renders; like the two camera
estimators, the evaluation does not grade with the reward's own model. Scores are unbounded
reals; higher is better. A critic sees one frame at a time, so a clip's motion (or the lack of
it) cannot change its scores.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wc_fast.rewards.weights import load_model_files

CRITIC_ASSETS = {"reward": "critic", "eval": "critic_eval"}


@runtime_checkable
class VisualQualityScorer(Protocol):
    """``scorer(frames [n, T, C, H, W], prompt=None) -> scores [n, T]`` (higher is better)."""

    def __call__(self, frames: Tensor, prompt: str | None = None) -> Tensor: ...


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GELU())


class FrameCritic(nn.Module):
    """Per-frame quality network: ``[B, 3, H, W]`` -> ``[B]``. Full-resolution first layers see
    fine detail (sharpness, noise); the global average keeps only what kind of frame it is."""

    arch = "frame_cnn"

    def __init__(self, resolution: int = 32) -> None:
        super().__init__()
        self.resolution = resolution
        self.body = nn.Sequential(_conv(3, 24), _conv(24, 32), _conv(32, 48, 2),
                                  _conv(48, 64, 2), _conv(64, 64, 2))
        self.head = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x).mean((2, 3)))[:, 0]


class LearnedCritic(nn.Module):
    """The embedded VQ scorer: ``frames [n, T, C, H, W]`` in [-1, 1] -> ``[n, T]`` float32.

    ``prompt`` is accepted for protocol compatibility and ignored (the synthetic world has no
    text). Frames of another size are resized (bilinear) to the network's resolution.
    """

    def __init__(self, net: FrameCritic) -> None:
        super().__init__()
        self.net = net

    def forward(self, frames: Tensor, prompt: str | None = None) -> Tensor:
        if frames.dim() != 5:
            raise ValueError(f"frames must be [n, T, C, H, W], got {tuple(frames.shape)}")
        n, t = frames.shape[:2]
        x = frames.to(torch.float32).flatten(0, 1)
        res = self.net.resolution
        if x.shape[-2:] != (res, res):
            x = F.interpolate(x, size=(res, res), mode="bilinear", align_corners=False,
                              antialias=True)
        return self.net(x).unflatten(0, (n, t))


def build_critic(meta: dict) -> LearnedCritic:
    """An untrained critic of the architecture described by ``meta``."""
    if meta["arch"] != FrameCritic.arch:
        raise ValueError(f"unknown critic architecture {meta['arch']!r}")
    return LearnedCritic(FrameCritic(resolution=meta["resolution"]))


def load_critic(which: str = "reward", *, device: str | torch.device = "cpu") -> LearnedCritic:
    """The shipped embedded critic ``which`` (``reward`` or ``eval``), in eval mode, no
    gradients."""
    if which not in CRITIC_ASSETS:
        raise ValueError(f"which must be one of {sorted(CRITIC_ASSETS)}, got {which!r}")
    state, meta = load_model_files(CRITIC_ASSETS[which])
    model = build_critic(meta)
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.eval().to(device)
