"""Vectorized ray casting of :class:`~wc_fast.world.scene.Scenes` with a pinhole camera.

Each pixel casts one ray (or ``supersample**2`` rays, averaged) through the pixel centre, in the
OpenCV camera frame (+x right, +y down, +z forward), rotated to the world by the frame's c2w.
The nearest hit over the room, all boxes and all pillars is found in one batched computation;
the hit surface is coloured by its material's procedural pattern (checker, bricks or tiles over
the surface coordinates; faded to its mean where a cell is under 1.5 pixels), shaded by
its normal and blended into a neutral fog by distance. :func:`depth` reads the same hits' depth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import torch
from torch import Tensor

from wc_fast.world.scene import MAX_BOXES, Scenes

DEFAULT_FOV_DEG = 75.0
FOG_DISTANCE = 14.0
FOG_COLOR = (0.72, 0.72, 0.74)
# Brightness of axis-aligned faces by (normal axis, ray direction > 0 along it): a light from
# above (floors and box tops brightest) and from one side.
_FACE_SHADE = ((0.80, 0.66), (0.70, 1.00), (0.88, 0.74))
_PILLAR_LIGHT = (0.6, 0.8)  # direction (x, z) of the light that shades pillars
_CHUNK_FRAMES = 64


def focal_length(resolution: int, fov_deg: float = DEFAULT_FOV_DEG) -> float:
    """Focal length in pixels of a square image with horizontal field of view ``fov_deg``."""
    return resolution / 2 / math.tan(math.radians(fov_deg) / 2)


@functools.lru_cache(maxsize=16)
def camera_rays(resolution: int, fov_deg: float = DEFAULT_FOV_DEG, supersample: int = 1
                ) -> Tensor:
    """Ray directions in the camera frame, ``[H*s*W*s, 3]`` with ``z = 1``, row-major over
    ``(H, s, W, s)`` so that averaging the sub-pixel axes gives the ``[H, W]`` image."""
    s = supersample
    f = focal_length(resolution, fov_deg)
    sub = (torch.arange(s, dtype=torch.float32) + 0.5) / s
    coord = (torch.arange(resolution, dtype=torch.float32)[:, None] + sub[None, :]).reshape(-1)
    coord = (coord - resolution / 2) / f
    y, x = torch.meshgrid(coord, coord, indexing="ij")
    return torch.stack([x, y, torch.ones_like(x)], -1).reshape(-1, 3)


def _materials(sc: Scenes) -> Tensor:
    """``[N, 11, M]``: colour a (3), colour b (3), pattern one-hot (3), frequency (2)."""
    return torch.cat([sc.color_a, sc.color_b, sc.pattern, sc.frequency], -1).transpose(1, 2)


def _cast(sc: Scenes, origin: Tensor, d: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Nearest hit of each ray; rays are the last (contiguous) dimension throughout.

    ``origin`` ``[N, 3]``, ``d`` ``[N, 3, R]`` -> (ray parameter ``t`` ``[N, R]``, primitive
    ``[N, R]`` (0 room, 1..K boxes, K+1.. pillars), room face ``[N, R]`` (x-, x+, ceiling,
    floor, z-, z+), normal axis ``[N, R]`` (0, 1, 2, or 3 for a pillar)).
    """
    inv = 1.0 / d
    o = origin[:, :, None]
    # Room: the ray leaves the room box through the nearest of the three far planes.
    positive = d > 0
    bound = torch.where(positive, sc.room[:, 1, :, None], sc.room[:, 0, :, None])
    t_room, axis_room = ((bound - o) * inv).min(1)
    face = 2 * axis_room + positive.gather(1, axis_room[:, None])[:, 0].long()
    # Boxes: slab test on [N, K, 3, R].
    t_lo = (sc.box_lo - origin[:, None])[..., None] * inv[:, None]
    t_hi = (sc.box_hi - origin[:, None])[..., None] * inv[:, None]
    t_near, axis_box = torch.minimum(t_lo, t_hi).max(2)
    t_far = torch.maximum(t_lo, t_hi).amin(2)
    t_box = torch.where((t_near <= t_far) & (t_near > 0), t_near, torch.inf)
    # Pillars: vertical cylinders, intersection in the x-z plane, [N, P, R].
    rel_x = (origin[:, None, 0] - sc.pillar[..., 0])[..., None]
    rel_z = (origin[:, None, 2] - sc.pillar[..., 1])[..., None]
    a = (d[:, 0] ** 2 + d[:, 2] ** 2).clamp_min(1e-12)[:, None]
    b = d[:, None, 0] * rel_x + d[:, None, 2] * rel_z
    c = rel_x**2 + rel_z**2 - sc.pillar[..., 2:3] ** 2
    disc = b * b - a * c
    t_cyl = (-b - disc.clamp_min(0).sqrt()) / a
    t_cyl = torch.where((disc > 0) & (t_cyl > 0), t_cyl, torch.inf)

    t, prim = torch.cat([t_room[:, None], t_box, t_cyl], 1).min(1)
    box_axis = axis_box.gather(1, (prim - 1).clamp(0, MAX_BOXES - 1)[:, None])[:, 0]
    axis = torch.where(prim == 0, axis_room, torch.where(prim <= MAX_BOXES, box_axis, 3))
    return t, prim, face, axis


def _shade(sc: Scenes, origin: Tensor, d: Tensor, pixel_angle: float) -> Tensor:
    """Colour ``[N, 3, R]`` in [0, 1] of rays ``d`` ``[N, 3, R]`` from ``origin`` ``[N, 3]``;
    ``pixel_angle`` is the angle (radians) one pixel spans at the image centre."""
    t, prim, face, axis = _cast(sc, origin, d)
    p = origin[:, :, None] + t[:, None] * d
    material = torch.where(prim == 0, face, prim + 5)
    mat = _materials(sc).gather(2, material[:, None].expand(-1, 11, -1))

    # Surface coordinates (u, v): the two world axes spanning an axis-aligned face; around and
    # along a pillar.
    pillar_idx = (prim - 1 - MAX_BOXES).clamp_min(0)
    pil = sc.pillar.transpose(1, 2).gather(2, pillar_idx[:, None].expand(-1, 3, -1))
    on_pillar = axis == 3
    normal_x = (p[:, 0] - pil[:, 0]) / pil[:, 2]
    normal_z = (p[:, 2] - pil[:, 1]) / pil[:, 2]
    u = torch.where(axis == 0, p[:, 2], p[:, 0])
    u = torch.where(on_pillar, torch.atan2(normal_z, normal_x) * pil[:, 2], u)
    v = torch.where(axis == 1, p[:, 2], p[:, 1])

    iu = torch.floor(u * mat[:, 9])
    iv = torch.floor(v * mat[:, 10])
    checker = torch.remainder(iu + iv, 2.0)
    # Bricks: a checker whose every other row is shifted by half a cell.
    row_shift = 0.5 * torch.remainder(iv, 2.0)
    bricks = torch.remainder(torch.floor(u * mat[:, 9] + row_shift) + iv, 2.0)
    tiles = torch.frac(torch.sin(iu * 12.9898 + iv * 78.233).abs() * 43758.5453)
    value = mat[:, 6] * checker + mat[:, 7] * bricks + mat[:, 8] * tiles
    # Cheap anti-aliasing: where a pattern cell covers less than 1.5 pixels (far or grazing
    # surfaces), fade the pattern to its mean, so distant textures do not shimmer as the camera
    # moves. The pixel footprint is distance * pixel angle, stretched by the incidence angle.
    length = (d[:, 0] ** 2 + d[:, 1] ** 2 + d[:, 2] ** 2).sqrt()
    distance = t * length
    facing = torch.where(on_pillar, (d[:, 0] * normal_x + d[:, 2] * normal_z).abs(),
                         d.gather(1, axis.clamp(max=2)[:, None])[:, 0].abs()) / length
    footprint = distance * pixel_angle / facing.clamp_min(0.2)
    cells_per_pixel = footprint * torch.maximum(mat[:, 9], mat[:, 10])
    value = torch.lerp(value, torch.full_like(value, 0.5), (1.5 * cells_per_pixel - 1).clamp(0, 1))
    color = torch.lerp(mat[:, 0:3], mat[:, 3:6], value[:, None])

    face_shade = torch.tensor(_FACE_SHADE)
    positive = d.gather(1, axis.clamp(max=2)[:, None])[:, 0] > 0
    shade = face_shade[axis.clamp(max=2), positive.long()]
    pillar_shade = 0.72 + 0.2 * (normal_x * _PILLAR_LIGHT[0] + normal_z * _PILLAR_LIGHT[1])
    shade = torch.where(on_pillar, pillar_shade, shade)

    fog = torch.exp(-distance / FOG_DISTANCE)[:, None]
    return torch.lerp(torch.tensor(FOG_COLOR)[:, None], color * shade[:, None], fog)


def _chunks(scenes: Scenes, c2w: Tensor, rays: Tensor
            ) -> Iterator[tuple[Scenes, Tensor, Tensor]]:
    """The frames of ``c2w`` ``[n, T, 4, 4]`` in chunks of at most :data:`_CHUNK_FRAMES`: each
    chunk's scenes, camera origins ``[N, 3]`` and world ray directions ``[N, 3, R]`` of the
    camera-frame ``rays`` ``[R, 3]`` (every component kept away from 0, so ``1/d`` is finite)."""
    n, frames = c2w.shape[:2]
    flat = c2w.reshape(n * frames, 4, 4).to(torch.float32)
    per_frame = scenes.index(torch.arange(n).repeat_interleave(frames))
    for start in range(0, n * frames, _CHUNK_FRAMES):
        stop = min(start + _CHUNK_FRAMES, n * frames)
        pose = flat[start:stop]
        d = pose[:, :3, :3] @ rays.T
        d = torch.where(d.abs() < 1e-7, torch.full_like(d, 1e-7), d)
        yield per_frame.index(torch.arange(start, stop)), pose[:, :3, 3], d


def render(scenes: Scenes, c2w: Tensor, *, resolution: int = 32, fov_deg: float = DEFAULT_FOV_DEG,
           supersample: int = 1) -> Tensor:
    """Render camera poses in their scenes.

    ``scenes`` of ``n`` scenes, ``c2w`` ``[n, T, 4, 4]`` -> frames ``[n, T, 3, H, W]`` float32 in
    [-1, 1] with ``H = W = resolution``. Deterministic: the same inputs give the same pixels.
    """
    n, frames = c2w.shape[:2]
    rays = camera_rays(resolution, fov_deg, supersample)
    pixel_angle = 1.0 / (focal_length(resolution, fov_deg) * supersample)
    rgb = torch.cat([_shade(sc, origin, d, pixel_angle)
                     for sc, origin, d in _chunks(scenes, c2w, rays)])
    s = supersample
    rgb = rgb.reshape(n * frames, 3, resolution, s, resolution, s).mean((3, 5))
    return (rgb * 2 - 1).reshape(n, frames, 3, resolution, resolution)


def depth(scenes: Scenes, c2w: Tensor, *, resolution: int = 32,
          fov_deg: float = DEFAULT_FOV_DEG) -> Tensor:
    """Depth of each pixel centre: the camera-frame z (distance along the camera's forward axis,
    not along the ray) of the nearest surface, as :func:`render` sees it without supersampling.

    ``scenes`` of ``n`` scenes, ``c2w`` ``[n, T, 4, 4]`` -> ``[n, T, H, W]`` float32, ``H = W =
    resolution``. Every room is closed, so every depth is finite and positive; a reader of
    depth still treats a non-finite one as a point at infinity. The rays of
    :func:`camera_rays` have ``z = 1``, so the hit's ray parameter is this depth.
    """
    if not isinstance(c2w, Tensor) or c2w.dim() != 4 or c2w.shape[-2:] != (4, 4):
        raise ValueError(f"c2w must be [n, T, 4, 4], got {getattr(c2w, 'shape', c2w)}")
    if c2w.shape[0] != len(scenes):
        raise ValueError(f"c2w must have one row per scene ({len(scenes)}), got "
                         f"{c2w.shape[0]}")
    n, frames = c2w.shape[:2]
    rays = camera_rays(resolution, fov_deg)
    t = torch.cat([_cast(sc, origin, d)[0] for sc, origin, d in _chunks(scenes, c2w, rays)])
    return t.reshape(n, frames, resolution, resolution)
