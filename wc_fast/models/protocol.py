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
    """An action-conditioned, clip-autoregressive flow-matching video model: everything the
    trainer, the sampler, the optimizers, the distributed code and the evaluation use.

    Frames are ``[B, F, C, H, W]``: pixels in [-1, 1], or latents of a :class:`FrameCodec`;
    actions are ids 0..80 (docs/design.md section 5), one per frame; ``sigma`` is the
    flow-matching noise level (1 = pure noise). A model is an ``nn.Module`` (``parameters``,
    ``state_dict``, ``to``, ``train``/``eval`` are torch's). :func:`check_world_model` checks
    a model against this protocol once, naming what is missing; ``tests/test_conformance.py``
    runs the same behavioural checks on every backbone.
    """

    clip_frames: int
    clip_shape: tuple[int, int, int, int]  # (F, C, H, W) of one clip
    motion_latent: bool  # velocity() takes motion= latents [B, 3]
    context_sigma: float  # the noise level the clean history is seen at
    # the per-candidate keywords velocity() takes to explore camera motion: "action_offset"
    # (every model) and "affine_offset" (the embedded model's warp head)
    exploration_inputs: frozenset[str]

    def parameters(self) -> Iterator[nn.Parameter]:
        """The model's parameters (their device is where sampling runs)."""
        ...

    def bound_frames(self, frames: Tensor) -> Tensor:
        """Sampled clips ``[B, F, C, H, W]`` as they enter the history and the candidates
        (pixels clamped to [-1, 1]; latents unchanged)."""
        ...

    # -- history -----------------------------------------------------------------------------

    def empty_cache(self) -> ContextCache:
        """A cache with no history."""
        ...

    def extend_cache(self, cache: ContextCache, frames: Tensor, actions: Tensor, *,
                     sigma: float) -> ContextCache:
        """Append clean history ``frames`` ``[1, F', C, H, W]`` (seen at noise ``sigma``)."""
        ...

    def build_cache_parallel(self, frames: Tensor, actions: Tensor, *, sigma: float
                             ) -> ContextCache:
        """The cache :meth:`extend_cache` builds from empty for ``frames`` ``[1, F', C, H, W]``
        (prompt frame first), in one block-causal forward; differentiable (the train phase
        rebuilds the history under the current model)."""
        ...

    # -- prediction --------------------------------------------------------------------------

    def velocity(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache, *,
                 motion: Tensor | None = None, action_offset: Tensor | None = None) -> Tensor:
        """Velocity ``[B, F, C, H, W]`` for ``B`` noisy clips sharing one ``cache``.

        ``sigma`` ``[B]``; ``actions`` ``[B, F]`` or ``[F]``. ``motion``: latents ``[B, 3]``,
        required by (and only by) a ``motion_latent`` model
        (:mod:`wc_fast.models.motion_latent`). ``action_offset`` ``[B, 8]``: added to each
        row's movement-key intensities over the clip
        (:func:`wc_fast.models.clips.pressed_keys`), the exploration every backbone supports.
        """
        ...

    def teacher_forced_velocity(self, frames: Tensor, actions: Tensor, x_t: Tensor,
                                sigma: Tensor, *, context_sigma: float) -> Tensor:
        """Velocity ``[B, N*F, C, H, W]`` of every noisy clip ``x_t`` of a sequence given its
        clean history ``frames`` ``[B, 1 + N*F, C, H, W]``, in one masked forward
        (pretraining); ``sigma`` ``[B, N]``."""
        ...

    # -- cost, optimizers, sharding ----------------------------------------------------------

    def velocity_flops(self, batch: int, prefix_tokens: int) -> float:
        """Matmul FLOPs of :meth:`velocity` for ``batch`` clips over ``prefix_tokens`` of
        history."""
        ...

    def history_flops(self, frames: int) -> float:
        """Matmul FLOPs of :meth:`build_cache_parallel` over a ``frames``-frame history."""
        ...

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The hidden layers' 2-D weights: the ones Muon orthogonalises (AdamW takes the
        rest)."""
        ...

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """The weights between the command (and noise level) and the network: what
        ``optim.trainable conditioning`` trains."""
        ...

    def shard_units(self) -> list[nn.Module]:
        """The submodules FSDP2 shards as units of their own (each called as a module in every
        forward)."""
        ...

    def fresh_copy(self) -> WorldModel:
        """A new model of the same architecture and options, on the CPU, its weights freshly
        initialised: what a gathered full state dict is loaded into."""
        ...


# every member of the protocol, checked by check_world_model
WORLD_MODEL_MEMBERS = ("clip_frames", "clip_shape", "motion_latent", "context_sigma",
                       "exploration_inputs", "parameters", "bound_frames", "empty_cache",
                       "extend_cache", "build_cache_parallel", "velocity",
                       "teacher_forced_velocity", "velocity_flops", "history_flops",
                       "hidden_matrices", "conditioning_parameters", "shard_units",
                       "fresh_copy")
EXPLORATION_INPUTS = ("action_offset", "affine_offset")


def check_world_model(model: object) -> None:
    """Raise ``TypeError`` naming every :class:`WorldModel` member ``model`` lacks (checked
    once, where a model enters the trainer or the evaluation)."""
    missing = [name for name in WORLD_MODEL_MEMBERS if not hasattr(model, name)]
    if missing:
        raise TypeError(f"{type(model).__name__} is not a WorldModel: it lacks "
                        f"{', '.join(missing)} (see wc_fast.models.protocol.WorldModel)")
    unknown = set(model.exploration_inputs) - set(EXPLORATION_INPUTS)
    if "action_offset" not in model.exploration_inputs or unknown:
        raise TypeError(f"{type(model).__name__}.exploration_inputs must include "
                        f"'action_offset' and name only {EXPLORATION_INPUTS}, got "
                        f"{sorted(model.exploration_inputs)}")


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
