"""Pictures of rollouts: frames of each clip beside a top-down plot of its camera path.

``save_rollout_grid`` writes one PNG: a row per clip, its frames left to right, then the
commanded and the estimated camera paths seen from above (x right, z forward, in the frame of
the clip's first camera, so both start at the origin looking up the plot).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor


def _to_first_camera(c2w: Tensor) -> Tensor:
    """Poses ``[n, T, 4, 4]`` relative to each clip's first pose (float64)."""
    c2w = c2w.detach().to("cpu", torch.float64)
    return torch.linalg.inv(c2w[:, :1]) @ c2w


def _image(frame: Tensor):
    """``[C, H, W]`` in [-1, 1] -> ``[H, W, C]`` (or ``[H, W]``) numpy in [0, 1]."""
    img = ((frame.detach().to("cpu", torch.float32) + 1) / 2).clamp(0, 1)
    img = img.permute(1, 2, 0)
    return img[..., 0].numpy() if img.shape[-1] == 1 else img.numpy()


def _plot_path(ax, c2w: Tensor, style: str, label: str) -> None:
    """Camera positions (x, z) and the viewing direction of each pose as short ticks."""
    pos = c2w[:, :3, 3]
    fwd = c2w[:, :3, 2]
    line = ax.plot(pos[:, 0], pos[:, 2], style, label=label, markersize=3)[0]
    scale = 0.15 * max(1e-3, float((pos[:, [0, 2]] - pos[0, [0, 2]]).abs().max()), 1.0)
    for p, f in zip(pos, fwd, strict=True):
        ax.plot([p[0], p[0] + scale * f[0]], [p[2], p[2] + scale * f[2]],
                color=line.get_color(), linewidth=0.8, alpha=0.7)


def save_rollout_grid(path: str | Path, frames: Tensor, c2w_cmd: Tensor | None = None,
                      c2w_est: Tensor | None = None, titles: Sequence[str] | None = None,
                      *, max_rows: int = 8) -> Path:
    """Write a PNG grid of clips with their camera paths.

    Args:
        path: output PNG file (folders are created).
        frames: ``[n, T, C, H, W]`` in [-1, 1].
        c2w_cmd: ``[n, T, 4, 4]`` commanded (ground-truth) poses, or None.
        c2w_est: ``[n, T, 4, 4]`` estimated poses (e.g. a camera estimator's), or None.
        titles: one title per clip (e.g. the commanded action names), or None.
        max_rows: draw at most this many clips.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if frames.dim() != 5:
        raise ValueError(f"frames must be [n, T, C, H, W], got {tuple(frames.shape)}")
    n, t = min(frames.shape[0], max_rows), frames.shape[1]
    paths = [(c, s, lab) for c, s, lab in ((c2w_cmd, "o-", "commanded"),
                                           (c2w_est, "x--", "estimated")) if c is not None]
    columns = t + (1 if paths else 0)
    fig, axes = plt.subplots(n, columns, figsize=(1.3 * columns + (1.2 if paths else 0),
                                                  1.6 * n), squeeze=False)
    for row in range(n):
        for col in range(t):
            ax = axes[row, col]
            ax.imshow(_image(frames[row, col]), interpolation="nearest", vmin=0, vmax=1,
                      cmap="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == n - 1:
                ax.set_xlabel(f"t={col}", fontsize=7)
        if titles is not None:
            # above the row, left-aligned: a long command list runs along the row instead of
            # off the figure's left edge
            title = axes[row, 0].text(0.0, 1.06, titles[row], transform=axes[row, 0].transAxes,
                                      fontsize=6, ha="left", va="bottom")
            title.set_in_layout(False)
        if paths:
            ax = axes[row, t]
            for c2w, style, label in paths:
                _plot_path(ax, _to_first_camera(c2w[: n])[row], style, label)
            ax.set_aspect("equal", adjustable="datalim")
            ax.tick_params(labelsize=5)
            if row == 0:
                ax.set_title("path (x, z)", fontsize=7)
                ax.legend(fontsize=5, loc="best")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
