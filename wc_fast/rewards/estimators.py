"""Camera estimators: frames -> per-frame camera-to-world poses (the IF reward's 3D model).

Two embedded learned estimators stand in for a 3D foundation model on the synthetic world. Both
regress the relative pose of each consecutive frame pair and chain the results from the
identity, so ``c2w[0] = I`` and ``c2w[i] = c2w[i-1] @ delta_i``:

- ``"reward"`` (:class:`PairPoseNet`): a CNN over the stacked pair, its difference and pixel
  coordinates; used by the IF reward during training.
- ``"eval"`` (:class:`CorrelationPoseNet`): a siamese encoder, a local correlation (cost)
  volume between the two frames' features, then a CNN head; trained from another seed on other
  data, used for evaluation so that evaluation is not the training reward grading itself.

A pair's pose is 6 numbers ``(tx, ty, tz) / TRANSLATION_STEP`` and ``(yaw, pitch, roll) /
ROTATION_STEP_DEG``, with ``R = Ry(yaw) @ Rx(pitch) @ Rz(roll)`` (the order in which
:mod:`wc_fast.world.motion` composes actions, so an action's target is exact).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wc_fast.rewards.weights import load_model_files
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, rot_x, rot_y

ESTIMATOR_ASSETS = {"reward": "camera_reward", "eval": "camera_eval"}


@runtime_checkable
class CameraEstimator(Protocol):
    """``estimator(frames [n, T, C, H, W]) -> c2w [n, T, 4, 4]`` (first pose the identity)."""

    def __call__(self, frames: Tensor) -> Tensor: ...


def rot_z(deg: Tensor) -> Tensor:
    """Rotation about the camera +z axis (roll): ``[...]`` -> ``[..., 3, 3]``."""
    a = torch.deg2rad(deg)
    c, s, z, o = torch.cos(a), torch.sin(a), torch.zeros_like(a), torch.ones_like(a)
    return torch.stack([c, -s, z, s, c, z, z, z, o], dim=-1).unflatten(-1, (3, 3))


def params_to_delta(params: Tensor, *, translation_step: float = TRANSLATION_STEP,
                    rotation_step_deg: float = ROTATION_STEP_DEG) -> Tensor:
    """Normalized pose parameters ``[..., 6]`` -> relative poses ``[..., 4, 4]``."""
    angles = params[..., 3:] * rotation_step_deg
    delta = torch.zeros(*params.shape[:-1], 4, 4, dtype=params.dtype, device=params.device)
    delta[..., :3, :3] = rot_y(angles[..., 0]) @ rot_x(angles[..., 1]) @ rot_z(angles[..., 2])
    delta[..., :3, 3] = params[..., :3] * translation_step
    delta[..., 3, 3] = 1.0
    return delta


def chain_from_identity(delta: Tensor) -> Tensor:
    """``[n, F, 4, 4]`` relative poses -> ``[n, F+1, 4, 4]`` poses chained from the identity."""
    eye = torch.eye(4, dtype=delta.dtype, device=delta.device).expand(delta.shape[0], 4, 4)
    poses = [eye]
    for i in range(delta.shape[1]):
        poses.append(poses[-1] @ delta[:, i])
    return torch.stack(poses, 1)


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GELU())


def _pose_head(channels: int, spatial: int) -> nn.Sequential:
    """Spatial features ``[B, channels, s, s]`` -> 6 pose parameters (keeps where things are)."""
    return nn.Sequential(nn.Conv2d(channels, 32, 1), nn.GELU(), nn.Flatten(),
                         nn.Linear(32 * spatial * spatial, 128), nn.GELU(), nn.Linear(128, 6))


class PairPoseNet(nn.Module):
    """The reward estimator's pair network: ``(prev, cur)`` ``[B, 3, 32, 32]`` each -> ``[B, 6]``.

    Input channels: both frames, their difference and the two pixel coordinates (so the network
    can tell near floor pixels, low in the image, from far ones).
    """

    arch = "pair_cnn"

    def __init__(self, resolution: int = 32) -> None:
        super().__init__()
        self.resolution = resolution
        coord = torch.linspace(-1.0, 1.0, resolution)
        y, x = torch.meshgrid(coord, coord, indexing="ij")
        self.register_buffer("coords", torch.stack([x, y])[None], persistent=False)
        self.body = nn.Sequential(_conv(11, 24), _conv(24, 32, 2), _conv(32, 48, 2),
                                  _conv(48, 64, 2))
        self.head = _pose_head(64, resolution // 8)

    def forward(self, prev: Tensor, cur: Tensor) -> Tensor:
        coords = self.coords.expand(prev.shape[0], -1, -1, -1)
        return self.head(self.body(torch.cat([prev, cur, cur - prev, coords], 1)))


class CorrelationPoseNet(nn.Module):
    """The eval estimator's pair network: siamese features at half resolution, a correlation
    volume of unit-length matching features over displacements up to ``radius`` feature pixels,
    and a CNN head over the volume and the first frame's features -> ``[B, 6]``."""

    arch = "correlation"

    def __init__(self, resolution: int = 32, radius: int = 3) -> None:
        super().__init__()
        self.resolution, self.radius = resolution, radius
        self.encoder = nn.Sequential(_conv(3, 16), _conv(16, 24, 2))
        self.match = nn.Conv2d(24, 12, 1)
        taps = (2 * radius + 1) ** 2
        self.body = nn.Sequential(_conv(taps + 24, 48, 2), _conv(48, 64, 2))
        self.head = _pose_head(64, resolution // 8)

    def _correlation(self, a: Tensor, b: Tensor) -> Tensor:
        """``[B, C, h, w]`` x2 -> ``[B, (2r+1)^2, h, w]``: channel sum of ``a * shift(b)``."""
        r = self.radius
        padded = F.pad(b, (r, r, r, r))
        h, w = a.shape[-2:]
        taps = [(a * padded[..., dy:dy + h, dx:dx + w]).sum(1)
                for dy in range(2 * r + 1) for dx in range(2 * r + 1)]
        return torch.stack(taps, 1)

    def forward(self, prev: Tensor, cur: Tensor) -> Tensor:
        feats = self.encoder(torch.cat([prev, cur]))
        # Unit-length matching features: the volume holds cosine similarities in [-1, 1].
        m_prev, m_cur = F.normalize(self.match(feats), dim=1).chunk(2)
        volume = self._correlation(m_prev, m_cur)
        return self.head(self.body(torch.cat([volume, feats[: prev.shape[0]]], 1)))


NETWORKS = {PairPoseNet.arch: PairPoseNet, CorrelationPoseNet.arch: CorrelationPoseNet}


class LearnedEstimator(nn.Module):
    """A pair network applied to every consecutive pair of a clip, chained from the identity.

    ``frames`` ``[n, T, C, H, W]`` in [-1, 1] -> ``c2w`` ``[n, T, 4, 4]`` float32. Frames of
    another size are resized (bilinear) to the network's resolution first.
    """

    def __init__(self, net: nn.Module, *, translation_step: float = TRANSLATION_STEP,
                 rotation_step_deg: float = ROTATION_STEP_DEG) -> None:
        super().__init__()
        self.net = net
        self.translation_step, self.rotation_step_deg = translation_step, rotation_step_deg

    def pair_params(self, frames: Tensor) -> Tensor:
        """Normalized relative pose of every consecutive pair: ``[n, T-1, 6]``."""
        n, t = frames.shape[:2]
        if frames.dim() != 5 or t < 2:
            raise ValueError(f"frames must be [n, T, C, H, W] with T >= 2, got "
                             f"{tuple(frames.shape)}")
        x = frames.to(torch.float32)
        res = self.net.resolution
        if x.shape[-2:] != (res, res):
            x = F.interpolate(x.flatten(0, 1), size=(res, res), mode="bilinear",
                              align_corners=False, antialias=True).unflatten(0, (n, t))
        prev, cur = x[:, :-1].flatten(0, 1), x[:, 1:].flatten(0, 1)
        return self.net(prev, cur).unflatten(0, (n, t - 1))

    def forward(self, frames: Tensor) -> Tensor:
        delta = params_to_delta(self.pair_params(frames), translation_step=self.translation_step,
                                rotation_step_deg=self.rotation_step_deg)
        return chain_from_identity(delta)


def build_estimator(meta: dict) -> LearnedEstimator:
    """An untrained estimator of the architecture described by ``meta``."""
    net = NETWORKS[meta["arch"]](resolution=meta["resolution"])
    return LearnedEstimator(net, translation_step=meta["translation_step"],
                            rotation_step_deg=meta["rotation_step_deg"])


def load_estimator(which: str = "reward", *, device: str | torch.device = "cpu"
                   ) -> LearnedEstimator:
    """The shipped embedded estimator ``"reward"`` or ``"eval"``, in eval mode, no gradients."""
    if which not in ESTIMATOR_ASSETS:
        raise ValueError(f"which must be one of {tuple(ESTIMATOR_ASSETS)}, got {which!r}")
    state, meta = load_model_files(ESTIMATOR_ASSETS[which])
    model = build_estimator(meta)
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.eval().to(device)
