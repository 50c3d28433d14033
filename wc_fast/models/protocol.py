"""What the trainer needs from a world model, and the shared-history KV cache it works with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import Tensor, nn


@dataclass(slots=True)
class ContextCache:
    """Keys/values of the clean history, one copy shared by every candidate.

    ``keys[i]``, ``values[i]``: layer ``i``'s ``[1, H, P, Dh]`` (``P`` history tokens, already
    position-encoded). ``num_frames``: history frames, the position of the next frame.
    ``signature``: the sizes of the model that built it, checked on use. ``last_frame``: the
    last history frame ``[1, C, H, W]`` (``None`` when empty), the next clip's reference frame.
    """

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    num_frames: int = 0
    signature: tuple = ()
    last_frame: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@runtime_checkable
class WorldModel(Protocol):
    """An action-conditioned, clip-autoregressive flow-matching video model.

    Frames are ``[B, F, C, H, W]``: pixels in [-1, 1], or latents of a :class:`FrameCodec`;
    actions are ids 0..80 (docs/design.md section 5), one
    per frame; ``sigma`` is the flow-matching noise level (1 = pure noise).
    """

    clip_frames: int
    clip_shape: tuple[int, int, int, int]  # (F, C, H, W) of one clip
    motion_latent: bool  # velocity() takes motion= latents [B, 3]
    context_sigma: float  # the noise level the clean history is seen at

    def bound_frames(self, frames: Tensor) -> Tensor:
        """Sampled clips ``[B, F, C, H, W]`` as they enter the history and the candidates
        (pixels clamped to [-1, 1]; latents unchanged)."""
        ...

    def parameters(self) -> Iterator[nn.Parameter]:
        """The model's parameters (their device is where sampling runs)."""
        ...

    def empty_cache(self) -> ContextCache:
        """A cache with no history."""
        ...

    def extend_cache(self, cache: ContextCache, frames: Tensor, actions: Tensor, *,
                     sigma: float) -> ContextCache:
        """Append clean history ``frames`` ``[1, F', C, H, W]`` (seen at noise ``sigma``)."""
        ...

    def velocity(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache, *,
                 motion: Tensor | None = None) -> Tensor:
        """Velocity ``[B, F, C, H, W]`` for ``B`` noisy clips sharing one ``cache``.

        ``motion``: latents ``[B, 3]``, required by (and only by) a ``motion_latent`` model
        (:mod:`wc_fast.models.motion_latent`); the sampler reads them from the initial noise.
        """
        ...


class FrameCodec(Protocol):
    """The map between a model's frames and the pixel frames the world and the rewards use."""

    def encode(self, frames: Tensor) -> Tensor:
        """Pixel frames ``[B, F, 3, H, W]`` in [-1, 1] -> the model's frames."""
        ...

    def decode(self, frames: Tensor) -> Tensor:
        """The model's frames ``[B, F, C', H', W']`` -> pixel frames ``[B, F, 3, H, W]`` in
        [-1, 1] at the rewards' resolution."""
        ...


class PixelFrames:
    """The codec of a model that works on pixels: both directions return their input."""

    def encode(self, frames: Tensor) -> Tensor:
        return frames

    def decode(self, frames: Tensor) -> Tensor:
        return frames
