"""TinyWorldDiT: a small block-causal, action-conditioned video DiT with a shared KV cache.

Frames ``[B, F, C, H, W]`` are patchified into ``F * g * g`` tokens (``g = H / patch``). Each
block is adaLN-Zero modulated per frame by ``embed(sigma) + embed(keys of that frame)``
(WorldPlay style: the action embedding is added to the timestep embedding; compositional: the
sum of one learned vector per pressed key, so a key combination is conditioned by its keys
even when pretraining rarely showed it), attends with 3D
RoPE over (frame, row, column), fully inside a clip and causally across clips. The history is
a :class:`ContextCache` with ONE copy of every layer's keys/values, shared by all candidate
rows through :func:`wc_kernels.prefix_attention`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from wc_fast.actions import NUM_ACTIONS, label_to_bits, split_action
from wc_fast.config import PREDICTIONS, ModelConfig
from wc_fast.models.clips import (
    check_action_offset,
    check_actions,
    chunk_reference,
    history_chunks,
    history_mask,
    masked_attend,
    pressed_keys,
    sequence_reference,
    teacher_forced_layout,
    trim_history,
)
from wc_fast.models.motion_latent import LATENTS
from wc_fast.models.protocol import ContextCache
from wc_fast.models.rope import apply_rope, rope_tables
from wc_kernels import prefix_attention
from wc_kernels.reference import compute_dtype

PROMPT_ACTION = NUM_ACTIONS  # embedding id of the first (prompt) frame, which has no action
# smallest sigma an x0-predicting model divides by: bounds the velocity's gain near sigma = 0
X0_MIN_SIGMA = 0.05
POSE_GAIN = 40.0  # pixels of affine flow at the image edge per unit of pose-branch weight
GELU_TANH_SCALE = 2 * math.sqrt(2 / math.pi)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sigma_embedding(sigma: Tensor, dim: int = 256) -> Tensor:
    """Sinusoidal embedding ``[B, dim]`` of ``1000 * sigma`` (the diffusion timestep)."""
    half = dim // 2
    acc = torch.promote_types(sigma.dtype, torch.float32)
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device, dtype=acc)
                      / half)
    args = 1000.0 * sigma.to(acc)[:, None] * freqs[None, :]
    return torch.cat([args.cos(), args.sin()], dim=1)


def warp(frames: Tensor, flow: Tensor) -> Tensor:
    """Backward-warp ``frames`` ``[B, F, C, H, W]`` by ``flow`` ``[B, F, 2, H, W]`` in pixels:
    output pixel ``(y, x)`` samples ``frames`` at ``(y + flow_y, x + flow_x)`` (bilinear,
    border values outside)."""
    b, f, c, h, w = frames.shape
    ys, xs = torch.meshgrid(torch.arange(h, device=flow.device, dtype=flow.dtype),
                            torch.arange(w, device=flow.device, dtype=flow.dtype), indexing="ij")
    x = (xs + flow[:, :, 0] + 0.5) * (2.0 / w) - 1.0
    y = (ys + flow[:, :, 1] + 0.5) * (2.0 / h) - 1.0
    grid = torch.stack([x, y], dim=-1).reshape(b * f, h, w, 2)
    out = F.grid_sample(frames.reshape(b * f, c, h, w), grid, mode="bilinear",
                        padding_mode="border", align_corners=False)
    return out.reshape(b, f, c, h, w)


def key_table() -> Tensor:
    """``[82, 9]`` float: the keys pressed by each action id (4 translation then 4 rotation
    primitives, see :mod:`wc_fast.actions`), and row 81 (the prompt frame) in column 8."""
    trans, rot = split_action(torch.arange(NUM_ACTIONS))
    keys = torch.cat([label_to_bits(trans), label_to_bits(rot)], dim=-1).float()
    table = torch.zeros(NUM_ACTIONS + 1, 9)
    table[:NUM_ACTIONS, :8] = keys
    table[PROMPT_ACTION, 8] = 1.0
    return table


def accumulate_over_clips(flow: Tensor, clip_frames: int) -> Tensor:
    """Per-frame flow increments ``[B, N*F, 2, H, W]`` -> the flow of each frame from the
    clip's reference frame: the running sum within each clip of ``clip_frames`` frames.

    The head predicts one frame's motion at a time, so a camera turn is the same increment on
    every frame of a clip; frame 4's larger displacement is the sum, not a separate target.
    """
    b, n = flow.shape[:2]
    return flow.unflatten(1, (n // clip_frames, clip_frames)).cumsum(2).flatten(1, 2)


def affine_flow(params: Tensor, size: int) -> Tensor:
    """Per-frame affine flow fields ``[B, F, 2, size, size]`` in pixels from ``params``
    ``[B, F, 6]``: ``flow_x = p0 + p1 u + p2 v``, ``flow_y = p3 + p4 u + p5 v`` with ``u, v``
    the pixel centre's offset from the image centre in pixels.

    A camera turn moves the whole view by a few pixels per frame; one shared shift gets the
    gradient of every pixel, where a per-pixel flow only sees its local image gradient.
    """
    offsets = torch.arange(size, device=params.device, dtype=params.dtype) + 0.5 - size / 2
    v, u = torch.meshgrid(offsets, offsets, indexing="ij")
    basis = torch.stack([torch.ones_like(u), u, v])  # [3, size, size]
    return torch.einsum("bfak,khw->bfahw", params.unflatten(-1, (2, 3)), basis)


@dataclasses.dataclass(frozen=True, slots=True)
class WarpParts:
    """What a warp head (``prediction="warp"``) draws a clip from, each ``[B, F, ...]``: the
    flow ``[B, F, 2, H, W]`` of every frame from its reference frame (pixels, a backward map,
    x first: :func:`warp`'s), the reference frames warped by it and the residual added to them
    (both ``[B, F, C, H, W]``). The head's clip is ``warped + residual``."""

    flow: Tensor
    warped: Tensor
    residual: Tensor


class TanhGELU(nn.Module):
    """GELU with the tanh approximation: ``0.5 x (1 + tanh(u)) = x sigmoid(2u)``,
    ``u = sqrt(2/pi) (x + 0.044715 x^3)``.

    Eagerly this is ``F.gelu(approximate="tanh")``. Under ``torch.compile`` it is written in the
    sigmoid form, the same function, which the compiler turns into a faster forward and
    backward than its tanh form on CPU (docs/experiment_log.md).
    """

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return x * torch.sigmoid(GELU_TANH_SCALE * (x + 0.044715 * x * x * x))
        return F.gelu(x, approximate="tanh")


class Linear(nn.Linear):
    """``nn.Linear`` whose bias add is its own op under ``torch.compile``.

    The compiler then fuses the add into the element-wise kernel that follows (norm, GELU,
    gated residual). As one ``addmm``, the CPU kernel first copies the broadcast bias into the
    output: one more pass over every activation (docs/experiment_log.md).
    """

    def forward(self, x: Tensor) -> Tensor:
        if self.bias is None or not torch.compiler.is_compiling():
            return super().forward(x)
        out = F.linear(x, self.weight)
        return out + self.bias.to(out.dtype)


class Attention(nn.Module):
    """Multi-head attention with q/k RMS norm and RoPE, over a shared prefix plus own tokens."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = Linear(dim, 3 * dim)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.proj = Linear(dim, dim)

    def qkv_heads(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """``x`` ``[B, N, D]`` -> q, k, v ``[B, H, N, Dh]`` with RoPE (cos, sin tables) on q, k."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        acc = compute_dtype(v.dtype)
        q = apply_rope(self.q_norm(q.to(acc)).to(v.dtype), *rope)
        k = apply_rope(self.k_norm(k.to(acc)).to(v.dtype), *rope)
        return q, k, v

    def merge_heads(self, out: Tensor) -> Tensor:
        b, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    """adaLN-Zero transformer block; modulation is per frame."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(Linear(dim, 4 * dim), TanhGELU(), Linear(4 * dim, dim))
        self.modulation = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    @staticmethod
    def _modulate(x: Tensor, shift: Tensor, scale: Tensor, frames: int) -> Tensor:
        """LayerNorm (fp32), then a per-frame affine: ``x`` ``[B, N, D]``, ``[B, F, D]``."""
        b, n, d = x.shape
        acc = compute_dtype(x.dtype)
        h = F.layer_norm(x.to(acc), (d,), eps=1e-6).reshape(b, frames, n // frames, d)
        h = torch.addcmul(shift[:, :, None].to(acc), h, 1 + scale[:, :, None].to(acc))
        return h.reshape(b, n, d).to(x.dtype)

    @staticmethod
    def _gated_residual(x: Tensor, y: Tensor, gate: Tensor, frames: int) -> Tensor:
        """``x + gate * y`` with a per-frame ``gate`` ``[B, F, D]``, in one fused pass."""
        b, n, d = y.shape
        shape = (b, frames, n // frames, d)
        return torch.addcmul(x.reshape(shape), y.reshape(shape), gate[:, :, None]).reshape(b, n, d)

    def forward(self, x: Tensor, cond: Tensor, rope: tuple[Tensor, Tensor], attend
                ) -> tuple[Tensor, Tensor, Tensor]:
        """``x`` ``[B, N, D]``, ``cond`` ``[B, F, D]``, ``rope`` the (cos, sin) tables
        ``[N, Dh/2]``; ``attend(q, k, v)`` does the attention.

        Returns the new tokens and this block's position-encoded keys/values ``[B, H, N, Dh]``.
        """
        frames = cond.shape[1]
        sa, ca, ga, sm, cm, gm = self.modulation(F.silu(cond)).chunk(6, dim=-1)
        q, k, v = self.attn.qkv_heads(self._modulate(x, sa, ca, frames), rope)
        x = self._gated_residual(x, self.attn.merge_heads(attend(q, k, v)), ga, frames)
        x = self._gated_residual(x, self.mlp(self._modulate(x, sm, cm, frames)), gm, frames)
        return x, k, v


class TinyWorldDiT(nn.Module):
    """Small video DiT implementing :class:`wc_fast.models.WorldModel`."""

    def __init__(self, cfg: ModelConfig, *, attention_backend: str = "auto") -> None:
        super().__init__()
        if cfg.resolution % cfg.patch or cfg.dim % cfg.heads:
            raise ValueError("model.resolution must be a multiple of model.patch and model.dim "
                             "a multiple of model.heads")
        if cfg.prediction not in PREDICTIONS:
            raise ValueError(f"model.prediction must be one of {PREDICTIONS}, got "
                             f"{cfg.prediction!r}")
        if cfg.pose_branch and cfg.prediction != "warp":
            raise ValueError("model.pose_branch adds to the warp's affine flow: it needs "
                             "model.prediction='warp'")
        if cfg.prediction == "warp" and not cfg.reference_frame:
            raise ValueError("model.prediction='warp' warps the reference frame: it needs "
                             "model.reference_frame=True")
        self.cfg = cfg
        self.clip_frames = cfg.clip_frames
        self.grid = cfg.resolution // cfg.patch
        self.tokens_per_frame = self.grid * self.grid
        self.attention_backend = attention_backend
        patch_dim = cfg.channels * cfg.patch * cfg.patch
        self.patch_embed = nn.Linear(patch_dim * (2 if cfg.reference_frame else 1), cfg.dim)
        self.sigma_mlp = nn.Sequential(nn.Linear(256, cfg.dim), nn.SiLU(),
                                       nn.Linear(cfg.dim, cfg.dim))
        self.register_buffer("keys_of_action", key_table(), persistent=False)
        # one vector per key (and one for the prompt frame), summed over the pressed keys; unit
        # scale, like nn.Embedding's default: at GPT-style 0.02 the actions are drowned by the
        # sigma embedding they are added to and have no measurable effect on the prediction
        # for the first few hundred steps of pretraining
        self.key_embed = nn.Linear(9, cfg.dim, bias=False)
        nn.init.normal_(self.key_embed.weight, std=1.0)
        if cfg.motion_latent:
            # the generated clip's motion latents (speed, turn rate, onset; see
            # wc_fast.models.motion_latent), zero-initialised: a model pretrained without them
            # starts unchanged
            self.motion_embed = nn.Linear(LATENTS, cfg.dim)
            nn.init.zeros_(self.motion_embed.weight)
            nn.init.zeros_(self.motion_embed.bias)
        self.blocks = nn.ModuleList(Block(cfg.dim, cfg.heads) for _ in range(cfg.depth))
        self.final_modulation = nn.Linear(cfg.dim, 2 * cfg.dim)
        # "warp" adds a 2-channel flow per pixel to the clean-clip residual, plus a global
        # affine flow per frame read from the frame's mean token
        flow_dim = 2 * cfg.patch * cfg.patch if cfg.prediction == "warp" else 0
        self.out = nn.Linear(cfg.dim, patch_dim + flow_dim)
        zero_init = [self.final_modulation, self.out]
        if cfg.prediction == "warp":
            self.affine_flow = nn.Linear(cfg.dim, 6)
            zero_init.append(self.affine_flow)
        for layer in zero_init:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        if cfg.pose_branch:
            self._build_pose_branch()

    def _build_pose_branch(self) -> None:
        """The zero-initialised map from a frame's pressed keys to its affine flow, in units of
        :data:`POSE_GAIN` pixels at the image edge: an optimizer step of a given size then
        moves a shift and a zoom by comparable displacements."""
        self.pose_flow = nn.Linear(9, 6, bias=False, device=self.key_embed.weight.device,
                                   dtype=self.key_embed.weight.dtype)
        nn.init.zeros_(self.pose_flow.weight)
        edge = POSE_GAIN / (self.cfg.resolution / 2)
        self.register_buffer("pose_scale", torch.tensor(
            [POSE_GAIN, edge, edge, POSE_GAIN, edge, edge],
            device=self.key_embed.weight.device), persistent=False)

    def add_pose_branch(self) -> None:
        """Switch ``cfg.pose_branch`` on for a model built without it (a zero branch: the
        model's output is unchanged)."""
        if self.cfg.pose_branch:
            raise ValueError("this model already has a pose branch")
        if self.cfg.prediction != "warp":
            raise ValueError("model.pose_branch adds to the warp's affine flow: it needs "
                             "model.prediction='warp'")
        self.cfg = dataclasses.replace(self.cfg, pose_branch=True)
        self._build_pose_branch()

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The 2-D weights of hidden layers (the transformer blocks and the sigma MLP): the
        ones Muon orthogonalises. The key embedding, the input patch projection and every
        output head (final modulation, pixels and flow, affine flow) are not."""
        return [p for module in (self.sigma_mlp, self.blocks) for p in module.parameters()
                if p.ndim == 2]

    def shard_units(self) -> list[nn.Module]:
        """The submodules FSDP2 shards as units of their own (each called as a module in every
        forward, so its parameters are gathered just before use): the transformer blocks."""
        return list(self.blocks)

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """The weights between the command and the network: the key and motion-latent
        embeddings and the adaLN modulation of every block and of the output head. They set
        what each action (and latent) does to every frame, but not how a frame is drawn."""
        modules = [self.key_embed, *(b.modulation for b in self.blocks), self.final_modulation]
        if self.cfg.motion_latent:
            modules.append(self.motion_embed)
        if self.cfg.pose_branch:
            modules.append(self.pose_flow)
        return [p for module in modules for p in module.parameters()]

    @property
    def context_sigma(self) -> float:
        """The noise level the clean history is seen at (``cfg.context_sigma``)."""
        return self.cfg.context_sigma

    def bound_frames(self, frames: Tensor) -> Tensor:
        """Sampled frames as history and candidates: clamped to the pixel range [-1, 1]."""
        return frames.clamp(-1, 1)

    @property
    def signature(self) -> tuple:
        c = self.cfg
        return (c.resolution, c.channels, c.patch, c.dim, c.depth, c.heads, c.history_window)

    @property
    def clip_shape(self) -> tuple[int, int, int, int]:
        """``(F, C, H, W)`` of one generated clip."""
        c = self.cfg
        return (c.clip_frames, c.channels, c.resolution, c.resolution)

    @property
    def motion_latent(self) -> bool:
        """Whether :meth:`velocity` takes motion latents (read from each clip's noise)."""
        return self.cfg.motion_latent

    @property
    def exploration_inputs(self) -> frozenset[str]:
        """The per-candidate keywords of :meth:`velocity` that explore camera motion: the
        action offset, and with a warp head its affine offset."""
        warp = {"affine_offset"} if self.cfg.prediction == "warp" else set()
        return frozenset({"action_offset", *warp})

    def fresh_copy(self) -> TinyWorldDiT:
        """A new, freshly initialised model of this configuration on the CPU."""
        return TinyWorldDiT(self.cfg, attention_backend=self.attention_backend)

    # -- shapes and conditioning ------------------------------------------------------------

    def _check_frames(self, name: str, frames: Tensor) -> None:
        c = self.cfg
        if frames.dim() != 5 or tuple(frames.shape[2:]) != (c.channels, c.resolution,
                                                             c.resolution):
            raise ValueError(f"{name} must have shape [B, F, {c.channels}, {c.resolution}, "
                             f"{c.resolution}], got {tuple(frames.shape)}")

    def _check_cache(self, cache: ContextCache) -> None:
        if cache.signature != self.signature:
            raise ValueError(f"cache was built by a model with sizes {cache.signature}, this "
                             f"model has {self.signature} (resolution, channels, patch, dim, "
                             "depth, heads, history window)")

    def _conditioning(self, sigma: Tensor, actions: Tensor, motion: Tensor | None = None,
                      action_offset: Tensor | None = None) -> Tensor:
        """``sigma`` ``[B]`` or ``[B, F]``, ``actions`` ``[B, F]``, ``motion`` latents
        ``[B, F, 3]`` (models with ``motion_latent``; ``None``: zeros, as for clean history
        frames), ``action_offset`` ``[B, 8]`` (see :func:`pressed_keys`) -> condition
        ``[B, F, D]``."""
        b, f = actions.shape
        per_frame = sigma.reshape(b, -1).expand(b, f).reshape(-1)
        t = self.sigma_mlp(sigma_embedding(per_frame)).reshape(b, f, -1)
        keys = pressed_keys(self.keys_of_action, actions, action_offset)
        cond = t + self.key_embed(keys.to(self.key_embed.weight.dtype))
        if self.cfg.motion_latent:  # clean history frames: zero latents
            if motion is None:
                motion = cond.new_zeros(b, f, LATENTS)
            cond = cond + self.motion_embed(motion.to(self.motion_embed.weight.dtype))
        return cond

    def _check_motion(self, motion: Tensor | None, *lead: int) -> Tensor | None:
        """Motion latents ``[*lead, 3]`` of the clips a head predicts (required by, and only
        by, a ``motion_latent`` model)."""
        if not self.cfg.motion_latent:
            if motion is not None:
                raise ValueError("motion latents given to a model without model.motion_latent")
            return None
        want = (*lead, LATENTS)
        if not isinstance(motion, Tensor) or tuple(motion.shape) != want:
            raise ValueError(f"this model (model.motion_latent) needs motion latents of shape "
                             f"{list(want)} (read from each clip's initial noise), got "
                             f"{tuple(motion.shape) if isinstance(motion, Tensor) else motion}")
        return motion

    def patchify(self, frames: Tensor) -> Tensor:
        """``[B, F, C, H, W]`` -> tokens ``[B, F*g*g, C*p*p]`` (frame-major, then row, column)."""
        b, f, c, _, _ = frames.shape
        p, g = self.cfg.patch, self.grid
        x = frames.reshape(b, f, c, g, p, g, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.reshape(b, f * g * g, c * p * p)

    def unpatchify(self, tokens: Tensor, frames: int, channels: int | None = None) -> Tensor:
        """Tokens ``[B, F*g*g, c*p*p]`` -> ``[B, F, c, H, W]`` (``c`` defaults to the frames')."""
        b = tokens.shape[0]
        p, g = self.cfg.patch, self.grid
        c = self.cfg.channels if channels is None else channels
        x = tokens.reshape(b, frames, g, g, c, p, p).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, frames, c, g * p, g * p)

    def _autocast(self, device: torch.device):
        dtype = DTYPES[self.cfg.dtype]
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def velocity_flops(self, batch: int, prefix_tokens: int) -> float:
        """Forward FLOPs of :meth:`velocity` for ``batch`` clips over ``prefix_tokens`` of history.

        Every matmul of the forward (2 FLOPs per multiply-add): the per-token linears, the
        per-frame conditioning and modulation, the output head, and attention over the
        history plus the clip's own tokens (scores and weighted sum).
        """
        tokens = batch * self.clip_frames * self.tokens_per_frame
        keys = prefix_tokens + self.clip_frames * self.tokens_per_frame
        return self._forward_flops(batch * self.clip_frames, tokens * keys, head=True)

    def history_flops(self, frames: int) -> float:
        """Forward FLOPs of building the cache of a ``frames``-frame history from empty (no
        output head), counting the keys each chunk attends to (its own and earlier chunks)."""
        sizes = self._chunks(self.empty_cache(), frames)
        t = self.tokens_per_frame
        pairs = sum(size * t * end * t
                    for size, end in zip(sizes, itertools.accumulate(sizes), strict=True))
        return self._forward_flops(frames, pairs, head=False)

    def _forward_flops(self, frames: int, attended_pairs: int, head: bool) -> float:
        """FLOPs of one forward over ``frames`` frames whose tokens attend to
        ``attended_pairs`` (query, key) pairs in all; ``head``: the output head runs."""
        c = self.cfg
        d, tokens = c.dim, frames * self.tokens_per_frame
        patch = c.channels * c.patch**2
        flops = 2 * frames * (256 * d + d * d)  # sigma embedding MLP
        flops += 2 * frames * self.key_embed.in_features * d  # key embedding
        if c.motion_latent:
            flops += 2 * frames * LATENTS * d  # motion latent embedding
        flops += 2 * tokens * patch * (2 if c.reference_frame else 1) * d  # patch embedding
        per_layer = 2 * frames * d * 6 * d + 24 * tokens * d * d + 4 * attended_pairs * d
        flops += c.depth * per_layer
        if head:
            flow = 2 * c.patch**2 if c.prediction == "warp" else 0
            flops += 2 * frames * d * 2 * d + 2 * tokens * d * (patch + flow)
            if c.prediction == "warp":  # affine parameters and their flow fields
                flops += 2 * frames * d * 6 + 2 * frames * 6 * c.resolution**2
        return float(flops)

    # -- history ------------------------------------------------------------------------------

    def empty_cache(self) -> ContextCache:
        return ContextCache(signature=self.signature)

    def _chunks(self, cache: ContextCache, frames: int) -> list[int]:
        """Split ``frames`` new history frames into causal chunks: prompt frame, then clips."""
        return history_chunks(cache.num_frames, frames, self.clip_frames)

    def extend_cache(self, cache: ContextCache, frames: Tensor, actions: Tensor, *,
                     sigma: float) -> ContextCache:
        """Append clean history ``frames`` ``[1, F', C, H, W]`` with ``actions`` ``[1, F']``.

        An empty cache takes the prompt frame first (action ignored), then whole clips; each
        chunk attends to everything before it and to itself (block-causal). Returns a new
        cache; gradients flow into it when grad mode is on.
        """
        self._check_cache(cache)
        self._check_frames("frames", frames)
        if frames.shape[0] != 1:
            raise ValueError(f"history frames are shared: batch must be 1, got {frames.shape[0]}")
        actions = check_actions(actions, 1, frames.shape[1]).clone()
        if cache.num_frames == 0:
            actions[:, 0] = PROMPT_ACTION
        start = 0
        for size in self._chunks(cache, frames.shape[1]):
            cache = self._append_chunk(cache, frames[:, start:start + size],
                                       actions[:, start:start + size], sigma)
            start += size
        return cache

    def build_cache_parallel(self, frames: Tensor, actions: Tensor, *, sigma: float
                             ) -> ContextCache:
        """The cache :meth:`extend_cache` builds from empty, in ONE block-causal forward.

        All chunks run together with a mask (a token sees its own chunk and earlier ones):
        fewer, larger matmuls than chunk by chunk.
        """
        self._check_frames("frames", frames)
        if frames.shape[0] != 1:
            raise ValueError(f"history frames are shared: batch must be 1, got {frames.shape[0]}")
        actions = check_actions(actions, 1, frames.shape[1]).clone()
        actions[:, 0] = PROMPT_ACTION
        window = self.cfg.history_window
        attend = masked_attend(history_mask(frames.shape[1], self.clip_frames, frames.device,
                                            window), self.tokens_per_frame)
        sig = self._history_sigma(sigma, frames.device)
        _, _, keys, values = self._trunk(frames, sig, actions, self.empty_cache(), attend=attend,
                                         reference=self._sequence_reference(frames))
        keys, values = trim_history(keys, values, window, self.tokens_per_frame)
        return ContextCache(keys=keys, values=values, num_frames=frames.shape[1],
                            signature=self.signature, last_frame=frames[:, -1])

    def teacher_forced_velocity(self, frames: Tensor, actions: Tensor, x_t: Tensor,
                                sigma: Tensor, *, context_sigma: float,
                                motion: Tensor | None = None) -> Tensor:
        """Velocity of every clip of a sequence given its clean history, in one forward.

        ``frames`` ``[B, 1 + N*F, C, H, W]`` clean (prompt first), ``actions`` ``[B, N*F]``,
        ``x_t`` ``[B, N*F, C, H, W]`` noisy clips at ``sigma`` ``[B, N]`` -> ``[B, N*F, ...]``.
        Noisy clip ``j`` sees the clean prompt and clean clips ``< j`` (at ``context_sigma``)
        and itself, exactly what :meth:`velocity` sees with a cache of that history. ``motion``
        ``[B, N, 3]``: each noisy clip's motion latents (``motion_latent`` models only).
        """
        self._check_frames("frames", frames)
        self._check_frames("x_t", x_t)
        b, total = frames.shape[:2]
        f = self.clip_frames
        if (total - 1) % f or x_t.shape[:2] != (b, total - 1):
            raise ValueError(f"frames must be [B, 1 + N*{f}] and x_t [B, N*{f}], got "
                             f"{tuple(frames.shape[:2])} and {tuple(x_t.shape[:2])}")
        n = (total - 1) // f
        if tuple(sigma.shape) != (b, n):
            raise ValueError(f"sigma must have shape [{b}, {n}] (one per clip), got "
                             f"{tuple(sigma.shape)}")
        actions = check_actions(actions, b, total - 1)
        device = frames.device
        frame_motion = None
        if self._check_motion(motion, b, n) is not None:
            # the clean history carries no latents (zeros); each noisy clip its own
            frame_motion = torch.cat([motion.new_zeros(b, total, LATENTS),
                                      motion.repeat_interleave(f, dim=1)], dim=1)
        prompt = torch.full((b, 1), PROMPT_ACTION, dtype=actions.dtype, device=device)
        all_actions = torch.cat([prompt, actions, actions], dim=1)
        all_sigma = torch.cat([torch.full((b, total), float(context_sigma), device=device,
                                          dtype=sigma.dtype),
                               sigma.repeat_interleave(f, dim=1)], dim=1)
        positions, frame_mask = teacher_forced_layout(total, f, device, self.cfg.history_window)
        attend = masked_attend(frame_mask, self.tokens_per_frame)
        reference = self._sequence_reference(frames)
        if reference is not None:
            # noisy clip j refers to the last frame before it, as clean clip j does
            reference = torch.cat([reference, reference[:, 1:]], dim=1)
        x, cond, _, _ = self._trunk(torch.cat([frames, x_t], dim=1), all_sigma, all_actions,
                                    self.empty_cache(), attend=attend, positions=positions,
                                    reference=reference, motion=frame_motion)
        out = self._head(x, cond, reference, all_actions, first=total)
        return self._as_velocity(out, x_t, sigma.repeat_interleave(f, dim=1))

    def _append_chunk(self, cache: ContextCache, frames: Tensor, actions: Tensor,
                      sigma: float) -> ContextCache:
        sig = self._history_sigma(sigma, frames.device)
        _, _, keys, values = self._trunk(frames, sig, actions, cache,
                                         reference=self._cache_reference(cache, frames))
        if cache.keys:
            keys = [torch.cat([old, new], dim=2) for old, new in zip(cache.keys, keys,
                                                                     strict=True)]
            values = [torch.cat([old, new], dim=2) for old, new in zip(cache.values, values,
                                                                       strict=True)]
        keys, values = trim_history(keys, values, self.cfg.history_window, self.tokens_per_frame)
        return ContextCache(keys=keys, values=values,
                            num_frames=cache.num_frames + frames.shape[1],
                            signature=self.signature, last_frame=frames[:, -1])

    # -- prediction ---------------------------------------------------------------------------

    def velocity(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache, *,
                 motion: Tensor | None = None, action_offset: Tensor | None = None,
                 affine_offset: Tensor | None = None) -> Tensor:
        """Velocity ``[B, F, C, H, W]`` (fp32; fp64 for an fp64 model) of ``B`` noisy clips.

        ``x_t`` ``[B, F, C, H, W]`` with ``F`` the clip length, ``sigma`` ``[B]``,
        ``actions`` ``[B, F]`` or ``[F]`` (one command shared by all rows), ``motion`` the
        clips' motion latents ``[B, 3]`` (only for a ``motion_latent`` model).
        ``action_offset`` ``[B, 8]``: added to each row's movement-key intensities
        (:func:`~wc_fast.models.clips.pressed_keys`; ``rollout.action_exploration``).
        ``affine_offset`` ``[B, 6]``: added to every frame's affine flow parameters
        (:func:`affine_flow`; ``prediction="warp"`` only), a camera motion imposed on each
        row, which rollouts use to explore (``rollout.warp_exploration``).
        """
        x, cond, reference, actions, action_offset = self._clip_trunk(
            x_t, sigma, actions, cache, motion, action_offset, affine_offset)
        out = self._head(x, cond, reference, actions, affine_offset=affine_offset,
                         action_offset=action_offset)
        return self._as_velocity(out, x_t, sigma[:, None].expand(x_t.shape[:2]))

    def warp_parts(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache, *,
                   motion: Tensor | None = None, action_offset: Tensor | None = None,
                   affine_offset: Tensor | None = None) -> WarpParts:
        """The warp head's flow, warped reference and residual (:class:`WarpParts`) on the
        noisy clips ``x_t``, whose sum is the clean clip :meth:`velocity` moves towards (the
        sampler's last step lands on it); arguments as :meth:`velocity`'s.
        ``prediction="warp"`` only."""
        if self.cfg.prediction != "warp":
            raise ValueError(f"warp_parts needs a model with prediction='warp', this one has "
                             f"{self.cfg.prediction!r}")
        x, cond, reference, actions, action_offset = self._clip_trunk(
            x_t, sigma, actions, cache, motion, action_offset, affine_offset)
        return self._head_parts(x, cond, reference, actions, affine_offset=affine_offset,
                                action_offset=action_offset)

    def _clip_trunk(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache,
                    motion: Tensor | None, action_offset: Tensor | None,
                    affine_offset: Tensor | None
                    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor | None]:
        """Checks :meth:`velocity`'s arguments and runs the trunk on the noisy clips: its tokens,
        per-frame condition, the reference frames, and the checked actions ``[B, F]`` and
        action offset, what the head reads."""
        self._check_cache(cache)
        self._check_frames("x_t", x_t)
        b, f = x_t.shape[:2]
        if f != self.clip_frames:
            raise ValueError(f"x_t must hold one clip of {self.clip_frames} frames, got {f}")
        if not isinstance(sigma, Tensor) or tuple(sigma.shape) != (b,):
            raise ValueError(f"sigma must be a tensor of shape [{b}], got "
                             f"{tuple(sigma.shape) if isinstance(sigma, Tensor) else sigma!r}")
        actions = check_actions(actions, b, f)
        motion = self._check_motion(motion, b)
        action_offset = check_action_offset(action_offset, b)
        if affine_offset is not None and (self.cfg.prediction != "warp" or not isinstance(
                affine_offset, Tensor) or tuple(affine_offset.shape) != (b, 6)):
            raise ValueError(f"affine_offset must be a [{b}, 6] tensor for a model with "
                             f"prediction='warp' (this one: {self.cfg.prediction!r}), got "
                             f"{getattr(affine_offset, 'shape', affine_offset)}")
        reference = self._cache_reference(cache, x_t)
        x, cond, _, _ = self._trunk(
            x_t, sigma, actions, cache, reference=reference,
            motion=None if motion is None else motion[:, None].expand(b, f, -1),
            action_offset=action_offset)
        return x, cond, reference, actions, action_offset

    def _as_velocity(self, out: Tensor, x_t: Tensor, sigma: Tensor) -> Tensor:
        """The head's output ``[B, F, C, H, W]`` as a velocity, given per-frame ``sigma``
        ``[B, F]``: unchanged for ``prediction="velocity"``; for ``"x0"`` the clean-clip
        estimate becomes ``(x_t - x0) / max(sigma, X0_MIN_SIGMA)`` (``x_t = (1-s) x0 + s eps``,
        ``v = eps - x0``)."""
        if self.cfg.prediction == "velocity":
            return out  # "x0" and "warp" predict the clean clip
        scale = sigma.to(out.dtype).clamp_min(X0_MIN_SIGMA)[:, :, None, None, None]
        return (x_t.to(out.dtype) - out) / scale

    def _history_sigma(self, sigma: float, device: torch.device) -> Tensor:
        """The history's noise level as ``[1]``, in the accumulation dtype (fp64 for an fp64
        model), so the cached and teacher-forced paths embed the same value."""
        return torch.full((1,), float(sigma), device=device,
                          dtype=compute_dtype(self.patch_embed.weight.dtype))

    def _cache_reference(self, cache: ContextCache, frames: Tensor) -> Tensor | None:
        """Reference frames ``[1, F, C, H, W]`` for a chunk that follows ``cache``
        (:func:`chunk_reference`); ``None`` without reference frames."""
        if not self.cfg.reference_frame:
            return None
        return chunk_reference(cache.last_frame, frames)

    def _sequence_reference(self, frames: Tensor) -> Tensor | None:
        """Reference frames of a whole history ``[B, T, C, H, W]`` (:func:`sequence_reference`);
        ``None`` without reference frames."""
        if not self.cfg.reference_frame:
            return None
        return sequence_reference(frames, self.clip_frames)

    def _trunk(self, frames: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache,
               attend=None, positions: Tensor | None = None, reference: Tensor | None = None,
               motion: Tensor | None = None, action_offset: Tensor | None = None
               ) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
        """All blocks on one chunk per row ``[B, F, C, H, W]`` against the history in ``cache``.

        ``sigma`` ``[B]`` or per frame ``[B, F]``. ``attend(q, k, v)`` replaces the
        shared-prefix attention and ``positions`` ``[F]`` the frame positions when given
        (masked whole-sequence variants). ``reference`` ``[B or 1, F, C, H, W]``: each frame's
        reference frame, concatenated channel-wise (models with ``reference_frame``).
        Returns the last block's tokens ``[B, F*T, D]``, the per-frame condition ``[B, F, D]``
        and every block's keys and values (what a cache stores).
        """
        b, f = frames.shape[:2]
        device = frames.device
        if positions is None:
            positions = torch.arange(cache.num_frames, cache.num_frames + f, device=device)
        param_dtype = self.patch_embed.weight.dtype
        rope = rope_tables(positions, self.grid, self.cfg.dim // self.cfg.heads,
                           compute_dtype(param_dtype))
        cond = self._conditioning(sigma.to(param_dtype), actions, motion, action_offset)
        with self._autocast(device):
            tokens = self.patchify(frames.to(param_dtype))
            if reference is not None:
                ref = self.patchify(reference.to(param_dtype)).expand(b, -1, -1)
                tokens = torch.cat([tokens, ref], dim=-1)
            x = self.patch_embed(tokens)
            keys, values = [], []
            # model.activation_checkpointing: in a forward that builds a graph, each block keeps
            # only its input and runs again in the backward
            rerun = self.cfg.activation_checkpointing and torch.is_grad_enabled()
            for i, block in enumerate(self.blocks):
                args = (x, cond, rope, attend or self._prefix_attend(cache, i, x))
                x, k, v = (checkpoint(block, *args, use_reentrant=False) if rerun
                           else block(*args))
                keys.append(k)
                values.append(v)
        return x, cond, keys, values

    def _head(self, x: Tensor, cond: Tensor, reference: Tensor | None, actions: Tensor,
              first: int = 0, affine_offset: Tensor | None = None,
              action_offset: Tensor | None = None) -> Tensor:
        """The output head on frames ``first:`` of the trunk's tokens ``x`` ``[B, F*T, D]``,
        condition ``cond`` and actions ``[B, F]``: the clip ``[B, F - first, C, H, W]``
        (velocity, x0, or for ``warp`` the reference frames warped by the predicted flow,
        plus ``affine_offset`` ``[B, 6]`` when given, plus a residual: :meth:`_head_parts`)."""
        if self.cfg.prediction != "warp":
            out, _ = self._head_tokens(x, cond, first)
            return self.unpatchify(out, cond.shape[1] - first)
        parts = self._head_parts(x, cond, reference, actions, first, affine_offset,
                                 action_offset)
        return parts.warped + parts.residual

    def _head_tokens(self, x: Tensor, cond: Tensor, first: int) -> tuple[Tensor, Tensor]:
        """The head's output tokens ``[B, N*T, O]`` (accumulation dtype) on frames ``first:``
        and the modulated tokens ``[B, N*T, D]`` they are read from."""
        n = cond.shape[1] - first
        acc = compute_dtype(self.patch_embed.weight.dtype)
        with self._autocast(x.device):
            shift, scale = self.final_modulation(F.silu(cond[:, first:])).chunk(2, dim=-1)
            h = Block._modulate(x[:, first * self.tokens_per_frame:], shift, scale, n)
            return self.out(h).to(acc), h

    def _head_parts(self, x: Tensor, cond: Tensor, reference: Tensor, actions: Tensor,
                    first: int = 0, affine_offset: Tensor | None = None,
                    action_offset: Tensor | None = None) -> WarpParts:
        """A warp head's parts on frames ``first:`` (arguments as :meth:`_head`'s): the flow
        (the unpatchified flow channels plus the affine flow of each frame's mean token, the
        pose branch's and ``affine_offset``, summed over each clip's frames), the reference
        frames warped by it, and the residual."""
        out, h = self._head_tokens(x, cond, first)
        b, n = cond.shape[0], cond.shape[1] - first
        with self._autocast(x.device):
            frame_tokens = h.reshape(b, n, self.tokens_per_frame, -1).mean(dim=2)
            affine = self.affine_flow(frame_tokens).to(out.dtype)
            if self.cfg.pose_branch:
                keys = pressed_keys(self.keys_of_action, actions[:, first:], action_offset)
                affine = affine + (self.pose_flow(keys.to(self.pose_flow.weight.dtype))
                                   * self.pose_scale).to(out.dtype)
            if affine_offset is not None:
                affine = affine + affine_offset[:, None].to(out.dtype)
        c = self.cfg.channels
        residual = self.unpatchify(out[..., :c * self.cfg.patch ** 2], n)
        flow = self.unpatchify(out[..., c * self.cfg.patch ** 2:], n, channels=2)
        flow = accumulate_over_clips(flow + affine_flow(affine, self.cfg.resolution),
                                     self.clip_frames)
        reference = reference[:, first:].to(out.dtype).expand(b, -1, -1, -1, -1)
        return WarpParts(flow=flow, warped=warp(reference, flow), residual=residual)

    def _prefix_attend(self, cache: ContextCache, layer: int, x: Tensor):
        """Attention of the rows' own tokens plus layer ``layer``'s shared history."""
        if cache.keys:
            prefix_k, prefix_v = cache.keys[layer], cache.values[layer]
        else:
            heads, head_dim = self.cfg.heads, self.cfg.dim // self.cfg.heads
            prefix_k = prefix_v = x.new_zeros(1, heads, 0, head_dim)

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return prefix_attention(q, k, v, prefix_k.to(q.dtype), prefix_v.to(q.dtype),
                                    backend=self.attention_backend)

        return attend
