"""A classical camera fit: per frame pair, a direct least-squares alignment, no learned weights.

Each consecutive pair of frames ``[n, T, 3, H, W]`` is aligned by Gauss-Newton on the
brightness-constancy residual of their luminance (coarse to fine over Gaussian blurs, a Cauchy
robust weight against occlusions), with the motion model of the world's actions: camera
translation along x and z, yaw and pitch (``c2w[i] = c2w[i-1] @ [Ry(yaw) Rx(pitch) | t]``).

Rotation moves the image independently of depth, but translation does not, and one camera at
32x32 cannot measure depth. So the warp assumes the depth of a canonical room: a floor
:data:`FLOOR_BELOW` below and a ceiling :data:`CEILING_ABOVE` above the camera and walls
:data:`WALL_DISTANCE` away, seen at the fitted path's current pitch (chained from a level first
frame, as every evaluation sequence starts). That prior is what tells a sideways step (the near
floor and ceiling shift far more than the far walls) from a yaw (every row shifts alike), and
what gives the translation its scale. The prior's numbers are the world's room layout
(:mod:`wc_fast.world.scene`), not fitted to any model's frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from wc_fast.rewards.interaction import relative_motion
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, rot_x, rot_y
from wc_fast.world.render import DEFAULT_FOV_DEG, focal_length

FLOOR_BELOW = 0.9  # the world's floor height below a camera at its start height
CEILING_ABOVE = 1.1
WALL_DISTANCE = 4.0  # a typical distance to the walls of a room 9 to 13 units wide
BLUR_SIGMAS = (2.0, 1.0, 0.5)  # coarse to fine, pixels
ITERATIONS = 6  # Gauss-Newton steps per blur level
ROBUST_SCALE = 0.02  # Cauchy scale of the luminance residual (luminance in [0, 1])
_LUMA = (0.299, 0.587, 0.114)
# Parameter scales (tx, tz, yaw, pitch) that make the normal equations well conditioned.
_SCALES = (TRANSLATION_STEP, TRANSLATION_STEP, ROTATION_STEP_DEG, ROTATION_STEP_DEG)
_JACOBIAN_STEP = (1e-3, 1e-3, 1e-2, 1e-2)


def luminance(frames: Tensor) -> Tensor:
    """``[..., 3, H, W]`` in [-1, 1] -> ``[..., H, W]`` float64 in [0, 1]."""
    if frames.dim() < 3 or frames.shape[-3] != 3:
        raise ValueError(f"frames must be [..., 3, H, W], got {tuple(frames.shape)}")
    weights = torch.tensor(_LUMA, dtype=torch.float64)
    return ((frames.double() + 1) / 2 * weights[:, None, None]).sum(-3)


def _rays(size: int, fov_deg: float) -> tuple[Tensor, float]:
    """Pixel-centre rays ``[H, W, 3]`` with ``z = 1`` and the focal length in pixels."""
    f = focal_length(size, fov_deg)
    c = (torch.arange(size, dtype=torch.float64) + 0.5 - size / 2) / f
    y, x = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([x, y, torch.ones_like(x)], -1), f


def prior_depth(size: int, pitch_deg: Tensor, fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """Depth (camera z) of the canonical room seen at pitch ``[P]`` (degrees, up +) ->
    ``[P, H, W]``: the nearest of floor, ceiling and walls along each pixel's ray."""
    rays, _ = _rays(size, fov_deg)
    d = torch.einsum("pij,hwj->phwi", rot_x(pitch_deg.double()), rays)
    far = torch.full_like(d[..., 1], 1e9)
    floor = torch.where(d[..., 1] > 1e-6, FLOOR_BELOW / d[..., 1].clamp_min(1e-6), far)
    ceiling = torch.where(d[..., 1] < -1e-6, CEILING_ABOVE / (-d[..., 1]).clamp_min(1e-6), far)
    walls = WALL_DISTANCE / d[..., [0, 2]].norm(dim=-1).clamp_min(1e-6)
    return torch.minimum(torch.minimum(floor, ceiling), walls)


def motion_matrix(params: Tensor) -> Tensor:
    """``[P, 4]`` (tx, tz, yaw deg, pitch deg) -> relative pose ``[P, 4, 4]`` float64."""
    params = params.double()
    delta = torch.zeros(params.shape[0], 4, 4, dtype=torch.float64)
    delta[:, :3, :3] = rot_y(params[:, 2]) @ rot_x(params[:, 3])
    delta[:, 0, 3], delta[:, 2, 3], delta[:, 3, 3] = params[:, 0], params[:, 1], 1.0
    return delta


def _project(params: Tensor, depth: Tensor, fov_deg: float) -> Tensor:
    """Where each pixel of the first frame lands in the second, ``[P, H, W, 2]`` (pixels from
    the image centre), for motion ``params`` ``[P, 4]`` and depth ``[P, H, W]``."""
    rays, f = _rays(depth.shape[-1], fov_deg)
    delta = motion_matrix(params)
    points = depth[..., None] * rays - delta[:, None, None, :3, 3]
    moved = torch.einsum("pji,phwj->phwi", delta[:, :3, :3], points)  # R^T (P - t)
    return f * moved[..., :2] / moved[..., 2:3].clamp_min(1e-3)


def _blur(img: Tensor, sigma: float) -> Tensor:
    """Separable Gaussian blur of ``[P, H, W]`` (replicated borders)."""
    k = math.ceil(3 * sigma)
    x = torch.arange(-k, k + 1, dtype=img.dtype)
    g = torch.exp(-x**2 / (2 * sigma**2))
    g = g / g.sum()
    out = F.pad(img[:, None], (k, k, k, k), mode="replicate")
    out = F.conv2d(F.conv2d(out, g.view(1, 1, 1, -1)), g.view(1, 1, -1, 1))
    return out[:, 0]


def _gradients(img: Tensor) -> tuple[Tensor, Tensor]:
    """Central differences of ``[P, H, W]`` (zero on the border)."""
    gx, gy = torch.zeros_like(img), torch.zeros_like(img)
    gx[:, :, 1:-1] = (img[:, :, 2:] - img[:, :, :-2]) / 2
    gy[:, 1:-1] = (img[:, 2:] - img[:, :-2]) / 2
    return gx, gy


def _sample(img: Tensor, coords: Tensor) -> tuple[Tensor, Tensor]:
    """Bilinear ``img`` ``[P, H, W]`` at ``coords`` ``[P, H, W, 2]`` (pixels from the centre)
    and whether each lands inside the image."""
    grid = coords / (img.shape[-1] / 2)
    values = F.grid_sample(img[:, None], grid, mode="bilinear", padding_mode="border",
                           align_corners=False)[:, 0]
    return values, (grid.abs() < 1 - 1 / img.shape[-1]).all(-1)


def fit_pairs(prev: Tensor, cur: Tensor, pitch_deg: Tensor,
              fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """Motion ``[P, 4]`` (tx, tz, yaw deg, pitch deg) from luminance ``prev`` to ``cur``
    ``[P, H, W]``, the camera at pitch ``pitch_deg`` ``[P]`` in the first of each pair."""
    n, size = prev.shape[0], prev.shape[-1]
    depth = prior_depth(size, pitch_deg, fov_deg)
    base = _project(torch.zeros(n, 4, dtype=torch.float64), depth, fov_deg)
    jac = torch.stack([(_project(torch.eye(4, dtype=torch.float64)[k].expand(n, 4) * h,
                                 depth, fov_deg) - base) / h
                       for k, h in enumerate(_JACOBIAN_STEP)], -1)  # [P, H, W, 2, 4]
    scales = torch.tensor(_SCALES, dtype=torch.float64)
    params = torch.zeros(n, 4, dtype=torch.float64)
    border = torch.zeros(size, size, dtype=torch.float64)
    border[1:-1, 1:-1] = 1.0
    for sigma in BLUR_SIGMAS:
        a, b = _blur(prev.double(), sigma), _blur(cur.double(), sigma)
        gxa, gya = _gradients(a)
        for _ in range(ITERATIONS):
            warped, inside = _sample(b, _project(params, depth, fov_deg))
            gxb, gyb = _gradients(warped)
            gx, gy = (gxa + gxb) / 2, (gya + gyb) / 2
            residual = (warped - a).reshape(n, -1)
            rows = (gx[..., None] * jac[..., 0, :] + gy[..., None] * jac[..., 1, :]) * scales
            rows = rows.reshape(n, -1, 4)
            weight = (inside * border).reshape(n, -1) / (1 + (residual / ROBUST_SCALE) ** 2)
            normal = (rows * weight[..., None]).transpose(1, 2) @ rows
            normal = normal + 1e-9 * torch.eye(4, dtype=torch.float64)
            rhs = (rows * (weight * residual)[..., None]).sum(1)
            params = params - torch.linalg.solve(normal, rhs) * scales
    return params


def fit_path(frames: Tensor, fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """The fitted camera path of sequences ``[n, T, 3, H, W]`` -> c2w ``[n, T, 4, 4]`` float64,
    first pose the identity (a level camera), each next one chained by :func:`fit_pairs`."""
    if frames.dim() != 5 or frames.shape[1] < 2:
        raise ValueError(f"frames must be [n, T, 3, H, W] with T >= 2, got "
                         f"{tuple(frames.shape)}")
    lum = luminance(frames)
    n = lum.shape[0]
    poses = [torch.eye(4, dtype=torch.float64).expand(n, 4, 4)]
    for i in range(lum.shape[1] - 1):
        pitch = torch.rad2deg(torch.asin((-poses[-1][:, 1, 2]).clamp(-1.0, 1.0)))
        poses.append(poses[-1] @ motion_matrix(fit_pairs(lum[:, i], lum[:, i + 1], pitch,
                                                         fov_deg)))
    return torch.stack(poses, 1)


def pose_errors(fitted: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """Per-frame relative pose errors of two paths ``[..., T, 4, 4]`` -> (rotation error in
    degrees, translation error in world units), each ``[..., T-1]``: the geodesic angle between
    the two frame-to-frame rotations and the distance between the two frame-to-frame
    translations (WorldPlay's RPE; no scale alignment, the fit carries the world's scale)."""
    if fitted.shape != reference.shape:
        raise ValueError(f"fitted and reference must have the same shape, got "
                         f"{tuple(fitted.shape)} and {tuple(reference.shape)}")
    a, b = relative_motion(fitted), relative_motion(reference)
    diff = b[..., :3, :3].transpose(-1, -2) @ a[..., :3, :3]
    cos = ((diff.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos)), (a[..., :3, 3] - b[..., :3, 3]).norm(dim=-1)
