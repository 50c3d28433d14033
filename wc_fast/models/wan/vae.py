"""The Wan VAE (diffusers' ``AutoencoderKLWan``) as the :class:`FrameCodec` of a Wan run.

The world prompt is encoded to latents once per group; candidates are decoded to pixels only
for the rewards. Latents are normalised as diffusers' Wan pipelines do: ``(z - latents_mean) /
latents_std`` on encoding (the posterior's mode, as the image-to-video pipeline encodes its
condition), ``z * latents_std + latents_mean`` before decoding.

Frames map one to one: every frame is encoded and decoded as a one-frame video (frames
folded into the batch). The VAE is causal with temporal compression 4 (``1 + 4k`` frames ->
``1 + k`` latent frames), and a one-frame video is its first-frame (image) case, so one
latent frame is one frame whatever ``temperal_downsample`` says and every latent frame has its
own action. A real Wan run would compress time (four frames per latent frame, one action per
four frames); that is not built.

The reward models read the embedded world's frames (``model.resolution`` square), so decoded
frames are resized to that size (bilinear, antialiased). A run at Wan's own resolution would
score its frames with reward adapters at that resolution (DA3, HPSv3); not built either.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan
from torch import Tensor

from wc_fast.models.wan.model import component_dir, load_component, model_root

VAE_CLASS = "AutoencoderKLWan"


def vae_dir(path: str | Path) -> Path:
    """The VAE's directory ``path/vae`` of a diffusers pipeline directory, checked by
    :func:`component_dir`; ``FileNotFoundError`` names what is missing."""
    folder = model_root(path) / "vae"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} not found: a Wan run needs the pipeline's "
                                f"{VAE_CLASS} in a vae/ subfolder of model.path")
    return component_dir(folder, VAE_CLASS, f"a diffusers {VAE_CLASS} directory")


def spatial_factor(path: str | Path) -> int:
    """The pixels per latent along each side of the VAE in ``path/vae`` (from its config)."""
    return int(AutoencoderKLWan.load_config(vae_dir(path))["scale_factor_spatial"])


class WanLatentCodec:
    """Pixel frames <-> normalised Wan latents, frame by frame, without gradients.

    ``vae``: the ``AutoencoderKLWan`` (kept in eval mode, frozen); ``pixel_size``: the side of
    the square frames the world gives and the rewards read, a multiple of the VAE's spatial
    factor.
    """

    # frames the VAE decodes at once: a 12-candidate group at 480 px (60 frames) in one batch
    # held 90 GiB of the decoder's activations (python -m studies.memory --preset wan)
    decode_frames = 8

    def __init__(self, vae: AutoencoderKLWan, *, pixel_size: int) -> None:
        factor = vae.config.scale_factor_spatial
        if pixel_size % factor:
            raise ValueError(f"pixel_size must be a multiple of the VAE's spatial factor "
                             f"{factor}, got {pixel_size}")
        self.vae = vae.eval().requires_grad_(False)
        self.pixel_size = pixel_size
        self.latent_size = (pixel_size // factor, pixel_size // factor)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        self.mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(shape)
        self.std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(shape)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, pixel_size: int,
                        device: torch.device | str = "cpu") -> WanLatentCodec:
        """The fp32 VAE of the diffusers pipeline directory ``path`` (its ``vae/``), from local
        files only."""
        vae = load_component(AutoencoderKLWan, vae_dir(path)).to(device)
        return cls(vae, pixel_size=pixel_size)

    @property
    def _param(self) -> Tensor:
        return next(self.vae.parameters())

    @torch.no_grad()
    def encode(self, frames: Tensor) -> Tensor:
        """Pixel frames ``[B, F, 3, H, W]`` in [-1, 1] -> normalised latents ``[B, F, z, h, w]``
        (fp32)."""
        b, f = frames.shape[:2]
        videos = frames.flatten(0, 1).unsqueeze(2).to(self._param)
        z = self.vae.encode(videos).latent_dist.mode().float()
        z = (z - self.mean.to(z.device)) / self.std.to(z.device)
        return z.squeeze(2).unflatten(0, (b, f))

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents ``[B, F, z, h, w]`` -> pixel frames ``[B, F, 3, S, S]`` in [-1, 1]
        (fp32) at ``pixel_size`` ``S``."""
        b, f = latents.shape[:2]
        z = latents.flatten(0, 1).unsqueeze(2).float()
        z = z * self.std.to(z.device) + self.mean.to(z.device)
        pixels = torch.cat([self.vae.decode(part.to(self._param)).sample
                            for part in z.split(self.decode_frames)]).squeeze(2).float()
        if pixels.shape[-2:] != (self.pixel_size, self.pixel_size):
            pixels = F.interpolate(pixels, size=(self.pixel_size, self.pixel_size),
                                   mode="bilinear", antialias=True, align_corners=False)
        return pixels.clamp(-1, 1).unflatten(0, (b, f))
