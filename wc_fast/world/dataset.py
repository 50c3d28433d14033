"""Dataset API of the embedded world: rendered clips with per-frame actions and c2w poses.

Everything is deterministic given ``(n, seed)`` and the keyword options: one
``torch.Generator`` seeded with ``seed`` draws the scenes, the start poses and the trajectories,
in that order, and rendering is a pure function of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from wc_fast.world.render import DEFAULT_FOV_DEG, render
from wc_fast.world.scene import Scenes, sample_scenes, start_poses
from wc_fast.world.trajectory import DEFAULT_MAX_TILT_DEG, generate

DEFAULT_RESOLUTION = 32
DEFAULT_CLIP_FRAMES = 4
CLIP_START_PITCH_DEG = 20.0


@dataclass
class Clips:
    """Rendered clips.

    Attributes:
        frames: ``[n, 1+F, 3, H, W]`` float32 in [-1, 1]; frame 0 is the context frame (the
            previous clip's last frame, or the world prompt of a sequence).
        actions: ``[n, F]`` long action ids 0..80; ``actions[:, i-1]`` moved the camera from
            frame ``i-1`` to frame ``i``.
        c2w: ``[n, 1+F, 4, 4]`` float32 camera-to-world poses (OpenCV camera frame).
        forced_noop: ``[n, S]`` bool, segments that fell back to a no-op (see
            :mod:`wc_fast.world.trajectory`).
        motion_factors: ``[n, S, 3]`` float32, each segment's speed, turn rate and onset
            (fractions of the largest step; see :mod:`wc_fast.world.motion`).
    """

    frames: Tensor
    actions: Tensor
    c2w: Tensor
    forced_noop: Tensor
    motion_factors: Tensor

    def __len__(self) -> int:
        return self.frames.shape[0]

    def __getitem__(self, idx: int | slice | Tensor) -> Clips:
        if isinstance(idx, int):
            idx = slice(idx, idx + 1)
        return Clips(self.frames[idx], self.actions[idx], self.c2w[idx], self.forced_noop[idx],
                     self.motion_factors[idx])


def _sample(n: int, seed: int, *, num_segments: int, segment_frames: int,
            composite_fraction: float, noop_fraction: float, start_pitch_deg: float,
            resolution: int, fov_deg: float, supersample: int, max_tilt_deg: float,
            **motion: object) -> Clips:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    gen = torch.Generator().manual_seed(seed)
    scenes = sample_scenes(n, gen)
    start = start_poses(scenes, gen, max_pitch_deg=start_pitch_deg)
    traj = generate(scenes, start, gen, num_segments=num_segments, segment_frames=segment_frames,
                    composite_fraction=composite_fraction, noop_fraction=noop_fraction,
                    max_tilt_deg=max_tilt_deg, **motion)
    frames = render(scenes, traj.c2w, resolution=resolution, fov_deg=fov_deg,
                    supersample=supersample)
    return Clips(frames, traj.actions, traj.c2w.to(torch.float32), traj.forced_noop,
                 traj.motion_factors.to(torch.float32))


def _segments(total_frames: int, segment_frames: int) -> int:
    if segment_frames < 1 or total_frames % segment_frames:
        raise ValueError(f"segment_frames={segment_frames} must divide the {total_frames} new "
                         f"frames")
    return total_frames // segment_frames


def sample_clips(n: int, *, seed: int, composite_fraction: float = 0.5,
                 noop_fraction: float = 0.0, clip_frames: int = DEFAULT_CLIP_FRAMES,
                 resolution: int = DEFAULT_RESOLUTION, segment_frames: int | None = None,
                 start_pitch_deg: float = CLIP_START_PITCH_DEG, fov_deg: float = DEFAULT_FOV_DEG,
                 supersample: int = 1, max_tilt_deg: float = DEFAULT_MAX_TILT_DEG,
                 **motion: object) -> Clips:
    """``n`` single clips, each in its own random scene.

    Returns :class:`Clips` with frames ``[n, 1+F, 3, R, R]`` (``F = clip_frames``,
    ``R = resolution``). Frame 0 stands for the previous clip's last frame: a random free pose
    with pitch within +/-``start_pitch_deg``. By default one action spans the whole clip
    (``segment_frames = clip_frames``, as in WorldPlay); ``segment_frames=1`` draws a new action
    every frame. ``motion``: the speed, onset and composite options of
    :func:`wc_fast.world.trajectory.generate` (``speed_range``, ``onset_range``,
    ``composite_keys``).
    """
    segment_frames = clip_frames if segment_frames is None else segment_frames
    return _sample(n, seed, num_segments=_segments(clip_frames, segment_frames),
                   segment_frames=segment_frames, composite_fraction=composite_fraction,
                   noop_fraction=noop_fraction, start_pitch_deg=start_pitch_deg,
                   resolution=resolution, fov_deg=fov_deg, supersample=supersample,
                   max_tilt_deg=max_tilt_deg, **motion)


def sample_sequences(n: int, *, num_clips: int, seed: int, composite_fraction: float = 0.5,
                     noop_fraction: float = 0.0, clip_frames: int = DEFAULT_CLIP_FRAMES,
                     resolution: int = DEFAULT_RESOLUTION, segment_frames: int | None = None,
                     fov_deg: float = DEFAULT_FOV_DEG, supersample: int = 1,
                     max_tilt_deg: float = DEFAULT_MAX_TILT_DEG, **motion: object) -> Clips:
    """``n`` sequences of ``num_clips`` consecutive clips, each in its own random scene.

    Frames ``[n, 1 + num_clips*F, 3, R, R]``, actions ``[n, num_clips*F]``, c2w
    ``[n, 1 + num_clips*F, 4, 4]``. Frame 0 is the world prompt, seen from a level camera. By
    default each clip repeats one action (``segment_frames = clip_frames``, as in WorldPlay).
    ``motion`` as in :func:`sample_clips`.
    """
    if num_clips < 1:
        raise ValueError(f"num_clips must be >= 1, got {num_clips}")
    total = num_clips * clip_frames
    segment_frames = clip_frames if segment_frames is None else segment_frames
    return _sample(n, seed, num_segments=_segments(total, segment_frames),
                   segment_frames=segment_frames, composite_fraction=composite_fraction,
                   noop_fraction=noop_fraction, start_pitch_deg=0.0, resolution=resolution,
                   fov_deg=fov_deg, supersample=supersample, max_tilt_deg=max_tilt_deg,
                   **motion)


def sequence_scenes(data_seed: int, n: int) -> tuple[Scenes, Tensor]:
    """The scenes and start poses ``[n, 4, 4]`` that :func:`sample_sequences` draws first from
    ``data_seed``, in that order, for ``n`` sequences (a group's world, redrawn from its
    prompt seed)."""
    gen = torch.Generator().manual_seed(data_seed)
    scenes = sample_scenes(n, gen)
    return scenes, start_poses(scenes, gen, max_pitch_deg=0.0)


def batch_seed(seed: int, index: int) -> int:
    """Seed of batch ``index`` of a stream started from ``seed`` (distinct for distinct pairs
    while ``index < 1_000_003``)."""
    return seed * 1_000_003 + index


def iter_clips(batch_size: int, *, seed: int, num_batches: int | None = None,
               sequences: bool = False, **options: object) -> Iterator[Clips]:
    """An endless (or ``num_batches`` long) stream of batches.

    Batch ``i`` is ``sample_clips(batch_size, seed=batch_seed(seed, i), **options)``, or
    :func:`sample_sequences` with ``sequences=True`` (then pass ``num_clips``).
    """
    sample = sample_sequences if sequences else sample_clips
    index = 0
    while num_batches is None or index < num_batches:
        yield sample(batch_size, seed=batch_seed(seed, index), **options)
        index += 1


class ClipDataset(torch.utils.data.IterableDataset):
    """Endless stream of single clips ``(frames [1+F, 3, H, W], actions [F], c2w [1+F, 4, 4])``
    for a ``DataLoader``; worker ``w`` of ``W`` renders batches ``w, w+W, ...`` of
    :func:`iter_clips`, so the stream is the same for any number of workers up to ordering."""

    def __init__(self, *, seed: int, render_batch: int = 64, sequences: bool = False,
                 **options: object) -> None:
        self.seed, self.render_batch, self.sequences, self.options = (seed, render_batch,
                                                                      sequences, options)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        sample = sample_sequences if self.sequences else sample_clips
        index = worker
        while True:
            clips = sample(self.render_batch, seed=batch_seed(self.seed, index), **self.options)
            for i in range(len(clips)):
                yield clips.frames[i], clips.actions[i], clips.c2w[i]
            index += workers
