"""``python -m studies.render_speed [--threads 2] [--frames 2048] [--resolution 32]``.

Measures the renderer's throughput in frames per second (best of ``--repeats`` runs) on random
scenes and poses; scene sampling and trajectories are not timed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from wc_fast.world.render import render
from wc_fast.world.scene import sample_scenes, start_poses


def frames_per_second(*, frames: int = 2048, resolution: int = 32, clip_frames: int = 4,
                      repeats: int = 3, supersample: int = 1) -> float:
    """Best-of-``repeats`` rendering throughput of ``frames`` frames in clips of ``clip_frames``."""
    gen = torch.Generator().manual_seed(0)
    n = max(1, frames // clip_frames)
    scenes = sample_scenes(n, gen)
    c2w = start_poses(scenes, gen, max_pitch_deg=20.0)[:, None].repeat(1, clip_frames, 1, 1)
    render(scenes, c2w[: min(n, 8)], resolution=resolution)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        render(scenes, c2w, resolution=resolution, supersample=supersample)
        best = min(best, time.perf_counter() - start)
    return n * clip_frames / best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.render_speed",
                                     description="Renderer throughput (frames/s).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frames", type=int, default=2048)
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--supersample", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    fps = frames_per_second(frames=args.frames, resolution=args.resolution,
                            repeats=args.repeats, supersample=args.supersample)
    print(f"{fps:.0f} frames/s at {args.resolution}x{args.resolution} "
          f"(supersample {args.supersample}, {args.threads} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
