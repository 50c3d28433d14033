"""A classical camera fit: per frame pair, a direct least-squares alignment, no learned weights.

Each consecutive pair of frames ``[n, T, 3, H, W]`` is aligned by Gauss-Newton on the
brightness-constancy residual of their luminance (coarse to fine over Gaussian blurs, a Cauchy
robust weight against occlusions), with the motion model of the world's actions: camera
translation along x and z, yaw and pitch (``c2w[i] = c2w[i-1] @ [Ry(yaw) Rx(pitch) | t]``).

Rotation moves the image independently of depth, but translation does not, and a monocular
fit cannot tell a sideways step past near things from a yaw without some idea of depth. So the
warp starts from the depth of a canonical room: a floor :data:`FLOOR_BELOW` below and a ceiling
:data:`CEILING_ABOVE` above the camera's start height and walls :data:`WALL_DISTANCE` away, seen
at the fitted path's current pitch and height (chained from a level first frame, as every
evaluation sequence starts). That prior tells a sideways step (the near floor and ceiling shift
far more than the far walls) from a yaw (every row shifts alike), and gives the translation its
scale. Each :data:`DEPTH_PATCH`-pixel patch then fits a log depth correction jointly with the
motion, held by a ridge towards the previous pair's corrections (a wall nearer than the
prior's is learned over a few frames). The prior's numbers are the world's room layout
(:mod:`wc_fast.world.scene`); the weights of the fit (:data:`WALL_DISTANCE`,
:data:`DEPTH_PRIOR_WEIGHT`, :data:`DEPTH_PATCH`) were chosen on true renders of seed 321,
which no evaluation set uses; no model's frames were looked at.
"""

from __future__ import annotations

import functools
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
MIN_CLEARANCE = 0.2  # the floor and ceiling stay at least this far from the fitted camera
DEPTH_PATCH = 8  # pixels per side of a patch sharing one depth correction
DEPTH_PRIOR_WEIGHT = 0.01  # ridge on the log depth corrections (normal-equation units)
MAX_LOG_DEPTH = 1.5  # a correction scales the prior depth by at most e^1.5 either way
BLUR_SIGMAS = (2.0, 1.0, 0.5)  # coarse to fine, pixels
ITERATIONS = 6  # Gauss-Newton steps per blur level
ROBUST_SCALE = 0.02  # Cauchy scale of the luminance residual (luminance in [0, 1])
_LUMA = (0.299, 0.587, 0.114)
# Parameter scales (tx, tz, yaw, pitch) that make the normal equations well conditioned, and
# the finite-difference steps of their Jacobian.
PARAM_SCALES = (TRANSLATION_STEP, TRANSLATION_STEP, ROTATION_STEP_DEG, ROTATION_STEP_DEG)
JACOBIAN_STEPS = (1e-3, 1e-3, 1e-2, 1e-2)


def luminance(frames: Tensor) -> Tensor:
    """``[..., 3, H, W]`` in [-1, 1] -> ``[..., H, W]`` float64 in [0, 1]."""
    if frames.dim() < 3 or frames.shape[-3] != 3:
        raise ValueError(f"frames must be [..., 3, H, W], got {tuple(frames.shape)}")
    weights = torch.tensor(_LUMA, dtype=torch.float64)
    return ((frames.double() + 1) / 2 * weights[:, None, None]).sum(-3)


@functools.lru_cache(maxsize=8)
def pixel_rays(size: int, fov_deg: float) -> tuple[Tensor, float]:
    """Pixel-centre rays ``[H, W, 3]`` with ``z = 1`` and the focal length in pixels (cached;
    read only)."""
    f = focal_length(size, fov_deg)
    c = (torch.arange(size, dtype=torch.float64) + 0.5 - size / 2) / f
    y, x = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([x, y, torch.ones_like(x)], -1), f


def prior_depth(size: int, pitch_deg: Tensor, height: Tensor,
                fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """Depth (camera z) of the canonical room seen at pitch ``[P]`` (degrees, up +) from
    ``height`` ``[P]`` (world y of the camera relative to its start, down +) -> ``[P, H, W]``:
    the nearest of floor, ceiling and walls along each pixel's ray."""
    rays, _ = pixel_rays(size, fov_deg)
    d = torch.einsum("pij,hwj->phwi", rot_x(pitch_deg.double()), rays)
    far = torch.full_like(d[..., 1], 1e9)
    below = (FLOOR_BELOW - height.double()).clamp_min(MIN_CLEARANCE)[:, None, None]
    above = (CEILING_ABOVE + height.double()).clamp_min(MIN_CLEARANCE)[:, None, None]
    floor = torch.where(d[..., 1] > 1e-6, below / d[..., 1].clamp_min(1e-6), far)
    ceiling = torch.where(d[..., 1] < -1e-6, above / (-d[..., 1]).clamp_min(1e-6), far)
    walls = WALL_DISTANCE / d[..., [0, 2]].norm(dim=-1).clamp_min(1e-6)
    return torch.minimum(torch.minimum(floor, ceiling), walls)


def motion_matrix(params: Tensor) -> Tensor:
    """``[P, 4]`` (tx, tz, yaw deg, pitch deg) -> relative pose ``[P, 4, 4]`` float64."""
    params = params.double()
    delta = torch.zeros(params.shape[0], 4, 4, dtype=torch.float64)
    delta[:, :3, :3] = rot_y(params[:, 2]) @ rot_x(params[:, 3])
    delta[:, 0, 3], delta[:, 2, 3], delta[:, 3, 3] = params[:, 0], params[:, 1], 1.0
    return delta


def project(delta: Tensor, depth: Tensor, fov_deg: float) -> Tensor:
    """Where each pixel of the first frame lands in the second, ``[P, H, W, 2]`` (pixels from
    the image centre), for the second camera's pose in the first's frame ``delta``
    ``[P, 4, 4]`` (``c2w_first^-1 @ c2w_second``) and the first frame's depth (camera z)
    ``[P, H, W]``."""
    rays, f = pixel_rays(depth.shape[-1], fov_deg)
    points = depth[..., None] * rays - delta[:, None, None, :3, 3]
    moved = torch.einsum("pji,phwj->phwi", delta[:, :3, :3], points)  # R^T (P - t)
    return f * moved[..., :2] / moved[..., 2:3].clamp_min(1e-3)


def _project(params: Tensor, depth: Tensor, fov_deg: float) -> Tensor:
    """:func:`project` of the motion ``params`` ``[P, 4]`` (:func:`motion_matrix`)."""
    return project(motion_matrix(params), depth, fov_deg)


def _blur(img: Tensor, sigma: float) -> Tensor:
    """Separable Gaussian blur of ``[P, H, W]`` (replicated borders)."""
    k = math.ceil(3 * sigma)
    x = torch.arange(-k, k + 1, dtype=img.dtype)
    g = torch.exp(-x**2 / (2 * sigma**2))
    g = g / g.sum()
    out = F.pad(img[:, None], (k, k, k, k), mode="replicate")
    out = F.conv2d(F.conv2d(out, g.view(1, 1, 1, -1)), g.view(1, 1, -1, 1))
    return out[:, 0]


def gradients(img: Tensor) -> tuple[Tensor, Tensor]:
    """Central differences of ``[P, H, W]`` (zero on the border)."""
    gx, gy = torch.zeros_like(img), torch.zeros_like(img)
    gx[:, :, 1:-1] = (img[:, :, 2:] - img[:, :, :-2]) / 2
    gy[:, 1:-1] = (img[:, 2:] - img[:, :-2]) / 2
    return gx, gy


def sample(img: Tensor, coords: Tensor) -> tuple[Tensor, Tensor]:
    """Bilinear ``img`` ``[P, H, W]`` (or ``[P, C, H, W]``) at ``coords`` ``[P, H, W, 2]``
    (pixels from the centre, x then y; border values outside) and whether each lands inside
    the image ``[P, H, W]``."""
    grid = coords / (img.shape[-1] / 2)
    values = F.grid_sample(img if img.dim() == 4 else img[:, None], grid, mode="bilinear",
                           padding_mode="border", align_corners=False)
    return (values if img.dim() == 4 else values[:, 0]), (grid.abs() < 1 - 1 / img.shape[-1]
                                                          ).all(-1)


def _patch_index(size: int) -> Tensor:
    """``[H, W]``: the depth patch (:data:`DEPTH_PATCH` pixels square, row-major) of each pixel."""
    per_row = size // DEPTH_PATCH
    rows = torch.arange(size) // DEPTH_PATCH
    return rows[:, None] * per_row + rows[None, :]


def fit_pairs(prev: Tensor, cur: Tensor, pitch_deg: Tensor, height: Tensor,
              log_depth: Tensor | None = None,
              fov_deg: float = DEFAULT_FOV_DEG) -> tuple[Tensor, Tensor]:
    """Motion ``[P, 4]`` (tx, tz, yaw deg, pitch deg) from luminance ``prev`` to ``cur``
    ``[P, H, W]``, the camera at pitch ``pitch_deg`` and height ``height`` ``[P]`` (see
    :func:`prior_depth`) in the first of each pair, and the fitted log depth correction of each
    patch ``[P, K]``. The corrections are pulled (weight :data:`DEPTH_PRIOR_WEIGHT`) towards
    ``log_depth`` (the previous pair's; zeros, the bare room prior, when None)."""
    n, size = prev.shape[0], prev.shape[-1]
    if size % DEPTH_PATCH:
        raise ValueError(f"frames must be a multiple of {DEPTH_PATCH} pixels wide, got {size}")
    room = prior_depth(size, pitch_deg, height, fov_deg)
    patch = _patch_index(size)
    patches = int(patch.max()) + 1
    spread = F.one_hot(patch.reshape(-1), patches).double()  # [H*W, K]
    centre = torch.zeros(n, patches, dtype=torch.float64) if log_depth is None else log_depth
    ridge = torch.diag(torch.cat([torch.full((4,), 1e-9, dtype=torch.float64),
                                  torch.full((patches,), DEPTH_PRIOR_WEIGHT,
                                             dtype=torch.float64)]))
    scales = torch.tensor(PARAM_SCALES, dtype=torch.float64)
    params = torch.zeros(n, 4, dtype=torch.float64)
    correction = centre.clone()
    border = torch.zeros(size, size, dtype=torch.float64)
    border[1:-1, 1:-1] = 1.0
    eye = torch.eye(4, dtype=torch.float64)
    for sigma in BLUR_SIGMAS:
        a, b = _blur(prev.double(), sigma), _blur(cur.double(), sigma)
        gxa, gya = gradients(a)
        for _ in range(ITERATIONS):
            depth = room * torch.exp(correction[:, patch])
            base = _project(params, depth, fov_deg)
            motion_jac = torch.stack([(_project(params + eye[k] * h, depth, fov_deg) - base) / h
                                      for k, h in enumerate(JACOBIAN_STEPS)], -1)
            depth_jac = (_project(params, depth * 1.01, fov_deg) - base) / 0.01
            warped, inside = sample(b, base)
            gxb, gyb = gradients(warped)
            gx, gy = (gxa + gxb) / 2, (gya + gyb) / 2
            residual = (warped - a).reshape(n, -1)
            motion_rows = (gx[..., None] * motion_jac[..., 0, :]
                           + gy[..., None] * motion_jac[..., 1, :]) * scales
            depth_rows = (gx * depth_jac[..., 0] + gy * depth_jac[..., 1]).reshape(n, -1, 1)
            rows = torch.cat([motion_rows.reshape(n, -1, 4), depth_rows * spread], -1)
            weight = (inside * border).reshape(n, -1) / (1 + (residual / ROBUST_SCALE) ** 2)
            normal = (rows * weight[..., None]).transpose(1, 2) @ rows + ridge
            rhs = (rows * (weight * residual)[..., None]).sum(1)
            rhs[:, 4:] += DEPTH_PRIOR_WEIGHT * (correction - centre)
            step = torch.linalg.solve(normal, rhs)
            params = params - step[:, :4] * scales
            correction = (correction - step[:, 4:]).clamp(-MAX_LOG_DEPTH, MAX_LOG_DEPTH)
    return params, correction


def fit_path(frames: Tensor, fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """The fitted camera path of sequences ``[n, T, 3, H, W]`` -> c2w ``[n, T, 4, 4]`` float64,
    first pose the identity (a level camera at the start height), each next one chained by
    :func:`fit_pairs` with the room prior seen at the path's current pitch and height (forward
    steps of a tilted camera change its height) and the previous pair's depth corrections."""
    if frames.dim() != 5 or frames.shape[1] < 2:
        raise ValueError(f"frames must be [n, T, 3, H, W] with T >= 2, got "
                         f"{tuple(frames.shape)}")
    lum = luminance(frames)
    n = lum.shape[0]
    poses = [torch.eye(4, dtype=torch.float64).expand(n, 4, 4)]
    log_depth = None
    for i in range(lum.shape[1] - 1):
        pitch = torch.rad2deg(torch.asin((-poses[-1][:, 1, 2]).clamp(-1.0, 1.0)))
        motion, log_depth = fit_pairs(lum[:, i], lum[:, i + 1], pitch, poses[-1][:, 1, 3],
                                      log_depth, fov_deg)
        poses.append(poses[-1] @ motion_matrix(motion))
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
