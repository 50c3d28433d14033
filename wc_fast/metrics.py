"""Run outputs: ``metrics.jsonl`` (one row per iteration), optional TensorBoard events, the
reward-curve PNG, peak FLOP/s."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


class TensorBoardLog:
    """The numbers of each row as TensorBoard scalars (event files under ``directory``); on
    resume, events after the resumed step are dropped."""

    def __init__(self, directory: str | Path, *, resume_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise RuntimeError("train.loggers tensorboard needs the tensorboard package: "
                               "pip install 'wc_fast[tensorboard]'") from exc
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(directory), purge_step=purge)

    def append(self, row: dict) -> None:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=row["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MetricsLog:
    """Appends JSON rows (and, given ``tensorboard``, their scalars to that directory); on
    resume keeps only rows up to the resumed step."""

    def __init__(self, path: str | Path, *, resume_step: int | None = None,
                 tensorboard: str | Path | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = self.read() if resume_step is not None else []
        self.rows = [r for r in rows if r["step"] <= (resume_step or 0)]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        self.board = None if tensorboard is None else TensorBoardLog(tensorboard,
                                                                     resume_step=resume_step)

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def append(self, row: dict) -> None:
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.board is not None:
            self.board.append(row)

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def _running_mean(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot_rewards(rows: list[dict], path: str | Path) -> Path | None:
    """Reward curves like the WorldCompass paper's Figure 2: IF and VQ per iteration, the loss,
    and the motion spread of basic and composite groups."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.2))
    for ax, key, title in zip(axes[:3], ("if_mean", "vq_mean", "loss"),
                              ("interaction following (IF)", "visual quality (VQ)", "NFT loss"),
                              strict=True):
        values = [r[key] for r in rows]
        ax.plot(steps, values, color="0.75", linewidth=1)
        ax.plot(steps, _running_mean(values, max(1, len(values) // 10)), linewidth=2)
        ax.set_title(title)
    for kind in ("basic", "composite"):  # groups of that kind only, where present
        points = [(r["step"], r[f"motion_spread_{kind}"]) for r in rows
                  if f"motion_spread_{kind}" in r]
        if points:
            xs, ys = zip(*points, strict=True)
            axes[3].plot(xs, _running_mean(list(ys), max(1, len(ys) // 10)), linewidth=2,
                         label=kind)
    axes[3].axhline(1.0, color="0.5", linestyle="--", linewidth=1)
    axes[3].set_title("motion spread (estimator-error units)")
    if axes[3].lines[1:]:
        axes[3].legend()
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def matmul_flops(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048,
                 repeat: int = 5) -> float:
    """Measured FLOP/s of a large square matmul: the MFU denominator, same run, same machine.

    The fastest of ``repeat`` timed products, so the denominator is the best rate the machine
    showed, not one lowered by a slow repetition.
    """
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
