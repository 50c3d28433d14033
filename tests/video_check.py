"""Shared check of ``python -m wc_fast.generate`` on a checkpoint: a playable MP4 with one
frame per generated frame, every one of them drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wc_fast.generate import main


def decoded_frames(path: Path) -> list[np.ndarray]:
    """The RGB frames ``[H, W, 3]`` of a video file, decoded by FFmpeg (PyAV)."""
    import av

    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def assert_generates(checkpoint: Path, out: Path, clip_frames: int) -> list[np.ndarray]:
    """Generate two clips from ``checkpoint`` into ``out`` (.mp4) and check the decoded video:
    1 + 2 ``clip_frames`` frames of at least 256 pixels a side, none of them one flat colour."""
    assert main(["--checkpoint", str(checkpoint), "--keys", "forward+left, yaw_right",
                 "--out", str(out), "--sampler-steps", "2"]) == 0
    frames = decoded_frames(out)
    assert len(frames) == 1 + 2 * clip_frames
    assert min(frames[0].shape[:2]) >= 256 and frames[0].shape[2] == 3
    assert all(float(frame.std()) > 1.0 for frame in frames)
    return frames
