"""A white-box reader of camera motion: the camera path that explains a warp model's own flow.

A ``prediction="warp"`` world model draws each frame of a clip as the clip's reference frame
warped by a predicted flow (:func:`wc_fast.models.tiny.dit.warp`), plus a residual. Knowing
the reference frame's true depth, a camera motion implies a flow; the motion whose implied
flow best matches the predicted one is what the model's geometry did, read without any
learned weights (a residual that paints motion the flow does not carry is invisible to this
reader). Every pixel of the flow counts alike, or as much as the frame's texture there
(:func:`texture_weights`: where the flow shows in the frame).

Conventions. Flow ``[B, F, 2, H, W]`` in pixels, channel 0 along x (right) and 1 along y
(down), a backward map: output pixel ``p`` of frame ``k`` samples the reference frame at
``p + flow[:, k, :, p]``, and frame ``k``'s flow is from the reference frame, not from frame
``k - 1``. Depth ``[B, H, W]``: the reference frame's camera z
(:func:`wc_fast.world.render.depth`); a non-finite or non-positive depth is a point at
infinity, which only rotation moves.
Motions (tx, tz, yaw deg, pitch deg) and poses as :mod:`wc_fast.rewards.camera_fit`:
``c2w[k] = c2w[k-1] @ motion_matrix(step_k)``, the reference's pose the identity.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wc_fast.actions import NUM_ACTIONS
from wc_fast.rewards.camera_fit import (
    JACOBIAN_STEPS,
    PARAM_SCALES,
    gradients,
    luminance,
    motion_matrix,
    pixel_rays,
    project,
    sample,
)
from wc_fast.world.motion import (
    ROTATION_STEP_DEG,
    SPEED_RANGE,
    TRANSLATION_STEP,
    action_components,
)
from wc_fast.world.render import DEFAULT_FOV_DEG
from wc_fast.world.render import depth as render_depth
from wc_fast.world.scene import Scenes

FAR_DEPTH = 1e9  # a point at infinity: translation moves it by under a billionth of a pixel
INVERSION_STEPS = 6  # Newton steps that turn the forward map into a backward flow
MAX_STEP_PX = 4.0  # the largest move of one Newton step, pixels along each axis
CONVERGED_PX = 0.05  # an inverted pixel lands within this of its target, else it is not used
ITERATIONS = 8  # Gauss-Newton steps per frame
REFINED = 3  # the candidate starts of least misfit that Gauss-Newton refines, per frame
DAMPING = 1e-3  # Levenberg-Marquardt damping, relative to the normal equations' diagonal
OUTLIER_COST = 4.0  # the Cauchy loss of an undefined pixel: a residual of about 7 scales
ROBUST_SCALE = 0.5  # Cauchy scale of the flow residual, pixels (occlusion edges)
ROBUST_START = 2.0  # the scale of the first Gauss-Newton step, halved each step after it


def _check(name: str, value: object, dims: int) -> Tensor:
    """``value`` as a floating tensor of ``dims`` dimensions, else TypeError / ValueError."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got "
                        f"{getattr(value, 'dtype', type(value).__name__)}")
    if value.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got {tuple(value.shape)}")
    return value


def _centres(size: int, fov_deg: float) -> Tensor:
    """Pixel centres ``[H, W, 2]`` (x, y) in pixels from the image centre, float64."""
    rays, f = pixel_rays(size, fov_deg)
    return rays[..., :2] * f


def _finite(depth: Tensor) -> Tensor:
    """``depth`` in float64 with every point at infinity (non-finite or <= 0) at
    :data:`FAR_DEPTH`."""
    depth = depth.double()
    return torch.where(torch.isfinite(depth) & (depth > 0), depth, torch.full_like(depth,
                                                                                 FAR_DEPTH))


def flow_from_target_depth(delta: Tensor, depth: Tensor,
                           fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """The exact backward flow ``[P, 2, H, W]`` (float64) of a frame whose camera is at
    ``delta`` ``[P, 4, 4]`` in the reference camera's frame, given that frame's OWN depth
    ``[P, H, W]``: each pixel's 3-D point moved into the reference camera and projected there.
    What a perfect warp model predicts, occlusions included (the ground truth of a render)."""
    _check("delta", delta, 3)
    _check("depth", depth, 3)
    if delta.shape[1:] != (4, 4) or delta.shape[0] != depth.shape[0]:
        raise ValueError(f"delta must be [P, 4, 4] with P = depth's {depth.shape[0]}, got "
                         f"{tuple(delta.shape)}")
    landed = project(torch.linalg.inv(delta.double()), _finite(depth), fov_deg)
    return (landed - _centres(depth.shape[-1], fov_deg)).permute(0, 3, 1, 2)


def implied_flow(delta: Tensor, depth: Tensor, fov_deg: float = DEFAULT_FOV_DEG
                 ) -> tuple[Tensor, Tensor]:
    """The backward flow ``[P, 2, H, W]`` (float64) that a camera at ``delta`` ``[P, 4, 4]``
    (in the reference camera's frame) implies, given the REFERENCE frame's depth
    ``[P, H, W]``, and where it is defined ``[P, H, W]`` (bool).

    Each reference pixel moves forward to :func:`~wc_fast.rewards.camera_fit.project`'s
    place; the backward flow of an output pixel is the reference place that lands on it,
    found by :data:`INVERSION_STEPS` Newton steps on the bilinearly sampled forward map and
    its derivatives.
    Undefined: output pixels that see something outside the reference frame, or whose
    inversion did not land within :data:`CONVERGED_PX` (occlusion edges)."""
    _check("delta", delta, 3)
    _check("depth", depth, 3)
    if delta.shape[1:] != (4, 4) or delta.shape[0] != depth.shape[0]:
        raise ValueError(f"delta must be [P, 4, 4] with P = depth's {depth.shape[0]}, got "
                         f"{tuple(delta.shape)}")
    centres = _centres(depth.shape[-1], fov_deg)
    forward = (project(delta.double(), _finite(depth), fov_deg) - centres).permute(0, 3, 1, 2)
    # the forward map's derivatives [P, 2 (x, y of the flow), 2 (along x, y), H, W]
    slopes = torch.stack(torch.gradient(forward, dim=(3, 2)), 2)
    field = torch.cat([forward, slopes.flatten(1, 2)], 1)
    source = centres.expand(depth.shape[0], -1, -1, -1)
    for _ in range(INVERSION_STEPS):
        values, _ = sample(field, source)
        values = values.permute(0, 2, 3, 1)
        miss = source + values[..., :2] - centres
        a, b, c, e = (values[..., k] for k in range(2, 6))  # d(fx, fy)/d(x, y)
        a, e = a + 1, e + 1
        det = a * e - b * c
        det = torch.where(det.abs() < 1e-6, torch.full_like(det, 1e-6), det)
        step = torch.stack([e * miss[..., 0] - b * miss[..., 1],
                            a * miss[..., 1] - c * miss[..., 0]], -1) / det[..., None]
        source = source - step.clamp(-MAX_STEP_PX, MAX_STEP_PX)
    moved, inside = sample(forward, source)
    miss = (source + moved.permute(0, 2, 3, 1) - centres).norm(dim=-1)
    return (source - centres).permute(0, 3, 1, 2), inside & (miss < CONVERGED_PX)


def _cost(flow: Tensor, depth: Tensor, pose: Tensor, weights: Tensor, fov_deg: float,
          scale: float) -> Tensor:
    """Robust misfit ``[P]`` of the implied flow of camera poses ``pose`` ``[P, 4, 4]`` to
    ``flow`` ``[P, 2, H, W]``: the mean over pixels (weighted by ``weights`` ``[P, H, W]``) of
    the Cauchy loss of scale ``scale`` (pixels), capped at :data:`OUTLIER_COST`, which a
    pixel where the implied flow is undefined counts (so a motion cannot look good by leaving
    the frame)."""
    implied, valid = implied_flow(pose, depth, fov_deg)
    loss = torch.log1p(((implied - flow).norm(dim=1) / scale) ** 2)
    loss = torch.where(valid, loss.clamp(max=OUTLIER_COST), OUTLIER_COST)
    return (loss * weights).sum((1, 2)) / weights.sum((1, 2))


def action_starts() -> Tensor:
    """``[81, 4]`` (tx, tz, yaw deg, pitch deg): every action's motion at the middle of the
    world's speed range (:mod:`wc_fast.world.motion`), the no-op first: the places a fit
    starts from, so it does not settle for a turn where a step explains the flow better."""
    speed = sum(SPEED_RANGE) / 2
    t, angles = action_components(torch.arange(NUM_ACTIONS),
                                  translation_step=speed * TRANSLATION_STEP,
                                  rotation_step_deg=speed * ROTATION_STEP_DEG)
    return torch.cat([t[:, [0, 2]], angles], -1)


def _refine(flow: Tensor, depth: Tensor, previous: Tensor, params: Tensor, weights: Tensor,
            fov_deg: float, iterations: int) -> Tensor:
    """``iterations`` damped Gauss-Newton steps on the motions ``params`` ``[P, 4]`` of
    :func:`fit_step`'s problem (finite-difference Jacobians, each pixel's residual weighted by
    ``weights`` ``[P, H, W]`` and a Cauchy weight of scale :data:`ROBUST_START` halved each
    step down to :data:`ROBUST_SCALE`, pixels where the implied flow is undefined left
    out)."""
    n = flow.shape[0]
    scales = torch.tensor(PARAM_SCALES, dtype=torch.float64)
    eye = torch.eye(4, dtype=torch.float64)
    # each Gauss-Newton step evaluates the motion and its 4 nudges in one batch of 5P rows
    nudges = torch.cat([torch.zeros(1, 4, dtype=torch.float64),
                        eye * torch.tensor(JACOBIAN_STEPS, dtype=torch.float64)])  # [5, 4]
    poses, depths = previous.repeat_interleave(5, 0), depth.repeat_interleave(5, 0)
    for i in range(iterations):
        moved, ok = implied_flow(poses @ motion_matrix((params[:, None] + nudges).flatten(0, 1)),
                                 depths, fov_deg)
        moved, ok = moved.unflatten(0, (n, 5)), ok.unflatten(0, (n, 5))
        base, valid = moved[:, 0], ok.all(1)
        rows = ((moved[:, 1:] - base[:, None]).permute(0, 2, 3, 4, 1)
                / torch.tensor(JACOBIAN_STEPS, dtype=torch.float64) * scales)
        rows = rows.reshape(n, -1, 4)  # [P, 2*H*W, 4]
        residual = (base - flow).reshape(n, -1)
        weight = (valid * weights)[:, None].expand(-1, 2, -1, -1).reshape(n, -1).double()
        robust = max(ROBUST_SCALE, ROBUST_START * 0.5**i)  # graduated: wide, then narrow
        weight = weight / (1 + (residual / robust) ** 2)
        normal = (rows * weight[..., None]).transpose(1, 2) @ rows
        damped = normal + DAMPING * torch.diag_embed(normal.diagonal(dim1=1, dim2=2)) \
            + 1e-9 * eye
        step = torch.linalg.solve(damped, (rows * (weight * residual)[..., None]).sum(1))
        params = params - step * scales
    return params


def fit_step(flow: Tensor, depth: Tensor, previous: Tensor, starts: Tensor,
             weights: Tensor | None = None, fov_deg: float = DEFAULT_FOV_DEG,
             iterations: int = ITERATIONS) -> Tensor:
    """The motion ``[P, 4]`` (tx, tz, yaw deg, pitch deg; float64) of one frame from the one
    before it, at pose ``previous`` ``[P, 4, 4]`` in the reference camera's frame, whose
    implied flow (:func:`implied_flow` of ``previous @ motion_matrix(step)``) best matches
    ``flow`` ``[P, 2, H, W]`` against the reference's ``depth`` ``[P, H, W]``, each pixel
    weighted by ``weights`` ``[P, H, W]`` (>= 0; all alike when None).

    The :data:`REFINED` candidate ``starts`` ``[P, S, 4]`` of least misfit (at the wide
    scale :data:`ROBUST_START`) are each refined by :func:`_refine`; the result is the
    refined motion of least misfit at :data:`ROBUST_SCALE`."""
    flow = _check("flow", flow, 4).double()
    depth = _check("depth", depth, 3)
    if starts.dim() != 3 or starts.shape[0] != flow.shape[0] or starts.shape[2] != 4:
        raise ValueError(f"starts must be [P, S, 4] with P = {flow.shape[0]}, got "
                         f"{tuple(starts.shape)}")
    n, count = starts.shape[:2]
    keep = min(REFINED, count)
    if weights is None:
        weights = torch.ones_like(depth, dtype=torch.float64)
    elif weights.shape != depth.shape or not bool((weights >= 0).all()) \
            or not bool((weights.sum((1, 2)) > 0).all()):
        raise ValueError(f"weights must be [P, H, W] like depth {tuple(depth.shape)}, >= 0 "
                         f"and not all 0, got {tuple(weights.shape)}")

    def tiled(x: Tensor, times: int) -> Tensor:
        return x.repeat_interleave(times, 0)

    cost = _cost(tiled(flow, count), tiled(depth, count),
                 tiled(previous, count) @ motion_matrix(starts.flatten(0, 1)),
                 tiled(weights, count), fov_deg, ROBUST_START).reshape(n, count)
    best = starts.double().gather(1, cost.topk(keep, 1, largest=False).indices[..., None]
                                  .expand(-1, -1, 4)).flatten(0, 1)
    refined = _refine(tiled(flow, keep), tiled(depth, keep), tiled(previous, keep), best,
                      tiled(weights, keep), fov_deg, iterations)
    final = _cost(tiled(flow, keep), tiled(depth, keep),
                  tiled(previous, keep) @ motion_matrix(refined), tiled(weights, keep),
                  fov_deg, ROBUST_SCALE)
    choice = final.reshape(n, keep).argmin(1)
    return refined.reshape(n, keep, 4)[torch.arange(n), choice]


def read_path(flow: Tensor, depth: Tensor, weights: Tensor | None = None,
              fov_deg: float = DEFAULT_FOV_DEG, iterations: int = ITERATIONS) -> Tensor:
    """The camera path ``[B, F+1, 4, 4]`` (float64, the reference's pose the identity) that
    explains a clip's predicted flow ``[B, F, 2, H, W]`` (each frame's from the reference
    frame) against the reference frame's depth ``[B, H, W]``, each pixel of frame ``k``
    weighted by ``weights[:, k]`` (``[B, F, H, W]``; all alike when None; see
    :func:`texture_weights`): frame by frame, each step
    fitted by :func:`fit_step` from the one before it, started from the best of the previous
    step's motion (a key press holds its motion) and :func:`action_starts`, so the path is
    chained from per-frame steps of the world's motion model, as the evaluation's labels read
    it."""
    _check("flow", flow, 5)
    _check("depth", depth, 3)
    b, frames, channels, h, w = flow.shape
    if channels != 2 or h != w or depth.shape != (b, h, w):
        raise ValueError(f"flow must be [B, F, 2, H, H] and depth [B, H, H] with the same B "
                         f"and H, got {tuple(flow.shape)} and {tuple(depth.shape)}")
    if weights is not None and weights.shape != (b, frames, h, w):
        raise ValueError(f"weights must be [B, F, H, W] = {(b, frames, h, w)}, got "
                         f"{tuple(weights.shape)}")
    poses = [torch.eye(4, dtype=torch.float64).expand(b, 4, 4)]
    grid = action_starts().expand(b, -1, -1)
    step = torch.zeros(b, 4, dtype=torch.float64)
    for k in range(frames):
        starts = torch.cat([step[:, None], grid], 1)
        step = fit_step(flow[:, k], depth, poses[-1], starts,
                        None if weights is None else weights[:, k], fov_deg, iterations)
        poses.append(poses[-1] @ motion_matrix(step))
    return torch.stack(poses, 1)


def true_flow(delta: Tensor, depth: Tensor, fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """The backward flows ``[B, F, 2, H, W]`` (float64) of a clip's frames from its reference
    frame, for the frames' poses ``delta`` ``[B, F, 4, 4]`` in the reference camera's frame and
    their own depths ``[B, F, H, W]`` (:func:`flow_from_target_depth` per frame)."""
    _check("delta", delta, 4)
    _check("depth", depth, 4)
    if delta.shape[:2] != depth.shape[:2]:
        raise ValueError(f"delta [B, F, 4, 4] and depth [B, F, H, W] must share B and F, got "
                         f"{tuple(delta.shape)} and {tuple(depth.shape)}")
    flows = flow_from_target_depth(delta.flatten(0, 1), depth.flatten(0, 1), fov_deg)
    return flows.unflatten(0, delta.shape[:2])


def rendered_flow(scenes: Scenes, c2w: Tensor, *, resolution: int,
                  fov_deg: float = DEFAULT_FOV_DEG) -> tuple[Tensor, Tensor]:
    """The true flows ``[B, F, 2, H, W]`` (:func:`true_flow`) of clips whose poses are ``c2w``
    ``[B, F+1, 4, 4]`` (the reference frame first) in ``scenes``, and the reference frames'
    depth ``[B, H, W]``, both from the world's ray caster at ``resolution``: what a model that
    follows the camera path exactly predicts, and what :func:`read_path` reads it against."""
    _check("c2w", c2w, 4)
    if c2w.shape[1] < 2 or c2w.shape[-2:] != (4, 4):
        raise ValueError(f"c2w must be [B, F+1, 4, 4] with F >= 1, got {tuple(c2w.shape)}")
    c2w = c2w.double()
    depths = render_depth(scenes, c2w, resolution=resolution, fov_deg=fov_deg)
    delta = torch.linalg.inv(c2w[:, :1]) @ c2w[:, 1:]
    return true_flow(delta, depths[:, 1:], fov_deg), depths[:, 0]


def texture_weights(frames: Tensor) -> Tensor:
    """Per-pixel weights ``[B, F, H, W]`` of a clip's frames ``[B, F, 3, H, W]`` in [-1, 1]:
    the magnitude of their luminance gradient (plus a floor of 1e-3), where a flow error
    changes the frame. A warp model learns its flow only from the frames it draws, so where
    the frame is flat its flow is unconstrained; weighting by the warp-only frames' texture
    reads the flow where it shows."""
    lum = luminance(_check("frames", frames, 5)).flatten(0, 1)
    gx, gy = gradients(lum)
    return ((gx**2 + gy**2).sqrt() + 1e-3).reshape(frames.shape[:2] + frames.shape[-2:])
