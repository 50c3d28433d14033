"""Run outputs: ``metrics.jsonl`` (one row per iteration), optional TensorBoard and Weights &
Biases tracking, the reward-curve PNG, peak FLOP/s."""

from __future__ import annotations

import json
import netrc
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import torch

from wc_fast.infra.checkpoint import write_atomic
from wc_fast.infra.extras import require

# The TensorBoard / W&B tag of each metrics.jsonl key, in torchtitan's naming, and the factor
# its value is multiplied by (the row's mfu is a fraction, its tag a percentage). Keys not
# listed here are tracked as ``misc/<key>``; metrics.jsonl keeps the flat keys.
TAGS: dict[str, tuple[str, float]] = {
    "loss": ("loss_metrics/loss", 1.0),  # the update rule's (its name: the config's update)
    "kl": ("loss_metrics/kl", 1.0),
    "if_mean": ("reward/if_mean", 1.0),
    "vq_mean": ("reward/vq_mean", 1.0),
    "r_std": ("reward/r_std", 1.0),
    "reader_gap": ("reward/reader_gap", 1.0),
    "motion_spread_basic": ("reward/motion_spread_basic", 1.0),
    "motion_spread_composite": ("reward/motion_spread_composite", 1.0),
    "decoupled": ("reward/decoupled", 1.0),
    "rollout_s": ("time_metrics/rollout_s", 1.0),
    "reward_s": ("time_metrics/reward_s", 1.0),
    "train_s": ("time_metrics/train_s", 1.0),
    "clips_per_s": ("throughput/clips_per_s", 1.0),
    "train_tflops": ("tflops", 1.0),
    "mfu": ("mfu(%)", 100.0),
    "gpu_mem_gb": ("memory/gpu_used(GiB)", 1.0),
    "gpu_util": ("gpu/util(%)", 1.0),
    "gpu_power_w": ("gpu/power(W)", 1.0),
    "ema_decay": ("optim/ema_decay", 1.0),
    "skipped_groups": ("skipped/groups", 1.0),
    "skipped_updates": ("skipped/updates", 1.0),
    "clip": ("data/clip", 1.0),
}


def tracked_scalars(row: dict) -> dict[str, float]:
    """The numbers of a metrics row (all but ``step``) under their :data:`TAGS` names."""
    out = {}
    for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            tag, scale = TAGS.get(key, (f"misc/{key}", 1.0))
            out[tag] = value * scale
    return out


class Tracker(Protocol):
    """An experiment tracker fed by :class:`MetricsLog`."""

    def scalars(self, values: dict[str, float], step: int) -> None: ...

    def image(self, tag: str, path: Path, step: int) -> None: ...

    def checkpoint(self, path: Path, step: int) -> None:
        """A checkpoint the run just wrote, for trackers that keep them."""
        ...

    def state(self) -> dict:
        """What a resumed run needs to continue this tracker's run (kept in the checkpoint)."""
        ...

    def close(self) -> None: ...


class TensorBoardLog:
    """Scalars and images as TensorBoard events under ``directory``, the run config (given
    ``config``) as a JSON text summary at ``resume_step`` (0 for a new run); on resume, events
    after the resumed step are dropped."""

    def __init__(self, directory: str | Path, *, resume_step: int | None = None,
                 config: dict | None = None) -> None:
        require("tensorboard", user="train.loggers tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(directory), purge_step=purge)
        if config is not None:
            text = "```json\n" + json.dumps(config, indent=2) + "\n```"
            self.writer.add_text("config", text, global_step=resume_step or 0)
            self.writer.flush()

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def image(self, tag: str, path: Path, step: int) -> None:
        """The PNG at ``path`` as an image summary."""
        import numpy as np
        from PIL import Image

        with Image.open(path) as picture:
            pixels = np.asarray(picture.convert("RGB"))
        self.writer.add_image(tag, pixels, global_step=step, dataformats="HWC")
        self.writer.flush()

    def checkpoint(self, path: Path, step: int) -> None:
        """TensorBoard keeps no files."""

    def state(self) -> dict:
        return {}

    def close(self) -> None:
        self.writer.close()


def _wandb_key_configured() -> bool:
    """Whether W&B has an API key: ``WANDB_API_KEY`` or a ``wandb login`` entry in the netrc
    file (``NETRC`` or ``~/.netrc``) for the W&B host (``WANDB_BASE_URL``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str | None:
    """The ``mode`` given to ``wandb.init``: ``None`` when the user set ``WANDB_MODE`` (wandb
    reads it), else ``online`` with an API key configured and ``offline`` without one."""
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if _wandb_key_configured() else "offline"


class WandbLog:
    """Scalars, images and the run config in a Weights & Biases run (the ``wandb`` extra).

    It works without a network: a ``WANDB_MODE`` set by the user is honoured; otherwise the run
    is offline unless an API key is configured (``WANDB_API_KEY`` or ``wandb login``), and
    ``wandb sync`` uploads it later. Run files go under ``WANDB_DIR`` if set, else under
    ``directory``; the project is ``WANDB_PROJECT`` or ``wc_fast``. Given ``run_id`` (kept in
    the checkpoint, see :meth:`state`) it continues that run; without one it starts a new run.
    """

    def __init__(self, directory: str | Path, *, config: dict, name: str,
                 run_id: str | None = None, project: str = "", entity: str = "",
                 group: str = "", tags: tuple[str, ...] = (), checkpoints: bool = False
                 ) -> None:
        self.wandb = wandb = require("wandb", user="train.loggers wandb")
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.checkpoints = checkpoints
        # empty settings are left to wandb, which reads WANDB_ENTITY and friends itself
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT", "wc_fast"),
                              entity=entity or None, group=group or None,
                              tags=list(tags) or None, name=name, id=run_id, resume="allow",
                              config=config, mode=wandb_mode(),
                              dir=os.environ.get("WANDB_DIR", str(directory)))

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def image(self, tag: str, path: Path, step: int) -> None:
        self.run.log({tag: self.wandb.Image(str(path))}, step=step)

    def checkpoint(self, path: Path, step: int) -> None:
        """With ``checkpoints``: the checkpoint folder as a model artifact of the run."""
        if not self.checkpoints:
            return
        artifact = self.wandb.Artifact(f"{self.run.id}-checkpoint", type="model",
                                       metadata={"step": step})
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact, aliases=[f"step_{step}", "latest"])

    def state(self) -> dict:
        return {"wandb_run_id": self.run.id}

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """Appends JSON rows (and their scalars to each of ``trackers``); on resume keeps only rows
    up to the resumed step.

    The file is rewritten atomically (a synced temporary renamed over it) when the log opens,
    so a crash then leaves the old rows or the kept ones. A last line torn by a crash or a full
    disk mid-append is dropped with a warning; any other unreadable line raises ``ValueError``
    naming the file and line.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None,
                 trackers: Sequence[Tracker] = ()) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = self.read() if resume_step is not None else []
        self.rows = [r for r in rows if r["step"] <= (resume_step or 0)]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in self.rows).encode())
        self.trackers = list(trackers)

    def read(self) -> list[dict]:
        """The rows of the file (none when it is absent)."""
        if not self.path.is_file():
            return []
        lines = self.path.read_bytes().split(b"\n")
        last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                    raise ValueError("not a row with an integer 'step'")
            except (ValueError, UnicodeDecodeError) as exc:
                if number == last:
                    warnings.warn(f"{self.path}: dropping its torn last line {number} (a run "
                                  f"stopped mid-write): {line[:80]!r}", stacklevel=2)
                    continue
                raise ValueError(f"{self.path} line {number} is not a metrics row: {exc}; "
                                 "repair or remove that line") from exc
            rows.append(row)
        return rows

    def append(self, row: dict) -> None:
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        values = tracked_scalars(row)
        for tracker in self.trackers:
            tracker.scalars(values, row["step"])

    def image(self, tag: str, path: Path, step: int) -> None:
        """The PNG at ``path`` to every tracker."""
        for tracker in self.trackers:
            tracker.image(tag, path, step)

    def checkpoint(self, path: Path, step: int) -> None:
        """A checkpoint just written, to every tracker."""
        for tracker in self.trackers:
            tracker.checkpoint(path, step)

    def state(self) -> dict:
        """The trackers' resume state, for the checkpoint."""
        return {k: v for tracker in self.trackers for k, v in tracker.state().items()}

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def _running_mean(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot_rewards(rows: list[dict], path: str | Path, loss_title: str = "loss"
                 ) -> Path | None:
    """Reward curves like the WorldCompass paper's Figure 2: IF and VQ per iteration, the loss
    (where an update was made; titled ``loss_title``, the update rule's), the motion spread of
    basic and composite groups, and the reader gap on the iterations that measured it
    (``train.reader_gap_every``), each point and their running mean."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = [(r["step"], r["reader_gap"]) for r in rows if r.get("reader_gap") is not None]
    fig, axes = plt.subplots(1, 5 if gaps else 4, figsize=(20 if gaps else 16, 3.2))
    for ax, key, title in zip(axes[:3], ("if_mean", "vq_mean", "loss"),
                              ("interaction following (IF)", "visual quality (VQ)", loss_title),
                              strict=True):
        # an iteration whose every update was skipped logs no loss (null)
        steps = [r["step"] for r in rows if r[key] is not None]
        values = [r[key] for r in rows if r[key] is not None]
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
    if gaps:
        # each point reads one iteration's groups, so it is noisy; the running mean over a
        # third of the points shows the trend (a policy learning to fool its reader)
        xs, ys = zip(*gaps, strict=True)
        axes[4].plot(xs, ys, "o", color="0.6", markersize=3)
        axes[4].plot(xs, _running_mean(list(ys), max(1, len(ys) // 3)), linewidth=2)
        axes[4].axhline(0.0, color="0.5", linestyle="--", linewidth=1)
        axes[4].set_title("reader gap (reward's reader - camera fit)")
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
