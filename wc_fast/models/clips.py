"""Clip-level layout shared by the block-causal world models.

A history starts with one prompt frame, then whole clips of ``clip_frames`` frames; each chunk
(the prompt, then each clip) attends to itself and to every earlier chunk, or, with a history
window of ``W`` frames (``model.history_window``), to the last ``W`` history frames before it.
These helpers compute that layout once for every model that follows it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from wc_fast.actions import NUM_ACTIONS
from wc_fast.models.protocol import ContextCache
from wc_kernels._checks import values_checkable

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]
MOVEMENT_KEYS = 8  # W, S, D, A, then yaw right, yaw left, pitch up, pitch down


def check_action_offset(offset: Tensor | None, b: int) -> Tensor | None:
    """A per-row offset ``[B, 8]`` of the movement keys' intensities (or ``None``).

    Raises ``TypeError`` for a non-float tensor and ``ValueError`` for a wrong shape.
    """
    if offset is None:
        return None
    if not isinstance(offset, Tensor) or not offset.dtype.is_floating_point:
        got = offset.dtype if isinstance(offset, Tensor) else type(offset).__name__
        raise TypeError(f"action_offset must be a floating-point tensor, got {got}")
    if tuple(offset.shape) != (b, MOVEMENT_KEYS):
        raise ValueError(f"action_offset must have shape [{b}, {MOVEMENT_KEYS}] (one offset per "
                         f"row and movement key), got {tuple(offset.shape)}")
    return offset


def pressed_keys(table: Tensor, actions: Tensor, offset: Tensor | None = None) -> Tensor:
    """Key intensities ``[B, F, K]`` of action ids ``[B, F]`` from a key table ``[ids, K]``
    (1 for a pressed key), plus a per-row ``offset`` ``[B, 8]`` on the movement keys of every
    frame: a soft change of the command held over the clip, which rollouts use to explore
    camera motion through the model's own action conditioning."""
    keys = table[actions]
    if offset is None:
        return keys
    pad = offset.new_zeros(offset.shape[0], keys.shape[-1] - MOVEMENT_KEYS)
    return keys + torch.cat([offset, pad], dim=-1).to(keys.dtype)[:, None]


def check_actions(actions: Tensor, b: int, frames: int) -> Tensor:
    """Integer action ids ``[B, F]`` or ``[F]`` (one command shared by all rows) -> ``[B, F]``.

    Raises ``TypeError`` for a non-integer tensor and ``ValueError`` for a wrong shape or an
    id outside 0..80.
    """
    if not isinstance(actions, Tensor) or actions.dtype.is_floating_point or (
            actions.dtype == torch.bool):
        got = actions.dtype if isinstance(actions, Tensor) else type(actions).__name__
        raise TypeError(f"actions must be integer ids 0..{NUM_ACTIONS - 1}, got {got}")
    if actions.dim() == 1:
        actions = actions.unsqueeze(0).expand(b, -1)
    if tuple(actions.shape) != (b, frames):
        raise ValueError(f"actions must have shape [{b}, {frames}] or [{frames}], got "
                         f"{tuple(actions.shape)}")
    if values_checkable() and actions.numel() and (
            int(actions.min()) < 0 or int(actions.max()) >= NUM_ACTIONS):
        raise ValueError(f"action ids must lie in 0..{NUM_ACTIONS - 1}")
    return actions


def history_chunks(cached_frames: int, frames: int, clip_frames: int) -> list[int]:
    """Split ``frames`` new history frames that follow ``cached_frames`` into causal chunks:
    the prompt frame (only when the history is empty), then whole clips."""
    first = [1] if cached_frames == 0 else []
    rest = frames - len(first)
    if rest < 0 or rest % clip_frames:
        lead = "1 prompt frame plus " if first else ""
        raise ValueError(f"history frames must be {lead}a multiple of the clip length "
                         f"{clip_frames}, got {frames}")
    return first + [clip_frames] * (rest // clip_frames)


def chunk_ids(frames: int, clip_frames: int, device: torch.device) -> Tensor:
    """Chunk index ``[T]`` of every frame of a history of ``frames`` that starts with the
    prompt frame."""
    sizes = history_chunks(0, frames, clip_frames)
    # built on the host from the sizes: no output size that depends on a tensor's values
    return torch.tensor([i for i, n in enumerate(sizes) for _ in range(n)], device=device)


def check_history_window(window: int) -> int:
    """``window`` must be an int >= 0 (history frames a chunk attends to; 0: all of them)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"history_window must be an int >= 0 (0 = the whole history), got "
                         f"{window!r}")
    return window


def _in_window(chunk: Tensor, start: Tensor, window: int) -> Tensor:
    """``[T, T]``: key frame ``k`` is in query frame ``q``'s window: its own chunk, or one of
    the ``window`` frames before that chunk's first frame (every frame for ``window`` 0)."""
    keys = torch.arange(chunk.shape[0], device=chunk.device)
    if window == 0:
        return torch.ones(chunk.shape[0], chunk.shape[0], dtype=torch.bool, device=chunk.device)
    return (chunk[:, None] == chunk[None, :]) | (keys[None, :] >= start[:, None] - window)


def _chunk_starts(chunk: Tensor) -> Tensor:
    """First frame ``[T]`` of every frame's chunk, for chunk ids ``[T]`` in order."""
    first = torch.ones_like(chunk, dtype=torch.bool)
    first[1:] = chunk[1:] != chunk[:-1]
    frames = torch.arange(chunk.shape[0], device=chunk.device)
    # the latest chunk start at or before each frame (no value-dependent indexing)
    return torch.where(first, frames, 0).cummax(0).values


def history_mask(frames: int, clip_frames: int, device: torch.device, window: int = 0
                 ) -> Tensor:
    """Frame-level mask ``[T, T]`` of a whole history: a frame sees its chunk and earlier ones
    (with ``window``, only the last ``window`` frames before its chunk)."""
    chunk = chunk_ids(frames, clip_frames, device)
    return (chunk[:, None] >= chunk[None, :]) & _in_window(chunk, _chunk_starts(chunk), window)


def trim_history(keys: list[Tensor], values: list[Tensor], window: int,
                 tokens_per_frame: int) -> tuple[list[Tensor], list[Tensor]]:
    """Cached per-layer keys and values ``[1, H, P, Dh]`` cut to their last ``window`` frames
    (unchanged for ``window`` 0): what the next chunk attends to, and all a long rollout keeps."""
    if window == 0:
        return keys, values
    cut = window * tokens_per_frame
    return [k[:, :, -cut:] for k in keys], [v[:, :, -cut:] for v in values]


def teacher_forced_layout(total: int, clip_frames: int, device: torch.device, window: int = 0
                          ) -> tuple[Tensor, Tensor]:
    """Frame positions ``[2T - 1]`` and frame-level mask ``[2T - 1, 2T - 1]`` of a sequence of
    ``total = T`` clean frames (prompt first) followed by the ``T - 1`` noisy frames of its
    clips.

    Clean frames see their chunk and earlier ones; noisy clip ``j`` sees the clean prompt, the
    clean clips before ``j`` and itself, at the positions of clean clip ``j``: exactly what it
    sees over a cache of its history (with ``window``, only the last ``window`` clean frames
    before clip ``j``, as a cache cut to that window holds).
    """
    positions = torch.cat([torch.arange(total, device=device),
                           torch.arange(1, total, device=device)])
    clean = chunk_ids(total, clip_frames, device)
    noisy = clean[1:]
    start = _chunk_starts(clean)
    noisy_sees = (noisy[:, None] > clean[None, :]) & _in_window(clean, start, window)[1:]
    sees_clean = torch.cat([history_mask(total, clip_frames, device, window), noisy_sees])
    sees_noisy = torch.cat([torch.zeros(total, total - 1, dtype=torch.bool, device=device),
                            noisy[:, None] == noisy[None, :]])
    return positions, torch.cat([sees_clean, sees_noisy], dim=1)


def masked_attend(frame_mask: Tensor, tokens_per_frame: int) -> Attend:
    """SDPA over ``[B, H, N, Dh]`` with a frame-level boolean mask ``[F, F]`` expanded to the
    ``tokens_per_frame`` tokens of every frame."""
    t = tokens_per_frame
    mask = frame_mask.repeat_interleave(t, dim=0).repeat_interleave(t, dim=1)

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return attend


def chunk_reference(last_frame: Tensor | None, frames: Tensor) -> Tensor:
    """Reference frames ``[1, F, C, H, W]`` of a chunk ``frames`` ``[1, F, C, H, W]`` that
    follows a history whose last frame is ``last_frame`` ``[1, C, H, W]``: that frame repeated,
    zeros when the history is empty (the prompt frame has no reference)."""
    f = frames.shape[1]
    if last_frame is None:
        return frames.new_zeros(1, f, *frames.shape[2:])
    return last_frame.to(frames.dtype)[:, None].expand(1, f, *frames.shape[2:])


def sequence_reference(frames: Tensor, clip_frames: int) -> Tensor:
    """Reference frames of a whole history ``[B, T, C, H, W]`` (prompt first, then clips of
    ``clip_frames``): zeros for the prompt, the previous chunk's last frame for every frame of
    a clip."""
    t = frames.shape[1]
    index = ((torch.arange(1, t, device=frames.device) - 1) // clip_frames) * clip_frames
    return torch.cat([torch.zeros_like(frames[:, :1]), frames[:, index]], dim=1)


def check_frames(name: str, frames: Tensor, clip_shape: tuple[int, ...]) -> None:
    """``frames`` must be a floating tensor ``[B, F, C, H, W]`` whose ``(C, H, W)`` are those of
    ``clip_shape`` ``(F, C, H, W)``."""
    if not isinstance(frames, Tensor) or not frames.dtype.is_floating_point:
        got = frames.dtype if isinstance(frames, Tensor) else type(frames).__name__
        raise TypeError(f"{name} must be a floating-point tensor, got {got}")
    c, h, w = clip_shape[1:]
    if frames.dim() != 5 or tuple(frames.shape[2:]) != (c, h, w):
        raise ValueError(f"{name} must have shape [B, F, {c}, {h}, {w}], got "
                         f"{tuple(frames.shape)}")


def check_cache(cache: ContextCache, signature: tuple) -> None:
    """``cache`` must have been built by a model of ``signature``."""
    if cache.signature != signature:
        raise ValueError(f"cache was built by a model with sizes {cache.signature}, this "
                         f"model has {signature}")

