"""The HunyuanVideo-1.5 VAE (diffusers' ``AutoencoderKLHunyuanVideo15``) as the
:class:`FrameCodec` of a WorldPlay run.

Latents are scaled as WorldPlay's pipeline scales them: ``z * scaling_factor`` on encoding (the
posterior's mode), ``z / scaling_factor`` before decoding. Frames map one to one, each encoded
and decoded as a one-frame video (the VAE's image case, one latent frame), as
:mod:`wc_fast.models.wan.vae` does for Wan; WorldPlay's own video compresses four frames into
one latent frame, which this world (one action per frame) does not model. diffusers 0.42's
VAE fails on a batch of more than one video (its mid-block attention mask does not broadcast
over the batch), so the frames go through it one at a time.

Decoded frames are resized to the world's square ``pixel_size`` (bilinear, antialiased).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLHunyuanVideo15
from torch import Tensor

from wc_fast.models.wan.model import component_dir, load_component, model_root

VAE_CLASS = "AutoencoderKLHunyuanVideo15"


def vae_dir(path: str | Path) -> Path:
    """``path/vae``, checked to hold a diffusers ``AutoencoderKLHunyuanVideo15``."""
    folder = model_root(path) / "vae"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} not found: a WorldPlay run needs HunyuanVideo-1.5's "
                                f"VAE as a diffusers {VAE_CLASS} in a vae/ subfolder of "
                                "model.path")
    return component_dir(folder, VAE_CLASS, f"a diffusers {VAE_CLASS} directory")


def spatial_factor(path: str | Path) -> int:
    """Pixels per latent along each side of the VAE in ``path/vae``."""
    config = AutoencoderKLHunyuanVideo15.load_config(vae_dir(path))
    return int(config.get("spatial_compression_ratio", 16))


class HunyuanLatentCodec:
    """Pixel frames <-> scaled HunyuanVideo-1.5 latents, frame by frame, without gradients.

    ``vae``: the VAE (eval mode, frozen); ``pixel_size``: the side of the world's square frames,
    a multiple of the VAE's spatial factor.
    """

    def __init__(self, vae: AutoencoderKLHunyuanVideo15, *, pixel_size: int) -> None:
        factor = vae.config.spatial_compression_ratio
        if pixel_size % factor:
            raise ValueError(f"pixel_size must be a multiple of the VAE's spatial factor "
                             f"{factor}, got {pixel_size}")
        self.vae = vae.eval().requires_grad_(False)
        self.pixel_size = pixel_size
        self.latent_size = (pixel_size // factor, pixel_size // factor)
        self.scale = float(vae.config.scaling_factor)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, pixel_size: int,
                        device: torch.device | str = "cpu") -> HunyuanLatentCodec:
        """The fp32 VAE of ``path/vae``, from local files only."""
        vae = load_component(AutoencoderKLHunyuanVideo15, vae_dir(path)).to(device)
        return cls(vae, pixel_size=pixel_size)

    @property
    def _param(self) -> Tensor:
        return next(self.vae.parameters())

    @torch.no_grad()
    def encode(self, frames: Tensor) -> Tensor:
        """Pixel frames ``[B, F, 3, H, W]`` in [-1, 1] -> scaled latents ``[B, F, z, h, w]``
        (fp32)."""
        b, f = frames.shape[:2]
        videos = frames.flatten(0, 1).unsqueeze(2).to(self._param)
        z = torch.cat([self.vae.encode(v[None]).latent_dist.mode() for v in videos]).float()
        return (z * self.scale).squeeze(2).unflatten(0, (b, f))

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Scaled latents ``[B, F, z, h, w]`` -> pixel frames ``[B, F, 3, S, S]`` in [-1, 1]
        (fp32) at ``pixel_size`` ``S``."""
        b, f = latents.shape[:2]
        z = (latents.flatten(0, 1).unsqueeze(2).float() / self.scale).to(self._param)
        pixels = torch.cat([self.vae.decode(v[None]).sample for v in z]).squeeze(2).float()
        if pixels.shape[-2:] != (self.pixel_size, self.pixel_size):
            pixels = F.interpolate(pixels, size=(self.pixel_size, self.pixel_size),
                                   mode="bilinear", antialias=True, align_corners=False)
        return pixels.clamp(-1, 1).unflatten(0, (b, f))
