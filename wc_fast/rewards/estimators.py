"""Camera estimators: frames -> per-frame camera-to-world poses (the IF reward's 3D model).

Two embedded learned estimators stand in for a 3D foundation model on the synthetic world. Both
estimate the relative pose of each consecutive frame pair and chain the results from the
identity, so ``c2w[0] = I`` and ``c2w[i] = c2w[i-1] @ delta_i``:

- ``"reward"``: a :class:`PyramidCorrelationNet` on RGB frames, a wide fine cost volume (radius
  3 at half resolution) and a narrow coarse one (radius 2 at quarter resolution); used by the IF
  reward during training.
- ``"eval"``: a :class:`PyramidCorrelationNet` on luminance and its gradients (it never sees
  colour), a narrow fine volume (radius 2) and a wide coarse one (radius 3); trained from another
  seed on other data (more composites), used for evaluation so that evaluation is not the
  training reward grading itself.

A pair's pose is 6 numbers ``(tx, ty, tz) / TRANSLATION_STEP`` and ``(yaw, pitch, roll) /
ROTATION_STEP_DEG``, with ``R = Ry(yaw) @ Rx(pitch) @ Rz(roll)`` (the order in which
:mod:`wc_fast.world.motion` composes actions, so an action's target is exact). The four that
actions move (tx, tz, yaw, pitch) are each read as a soft choice among one step back, none and
one step forward: the network gives three logits and the estimate is the expected step
``p(+1) - p(-1)``, a continuous value. Training targets are the true relative motion, whose
speed varies from key press to key press, as the two-hot mix of the neighbouring choices (0.7
of a step forward is ``p(0) = 0.3, p(+1) = 0.7``), so the estimate measures how far the camera
moved, not only which way; ty and roll, which actions never change, are regressed directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wc_fast.rewards.weights import load_model_files
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, rot_x, rot_y

ESTIMATOR_ASSETS = {"reward": "camera_reward", "eval": "camera_eval"}
STEP_PARAMS = (0, 2, 3, 4)  # tx, tz, yaw, pitch: soft choice among -1, 0, +1 steps
FREE_PARAMS = (1, 5)  # ty, roll: regressed
RAW_OUTPUTS = 3 * len(STEP_PARAMS) + len(FREE_PARAMS)


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


def decode_pose(raw: Tensor) -> Tensor:
    """Network outputs ``[..., 14]`` -> normalized pose parameters ``[..., 6]``."""
    probs = raw[..., : 3 * len(STEP_PARAMS)].unflatten(-1, (len(STEP_PARAMS), 3)).softmax(-1)
    params = torch.zeros(*raw.shape[:-1], 6, dtype=raw.dtype, device=raw.device)
    params[..., list(STEP_PARAMS)] = probs[..., 2] - probs[..., 0]
    params[..., list(FREE_PARAMS)] = raw[..., 3 * len(STEP_PARAMS):]
    return params


def step_probabilities(steps: Tensor) -> Tensor:
    """Two-hot targets ``[..., 3]`` (back, none, forward) of step values ``[...]`` in [-1, 1]:
    their expected step ``p(+1) - p(-1)`` is the value itself."""
    steps = steps.clamp(-1.0, 1.0)
    back, forward = (-steps).clamp_min(0.0), steps.clamp_min(0.0)
    return torch.stack([back, 1.0 - back - forward, forward], dim=-1)


def pose_loss(raw: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of the step choices (against two-hot targets) plus squared error of ty
    and roll.

    ``raw`` ``[..., 14]`` network outputs, ``target`` ``[..., 6]`` normalized parameters whose
    step parameters lie in [-1, 1].
    """
    logits = raw[..., : 3 * len(STEP_PARAMS)].reshape(-1, 3)
    probs = step_probabilities(target[..., list(STEP_PARAMS)]).reshape(-1, 3)
    free = raw[..., 3 * len(STEP_PARAMS):]
    return F.cross_entropy(logits, probs) + F.mse_loss(free, target[..., list(FREE_PARAMS)])


def delta_to_params(delta: Tensor, *, translation_step: float = TRANSLATION_STEP,
                    rotation_step_deg: float = ROTATION_STEP_DEG) -> Tensor:
    """Relative poses ``[..., 4, 4]`` with ``R = Ry(yaw) @ Rx(pitch)`` (no roll, as every
    motion of the world) -> normalized pose parameters ``[..., 6]``: the inverse of
    :func:`params_to_delta` for such poses."""
    r = delta[..., :3, :3]
    pitch = torch.rad2deg(torch.atan2(r[..., 2, 1], r[..., 2, 2]))
    yaw = torch.rad2deg(torch.atan2(-r[..., 2, 0], torch.hypot(r[..., 0, 0], r[..., 1, 0])))
    angles = torch.stack([yaw, pitch, torch.zeros_like(yaw)], dim=-1) / rotation_step_deg
    return torch.cat([delta[..., :3, 3] / translation_step, angles], dim=-1)


def chain_from_identity(delta: Tensor) -> Tensor:
    """``[n, F, 4, 4]`` relative poses -> ``[n, F+1, 4, 4]`` poses chained from the identity."""
    eye = torch.eye(4, dtype=delta.dtype, device=delta.device).expand(delta.shape[0], 4, 4)
    poses = [eye]
    for i in range(delta.shape[1]):
        poses.append(poses[-1] @ delta[:, i])
    return torch.stack(poses, 1)


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.GELU())


def _pose_head(channels: int, spatial: int) -> nn.Sequential:
    """Spatial features ``[B, channels, s, s]`` -> raw pose outputs (keeps where things are)."""
    return nn.Sequential(nn.Conv2d(channels, 32, 1), nn.GELU(), nn.Flatten(),
                         nn.Linear(32 * spatial * spatial, 128), nn.GELU(),
                         nn.Linear(128, RAW_OUTPUTS))


def correlation(a: Tensor, b: Tensor, radius: int) -> Tensor:
    """Local cost volume: ``[B, C, h, w]`` x2 -> ``[B, (2r+1)^2, h, w]``, tap ``(dy, dx)`` being
    the channel sum of ``a * b`` shifted by ``(dy - r, dx - r)`` (zero outside the image)."""
    padded = F.pad(b, (radius, radius, radius, radius))
    h, w = a.shape[-2:]
    taps = [(a * padded[..., dy:dy + h, dx:dx + w]).sum(1)
            for dy in range(2 * radius + 1) for dx in range(2 * radius + 1)]
    return torch.stack(taps, 1)


class PyramidCorrelationNet(nn.Module):
    """Pair network ``(prev, cur)`` ``[B, 3, 32, 32]`` each -> raw pose outputs ``[B, 14]``.

    Siamese features at half and quarter resolution; at each scale a cost volume of unit-length
    matching features (cosine similarities) over displacements up to the scale's radius; a CNN
    head merges them coarse-to-fine with the first frame's features. ``colour`` selects the
    input: RGB, or luminance and its x/y gradients (no colour at all).
    """

    arch = "pyramid_correlation"

    def __init__(self, resolution: int = 32, *, colour: bool = False, fine_radius: int = 2,
                 coarse_radius: int = 3) -> None:
        super().__init__()
        self.resolution, self.colour = resolution, colour
        self.fine_radius, self.coarse_radius = fine_radius, coarse_radius
        self.fine = nn.Sequential(_conv(3, 16), _conv(16, 24, 2))
        self.coarse = _conv(24, 32, 2)
        self.match_fine, self.match_coarse = nn.Conv2d(24, 8, 1), nn.Conv2d(32, 16, 1)
        self.fine_body = _conv((2 * fine_radius + 1) ** 2 + 24, 48, 2)
        self.body = _conv(48 + (2 * coarse_radius + 1) ** 2 + 32, 64, 2)
        self.head = _pose_head(64, resolution // 8)

    @staticmethod
    def luma_gradients(x: Tensor) -> Tensor:
        """RGB ``[B, 3, H, W]`` -> luminance, d/dx, d/dy ``[B, 3, H, W]``."""
        luma = (x * x.new_tensor([0.299, 0.587, 0.114])[:, None, None]).sum(1, keepdim=True)
        padded = F.pad(luma, (1, 1, 1, 1), mode="replicate")
        dx = (padded[..., 1:-1, 2:] - padded[..., 1:-1, :-2]) / 2
        dy = (padded[..., 2:, 1:-1] - padded[..., :-2, 1:-1]) / 2
        return torch.cat([luma, dx, dy], 1)

    def forward(self, prev: Tensor, cur: Tensor) -> Tensor:
        n = prev.shape[0]
        x = torch.cat([prev, cur])
        fine = self.fine(x if self.colour else self.luma_gradients(x))
        coarse = self.coarse(fine)
        f_prev, f_cur = F.normalize(self.match_fine(fine), dim=1).chunk(2)
        c_prev, c_cur = F.normalize(self.match_coarse(coarse), dim=1).chunk(2)
        h = self.fine_body(torch.cat([correlation(f_prev, f_cur, self.fine_radius), fine[:n]], 1))
        h = self.body(torch.cat([h, correlation(c_prev, c_cur, self.coarse_radius),
                                 coarse[:n]], 1))
        return self.head(h)


NETWORKS = {PyramidCorrelationNet.arch: PyramidCorrelationNet}


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

    def pair_outputs(self, frames: Tensor) -> Tensor:
        """Raw network outputs of every consecutive pair: ``[n, T-1, 14]``."""
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

    def pair_params(self, frames: Tensor) -> Tensor:
        """Normalized relative pose of every consecutive pair: ``[n, T-1, 6]``."""
        return decode_pose(self.pair_outputs(frames))

    def forward(self, frames: Tensor) -> Tensor:
        delta = params_to_delta(self.pair_params(frames), translation_step=self.translation_step,
                                rotation_step_deg=self.rotation_step_deg)
        return chain_from_identity(delta)


def build_estimator(meta: dict) -> LearnedEstimator:
    """An untrained estimator of the architecture described by ``meta``."""
    net = NETWORKS[meta["arch"]](resolution=meta["resolution"], **meta.get("options", {}))
    return LearnedEstimator(net, translation_step=meta["translation_step"],
                            rotation_step_deg=meta["rotation_step_deg"])


def _loaded(state: dict[str, Tensor], meta: dict, device: str | torch.device
            ) -> LearnedEstimator:
    model = build_estimator(meta)
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.eval().to(device)


def load_estimator(which: str = "reward", *, device: str | torch.device = "cpu"
                   ) -> LearnedEstimator:
    """The shipped embedded estimator ``"reward"`` or ``"eval"``, in eval mode, no gradients."""
    if which not in ESTIMATOR_ASSETS:
        raise ValueError(f"which must be one of {tuple(ESTIMATOR_ASSETS)}, got {which!r}")
    return _loaded(*load_model_files(ESTIMATOR_ASSETS[which]), device)


def load_estimator_file(path: str | Path, *, device: str | torch.device = "cpu"
                        ) -> LearnedEstimator:
    """An estimator written by ``python -m wc_fast.tools.train_reward_models --out``: its
    ``NAME.safetensors`` ``path`` (``NAME.json`` beside it), in eval mode, no gradients.
    Raises ``FileNotFoundError`` when either file is missing, ``ValueError``, ``KeyError`` or
    ``RuntimeError`` (or the weights reader's error) when they do not hold an estimator."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"an estimator file ends in .safetensors, got {path}")
    return _loaded(*load_model_files(path.stem, path.parent), device)
