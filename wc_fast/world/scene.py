"""Procedural scenes: a textured room with boxes on the floor and floor-to-ceiling pillars.

World frame: +y points down (as the OpenCV camera frame when the camera is level), so the floor
is at ``y = FLOOR_Y > 0`` and the ceiling at ``y = CEILING_Y < 0``; cameras start at ``y = 0``.
A batch of ``n`` scenes is a :class:`Scenes` of tensors with leading dimension ``n``.

Primitives of a scene, in material order: the 6 room faces (x-, x+, ceiling, floor, z-, z+),
``MAX_BOXES`` axis-aligned boxes, ``MAX_PILLARS`` vertical cylinders. Unused boxes and pillars
are parked far outside the room, where the walls hide them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wc_fast.infra.runtime import uniform
from wc_fast.world.motion import rot_x, rot_y

FLOOR_Y = 0.9
CEILING_Y = -1.1
MAX_BOXES = 6
MAX_PILLARS = 3
NUM_MATERIALS = 6 + MAX_BOXES + MAX_PILLARS
PATTERNS = ("checker", "bricks", "tiles")
_PARKED = 1000.0


@dataclass
class Scenes:
    """A batch of ``n`` scenes.

    Attributes:
        room: ``[n, 2, 3]`` room box (min corner, max corner).
        box_lo, box_hi: ``[n, MAX_BOXES, 3]`` box corners.
        pillar: ``[n, MAX_PILLARS, 3]`` pillar centre x, centre z, radius.
        color_a, color_b: ``[n, NUM_MATERIALS, 3]`` the two colours of each material in [0, 1].
        pattern: ``[n, NUM_MATERIALS, 3]`` one-hot pattern kind (checker, bricks, tiles).
        frequency: ``[n, NUM_MATERIALS, 2]`` pattern cells per unit along (u, v).
    """

    room: Tensor
    box_lo: Tensor
    box_hi: Tensor
    pillar: Tensor
    color_a: Tensor
    color_b: Tensor
    pattern: Tensor
    frequency: Tensor

    def __len__(self) -> int:
        return self.room.shape[0]

    def index(self, idx: Tensor) -> Scenes:
        """The scenes ``idx`` (``LongTensor [m]``), e.g. one scene per rendered frame."""
        return Scenes(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))


def _hsv_to_rgb(h: Tensor, s: Tensor, v: Tensor) -> Tensor:
    """HSV in [0, 1] ``[...]`` each -> RGB ``[..., 3]``."""
    k = (torch.stack([h, h, h], -1) * 6 + torch.tensor([5.0, 3.0, 1.0])) % 6
    return v[..., None] - v[..., None] * s[..., None] * (
        torch.minimum(k, 4 - k).clamp(0.0, 1.0))


def _materials(gen: torch.Generator, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Colours, pattern kinds and frequencies of all materials of ``n`` scenes."""
    m = NUM_MATERIALS
    hue = torch.rand((n, m), generator=gen)
    sat = uniform(gen, (n, m), 0.25, 0.75)
    val = uniform(gen, (n, m), 0.45, 0.95)
    color_a = _hsv_to_rgb(hue, sat, val)
    # The second colour: a related hue, clearly darker or lighter, so patterns are visible.
    hue_b = (hue + uniform(gen, (n, m), -0.15, 0.15)) % 1.0
    val_b = (val * uniform(gen, (n, m), 0.35, 0.65)).clamp(0.1, 1.0)
    color_b = _hsv_to_rgb(hue_b, sat, val_b)
    # Ceilings are near-white, as in real rooms: a fixed neutral reference for colour shifts.
    ceiling = 2
    color_a[:, ceiling] = uniform(gen, (n, 1), 0.85, 0.95).expand(n, 3)
    color_b[:, ceiling] = color_a[:, ceiling] * 0.6
    pattern = torch.nn.functional.one_hot(
        torch.randint(len(PATTERNS), (n, m), generator=gen), len(PATTERNS)).float()
    # Cells of 0.35 to 0.9 units: a few pixels wide at 32x32 across the room, so that every
    # surface shows edges that move.
    frequency = 1.0 / uniform(gen, (n, m, 1), 0.35, 0.9)
    frequency = frequency * torch.stack([torch.ones(n, m), uniform(gen, (n, m), 0.7, 1.4)], -1)
    return color_a, color_b, pattern, frequency


def sample_scenes(n: int, gen: torch.Generator) -> Scenes:
    """``n`` random scenes drawn from ``gen`` (deterministic given its state)."""
    half = uniform(gen, (n, 2), 4.5, 6.5)  # room half extents along x and z
    room = torch.zeros(n, 2, 3)
    room[:, 0, 0], room[:, 1, 0] = -half[:, 0], half[:, 0]
    room[:, 0, 2], room[:, 1, 2] = -half[:, 1], half[:, 1]
    room[:, 0, 1], room[:, 1, 1] = CEILING_Y, FLOOR_Y

    centre = (torch.rand((n, MAX_BOXES, 2), generator=gen) * 2 - 1) * (half[:, None] - 0.9)
    size = uniform(gen, (n, MAX_BOXES, 2), 0.25, 0.8)
    # Boxes stay below the camera: the floor behind them stays in view (motion parallax).
    height = uniform(gen, (n, MAX_BOXES), 0.25, 0.65)
    box_lo = torch.stack([centre[..., 0] - size[..., 0], FLOOR_Y - height,
                          centre[..., 1] - size[..., 1]], -1)
    box_hi = torch.stack([centre[..., 0] + size[..., 0], torch.full_like(height, FLOOR_Y),
                          centre[..., 1] + size[..., 1]], -1)
    used_boxes = torch.arange(MAX_BOXES) < torch.randint(3, MAX_BOXES + 1, (n, 1), generator=gen)
    box_lo = torch.where(used_boxes[..., None], box_lo, box_lo + _PARKED)
    box_hi = torch.where(used_boxes[..., None], box_hi, box_hi + _PARKED)

    pillar_xz = (torch.rand((n, MAX_PILLARS, 2), generator=gen) * 2 - 1) * (half[:, None] - 0.8)
    radius = uniform(gen, (n, MAX_PILLARS, 1), 0.15, 0.4)
    used_pillars = torch.arange(MAX_PILLARS) < torch.randint(0, MAX_PILLARS + 1, (n, 1),
                                                             generator=gen)
    pillar_xz = torch.where(used_pillars[..., None], pillar_xz, pillar_xz + _PARKED)
    pillar = torch.cat([pillar_xz, radius], -1)
    return Scenes(room, box_lo, box_hi, pillar, *_materials(gen, n))


def is_free(scenes: Scenes, position: Tensor, *, wall_margin: float = 1.0,
            object_margin: float = 0.5, height_band: float = 0.4) -> Tensor:
    """Whether camera positions are in free space.

    ``position`` ``[n, ..., 3]`` (scene i for row i) -> bool ``[n, ...]``: inside the room at
    least ``wall_margin`` from the walls, within ``height_band`` of the start height ``y = 0``,
    and at least ``object_margin`` away from every box and pillar.
    """
    n = position.shape[0]
    extra = position.dim() - 2
    p = position.to(torch.float64)

    def per_scene(t: Tensor) -> Tensor:
        return t.to(torch.float64).reshape(n, *([1] * extra), *t.shape[1:])

    room = per_scene(scenes.room)
    inside = ((p[..., [0, 2]] > room[..., 0, [0, 2]] + wall_margin)
              & (p[..., [0, 2]] < room[..., 1, [0, 2]] - wall_margin)).all(-1)
    inside &= p[..., 1].abs() <= height_band
    lo, hi = per_scene(scenes.box_lo), per_scene(scenes.box_hi)
    q = p.unsqueeze(-2)
    in_box = ((q > lo - object_margin) & (q < hi + object_margin)).all(-1).any(-1)
    pil = per_scene(scenes.pillar)
    dist = (q[..., [0, 2]] - pil[..., :2]).norm(dim=-1)
    in_pillar = (dist < pil[..., 2] + object_margin).any(-1)
    return inside & ~in_box & ~in_pillar


def start_poses(scenes: Scenes, gen: torch.Generator, *, max_pitch_deg: float = 0.0,
                tries: int = 64) -> Tensor:
    """A free start pose per scene: ``[n, 4, 4]`` float64 c2w at height 0.

    Random position in free space, random heading, pitch uniform in +/-``max_pitch_deg``, no roll.
    """
    n = len(scenes)
    half = scenes.room[:, 1, [0, 2]].to(torch.float64)
    xz = (torch.rand((n, tries, 2), generator=gen, dtype=torch.float64) * 2 - 1) * half[:, None]
    candidates = torch.stack([xz[..., 0], torch.zeros(n, tries, dtype=torch.float64),
                              xz[..., 1]], -1)
    free = is_free(scenes, candidates)
    if not bool(free.any(-1).all()):
        raise RuntimeError("could not place a camera in free space; the scene is too cluttered")
    first = free.double().argmax(-1)
    position = candidates[torch.arange(n), first]
    yaw = torch.rand(n, generator=gen, dtype=torch.float64) * 360.0 - 180.0
    pitch = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * max_pitch_deg
    c2w = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    c2w[:, :3, :3] = rot_y(yaw) @ rot_x(pitch)
    c2w[:, :3, 3] = position
    return c2w

