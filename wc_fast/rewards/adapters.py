"""Adapters to the real reward models of WorldCompass, for real video.

- :class:`DepthAnything3Estimator`: camera poses from Depth Anything 3 (``depth-anything-3``),
  a :class:`~wc_fast.rewards.estimators.CameraEstimator`.
- :class:`HPSv3Scorer`: per-frame human-preference scores from HPSv3 (``hpsv3``), a
  :class:`~wc_fast.rewards.critic.VisualQualityScorer`.

Both packages are imported only when an adapter is built, and both load weights from a local
path only (this package never downloads): a missing package raises ``ImportError`` naming the
``pip install`` command, a missing checkpoint ``FileNotFoundError`` naming the path.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch import Tensor


def _import(module: str, pip_name: str, user: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{user} needs the `{pip_name}` package (module `{module}`), which is "
                          f"not installed: `pip install {pip_name}`") from err


def _local_checkpoint(path: str | Path, what: str, hint: str) -> Path:
    checkpoint = Path(path).expanduser()
    if not checkpoint.exists():
        raise FileNotFoundError(f"{what} checkpoint not found at {checkpoint}; {hint}")
    return checkpoint


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def frames_to_uint8(frames: Tensor) -> np.ndarray:
    """``[..., C, H, W]`` in [-1, 1] -> ``[..., H, W, C]`` uint8 RGB images."""
    img = ((frames.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return img.movedim(-3, -1).numpy()


class DepthAnything3Estimator:
    """Camera poses of real video from a local Depth Anything 3 model.

    ``estimator(frames [n, T, C, H, W])`` -> c2w ``[n, T, 4, 4]`` float32, each clip's poses
    expressed relative to its first frame (first pose the identity). DA3 predicts world-to-camera
    extrinsics in the OpenCV convention, that of docs/design.md section 3. Its translations
    have the scale of the model's reconstruction, so translation thresholds for real video must
    be set for that scale.

    Args:
        checkpoint_path: a local DA3 model folder (as saved by ``from_pretrained``/hub download).
        device: where to run the model (default: CUDA when available).
        process_res: the resolution DA3 processes frames at.
    """

    def __init__(self, checkpoint_path: str | Path, *, device: str | None = None,
                 process_res: int = 504) -> None:
        api = _import("depth_anything_3.api", "depth-anything-3", "DepthAnything3Estimator")
        path = _local_checkpoint(checkpoint_path, "Depth Anything 3",
                                 "download a DA3 model folder (e.g. depth-anything/DA3-LARGE) on a "
                                 "machine with network access and pass its local path")
        self.device = device or _default_device()
        self.process_res = process_res
        self.model = api.DepthAnything3.from_pretrained(str(path)).to(self.device).eval()

    def __call__(self, frames: Tensor) -> Tensor:
        if frames.dim() != 5:
            raise ValueError(f"frames must be [n, T, C, H, W], got {tuple(frames.shape)}")
        images = frames_to_uint8(frames)
        poses = []
        for clip in images:
            prediction = self.model.inference(list(clip), process_res=self.process_res)
            w2c = torch.eye(4, dtype=torch.float64).repeat(len(clip), 1, 1)
            w2c[:, :3, :] = torch.as_tensor(np.asarray(prediction.extrinsics), dtype=torch.float64)
            c2w = torch.linalg.inv(w2c)
            poses.append(torch.linalg.inv(c2w[:1]) @ c2w)
        return torch.stack(poses).to(torch.float32)


class HPSv3Scorer:
    """Per-frame HPSv3 preference scores of real video from a local checkpoint.

    ``scorer(frames [n, T, C, H, W], prompt=None)`` -> ``[n, T]``: HPSv3's mean preference
    (its ``mu`` output) for each frame, judged against ``prompt`` (empty when None).

    Args:
        checkpoint_path: a local HPSv3 checkpoint file (e.g. ``HPSv3_7B.pth``).
        config_path: the HPSv3 inference config (default: the package's own).
        device: where to run the model (default: CUDA when available).
    """

    def __init__(self, checkpoint_path: str | Path, *, config_path: str | Path | None = None,
                 device: str | None = None) -> None:
        hpsv3 = _import("hpsv3", "hpsv3", "HPSv3Scorer")
        path = _local_checkpoint(checkpoint_path, "HPSv3",
                                 "download HPSv3_7B.pth (MizzenAI/HPSv3) on a machine with network "
                                 "access and pass its local path")
        self.device = device or _default_device()
        self.inferencer = hpsv3.HPSv3RewardInferencer(
            config_path=None if config_path is None else str(config_path),
            checkpoint_path=str(path), device=self.device)

    def __call__(self, frames: Tensor, prompt: str | None = None) -> Tensor:
        from PIL import Image

        if frames.dim() != 5:
            raise ValueError(f"frames must be [n, T, C, H, W], got {tuple(frames.shape)}")
        n, t = frames.shape[:2]
        images = [Image.fromarray(img) for img in frames_to_uint8(frames.flatten(0, 1))]
        with torch.no_grad():
            rewards = self.inferencer.reward(prompts=[prompt or ""] * len(images),
                                             image_paths=images)
        return torch.as_tensor(rewards)[:, 0].float().cpu().reshape(n, t)
