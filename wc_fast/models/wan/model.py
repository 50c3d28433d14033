"""WanWorldModel: diffusers' ``WanTransformer3DModel`` as a block-causal, action-conditioned
world model over a shared history KV cache.

It works in the transformer's input space: clips are ``[B, F, C, H, W]`` with ``C`` the
transformer's ``in_channels``, latents of the Wan VAE (decoding them is the VAE's job, not this
module's) or, for the embedded model (:mod:`wc_fast.models.wan.embedded`), pixels. The
history is one prompt latent frame, then whole clips of ``clip_frames`` latent frames; each
chunk attends to itself and to earlier chunks. Every self-attention layer's keys and values
(after RoPE) of the clean history are kept once in a :class:`ContextCache` and shared by all
candidate rows through :func:`wc_kernels.prefix_attention`; the rows' RoPE frame positions
continue from the history's.

Actions enter WorldPlay style, as in :class:`TinyWorldDiT`: per frame, the sum of one learned
vector per pressed key, projected by a zero-initialised linear layer and added to the
transformer's timestep embedding ``temb`` before its modulation projection. Wan modulates per
sample; here every frame's tokens get the modulation of their own frame (sigma and action), so
the blocks run through :func:`block_forward`, which reuses each diffusers block's submodules
with the arithmetic of ``WanTransformerBlock.forward``. Text conditioning is a fixed tensor of
prompt embeddings (no text encoder).

LoRA (:meth:`WanWorldModel.add_lora`) goes through ``peft``, an optional dependency (the
``lora`` extra). Activation checkpointing reruns each block in the backward of a forward that
builds a graph.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.transformers.transformer_wan import WanAttention, _get_qkv_projections
from diffusers.utils import is_accelerate_available
from safetensors.torch import load_file
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from wc_fast.config import ModelConfig
from wc_fast.models.clips import (
    Attend,
    check_action_offset,
    check_actions,
    check_cache,
    check_frames,
    check_history_window,
    chunk_reference,
    history_chunks,
    history_mask,
    masked_attend,
    pressed_keys,
    sequence_reference,
    teacher_forced_layout,
    trim_history,
)
from wc_fast.models.lora import inject_lora, lora_parameters
from wc_fast.models.protocol import ContextCache
from wc_fast.models.tiny.dit import PROMPT_ACTION, key_table
from wc_kernels import prefix_attention
from wc_kernels._checks import values_checkable
from wc_kernels.reference import compute_dtype

# diffusers' flow-matching schedulers use timestep = sigma * num_train_timesteps
NUM_TRAIN_TIMESTEPS = 1000
TRANSFORMER_CLASS = "WanTransformer3DModel"

RopeTables = tuple[Tensor, Tensor]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Wan's RoPE on ``x`` ``[B, N, H, Dh]`` with tables ``[1, N, 1, Dh]``: consecutive pairs
    of channels rotate together (the arithmetic of diffusers' ``WanAttnProcessor``)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


class LayerAttention:
    """One self-attention layer's attention ``attend(q, k, v)`` over ``[B, H, N, Dh]`` that,
    with ``keep``, keeps the layer's position-encoded keys and values: what a cache stores
    (without, nothing outlives the call: a checkpointed block holds this object until its
    backward)."""

    def __init__(self, attend: Attend, keep: bool = True) -> None:
        self.attend, self.keep = attend, keep
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.keep:
            self.keys, self.values = k, v
        return self.attend(q, k, v)


class PrefixAttnProcessor:
    """Self-attention processor for ``WanAttention``: queries, keys and values as diffusers'
    ``WanAttnProcessor`` computes them (projections, RMS norm across heads, RoPE), the
    attention itself by the caller's ``attend`` (the shared-prefix kernel, or a masked SDPA
    for the whole-sequence paths)."""

    def __call__(self, attn: WanAttention, hidden_states: Tensor,
                 encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, rotary_emb: RopeTables | None = None, *,
                 attend: LayerAttention) -> Tensor:
        """``hidden_states`` ``[B, N, D]``, ``rotary_emb`` the (cos, sin) tables
        ``[1, N, 1, Dh]`` -> ``[B, N, D]``."""
        if encoder_hidden_states is not None or attention_mask is not None or rotary_emb is None:
            raise ValueError("PrefixAttnProcessor is for self-attention with RoPE tables; the "
                             "mask is the caller's attend")
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        # the RMS norms in their weights' dtype (fp32 weights under bf16 autocast)
        query = attn.norm_q(query.to(attn.norm_q.weight.dtype)).type_as(query)
        key = attn.norm_k(key.to(attn.norm_k.weight.dtype)).type_as(key)
        query = rotate(query.unflatten(2, (attn.heads, -1)), *rotary_emb)
        key = rotate(key.unflatten(2, (attn.heads, -1)), *rotary_emb)
        value = value.unflatten(2, (attn.heads, -1))
        out = attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def modulate(norm: nn.Module, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """``norm(x) * (1 + scale) + shift`` in fp32 with per-frame ``shift``, ``scale``
    ``[B, F, D]`` over the frame-major tokens ``x`` ``[B, N, D]``."""
    b, n, d = x.shape
    f = shift.shape[1]
    h = norm(x.float()).reshape(b, f, n // f, d)
    return (h * (1 + scale[:, :, None]) + shift[:, :, None]).reshape(b, n, d).type_as(x)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor) -> Tensor:
    """``x + y * gate`` in fp32 with a per-frame ``gate`` ``[B, F, D]``; ``x, y`` ``[B, N, D]``."""
    b, n, d = x.shape
    f = gate.shape[1]
    out = x.float().reshape(b, f, n // f, d) + y.float().reshape(b, f, n // f, d) * gate[:, :, None]
    return out.reshape(b, n, d).type_as(x)


def block_forward(block: nn.Module, x: Tensor, context: Tensor, modulation: Tensor,
                  rope: RopeTables, attend: LayerAttention) -> Tensor:
    """One ``WanTransformerBlock`` with per-frame modulation.

    ``x`` ``[B, N, D]`` (frame-major tokens), ``context`` the text tokens ``[B, L, D]``,
    ``modulation`` ``[B, F, 6, D]`` (the timestep projection of each frame). With every frame's
    modulation equal this is diffusers' ``WanTransformerBlock.forward``.
    """
    table = block.scale_shift_table.unsqueeze(0) + modulation.float()
    shift, scale, gate, c_shift, c_scale, c_gate = table.unbind(2)
    h = block.attn1(modulate(block.norm1, x, shift, scale), None, None, rope, attend=attend)
    x = gated_residual(x, h, gate)
    x = x + block.attn2(block.norm2(x.float()).type_as(x), context, None, None)
    return gated_residual(x, block.ffn(modulate(block.norm3, x, c_shift, c_scale)), c_gate)


def load_component(model_class: type[ModelMixin], folder: Path) -> ModelMixin:
    """The fp32 diffusers model of ``model_class`` saved in ``folder`` (checked by
    :func:`component_dir`), from local files only.

    diffusers' ``from_pretrained`` needs ``accelerate`` for the Wan transformer (its fp32-kept
    modules load through accelerate's empty-weight init); without it the model is built from
    its config and the safetensors shards are loaded strictly, which gives the same weights.
    """
    if is_accelerate_available():
        return model_class.from_pretrained(folder, local_files_only=True)
    model = model_class.from_config(model_class.load_config(folder))
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    model.load_state_dict(state, strict=True)
    return model


def component_dir(folder: Path, class_name: str, layout: str) -> Path:
    """``folder`` once it holds a diffusers ``class_name``: a ``config.json`` naming that class
    and safetensors weights.

    Raises ``FileNotFoundError`` naming what is missing (``layout`` says where the directory
    was expected) and ``ValueError`` when the config describes another class.
    """
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found: expected {layout}")
    if not any(folder.glob("*.safetensors")):
        raise FileNotFoundError(f"{folder} holds no weights (diffusion_pytorch_model*."
                                "safetensors)")
    name = json.loads(config.read_text()).get("_class_name", class_name)
    if name != class_name:
        raise ValueError(f"{config} describes a {name}, not a {class_name}")
    return folder


def model_root(path: str | Path) -> Path:
    """``path`` as a directory; ``FileNotFoundError`` when it is not one."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"Wan model directory {root} not found")
    return root


def transformer_dir(path: str | Path) -> Path:
    """The transformer's directory in ``path``: ``path/transformer`` of a diffusers pipeline
    directory, else ``path`` itself (a bare transformer directory), checked by
    :func:`component_dir`."""
    root = model_root(path)
    folder = root / "transformer" if (root / "transformer").is_dir() else root
    return component_dir(folder, TRANSFORMER_CLASS,
                         "a diffusers pipeline directory with a transformer/ subfolder, or a "
                         f"bare {TRANSFORMER_CLASS} directory")


class WanWorldModel(nn.Module):
    """A ``WanTransformer3DModel`` implementing :class:`wc_fast.models.WorldModel` on latents.

    ``clip_frames``: latent frames per generated clip; ``latent_size``: the latents' ``(H, W)``;
    ``prompt_embeds``: the fixed text-encoder output ``[1, L, text_dim]`` every frame
    cross-attends to (zeros ``[1, 1, text_dim]`` by default); ``context_sigma``: the noise
    level the clean history is seen at (``model.context_sigma`` of a run). The transformer's
    temporal patch must be 1 (each latent frame is its own token frame) and it must be
    text-to-video (no image cross-attention). ``activation_checkpointing``: rerun each block in
    the backward instead of keeping its activations, in forwards that build a graph.
    ``autocast_dtype``: the dtype the blocks' matmuls and attention run in (``torch.autocast``;
    bf16 on a GPU), with the weights, the modulation arithmetic and the outputs in fp32; the
    history cache then holds keys and values in that dtype. ``pixels``: the frames are pixels
    in [-1, 1] (the embedded model, :mod:`wc_fast.models.wan.embedded`), which
    :meth:`bound_frames` clamps; latents are left unbounded. ``cfg``: the
    :class:`~wc_fast.config.ModelConfig` the embedded model was built from (what its card
    stores), ``None`` for a backbone read from a diffusers directory. ``reference_frame``:
    every frame of a chunk also receives the last frame before the chunk (zeros for the
    prompt) concatenated to its channels, as Wan's image-to-video models take their
    conditioning image; the transformer then has twice as many input as output channels.
    ``history_window``: each chunk attends to only the last ``history_window`` history frames
    before it, and the cache keeps only those (0: the whole history); a model pretrained on
    short sequences then sees, deep into a rollout, the history lengths it was trained on.
    """

    motion_latent = False
    exploration_inputs = frozenset({"action_offset"})

    def __init__(self, transformer: WanTransformer3DModel, *, clip_frames: int,
                 latent_size: tuple[int, int], prompt_embeds: Tensor | None = None,
                 context_sigma: float = 0.0, attention_backend: str = "auto",
                 seed: int = 0, activation_checkpointing: bool = False,
                 autocast_dtype: torch.dtype = torch.float32, pixels: bool = False,
                 cfg: ModelConfig | None = None, reference_frame: bool = False,
                 history_window: int = 0) -> None:
        super().__init__()
        arch = transformer.config
        p_t, p_h, p_w = arch.patch_size
        height, width = latent_size
        if p_t != 1:
            raise ValueError(f"the transformer's temporal patch size must be 1, got {p_t}")
        if arch.image_dim is not None or arch.added_kv_proj_dim is not None:
            raise ValueError("image-conditioned (I2V) Wan transformers are not supported")
        if arch.in_channels != arch.out_channels * (2 if reference_frame else 1):
            raise ValueError(f"the transformer must have {'twice' if reference_frame else 'as'} "
                             f"as many input channels as output channels "
                             f"(reference_frame={reference_frame}), got {arch.in_channels} in "
                             f"and {arch.out_channels} out")
        if clip_frames < 1 or height % p_h or width % p_w:
            raise ValueError(f"clip_frames must be >= 1 and latent_size a multiple of the patch "
                             f"({p_h}, {p_w}), got {clip_frames} and {latent_size}")
        self.transformer = transformer
        self.pixels = pixels
        self.reference_frame = reference_frame
        self.cfg = cfg
        self.clip_frames = clip_frames
        self.history_window = check_history_window(history_window)
        self.context_sigma = context_sigma
        self.latent_size = (height, width)
        self.grid = (height // p_h, width // p_w)
        self.tokens_per_frame = self.grid[0] * self.grid[1]
        self.attention_backend = attention_backend
        self.activation_checkpointing = activation_checkpointing
        if autocast_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"autocast_dtype must be float32, bfloat16 or float16, got "
                             f"{autocast_dtype}")
        self.autocast_dtype = autocast_dtype
        self.seed = seed
        self.lora: tuple[int, float, tuple[str, ...]] | None = None
        param = transformer.patch_embedding.weight
        dim = arch.num_attention_heads * arch.attention_head_dim
        if prompt_embeds is None:
            prompt_embeds = torch.zeros(1, 1, arch.text_dim)
        if prompt_embeds.dim() != 3 or prompt_embeds.shape[0] != 1 or (
                prompt_embeds.shape[2] != arch.text_dim):
            raise ValueError(f"prompt_embeds must have shape [1, L, {arch.text_dim}], got "
                             f"{tuple(prompt_embeds.shape)}")
        self.register_buffer("prompt_embeds", prompt_embeds.to(param), persistent=False)
        self.register_buffer("keys_of_action", key_table(), persistent=False)
        # one unit-scale vector per key (and one for the prompt frame), summed over the pressed
        # keys, then a zero-initialised projection into the timestep embedding: the pretrained
        # backbone starts unchanged; the vectors come from ``seed``, so every process and every
        # run builds the same model
        self.key_embed = nn.Linear(9, dim, bias=False, device=param.device, dtype=param.dtype)
        with torch.no_grad():
            vectors = torch.randn(dim, 9, generator=torch.Generator().manual_seed(seed))
            self.key_embed.weight.copy_(vectors)
        self.action_proj = nn.Linear(dim, dim, device=param.device, dtype=param.dtype)
        nn.init.zeros_(self.action_proj.weight)
        nn.init.zeros_(self.action_proj.bias)
        for block in transformer.blocks:
            block.attn1.set_processor(PrefixAttnProcessor())

    @classmethod
    def from_pretrained(cls, path: str | Path, *, clip_frames: int, latent_size: tuple[int, int],
                        prompt_embeds: Tensor | None = None, context_sigma: float = 0.0,
                        attention_backend: str = "auto", seed: int = 0,
                        activation_checkpointing: bool = False,
                        autocast_dtype: torch.dtype = torch.float32,
                        history_window: int = 0) -> WanWorldModel:
        """The fp32 backbone from a local diffusers directory (see :func:`transformer_dir`),
        with fresh action layers drawn from ``seed`` (their projection is zero: the backbone's
        predictions unchanged). Nothing is downloaded; cast with ``.to(dtype)`` afterwards."""
        transformer = load_component(WanTransformer3DModel, transformer_dir(path))
        return cls(transformer, clip_frames=clip_frames, latent_size=latent_size,
                   prompt_embeds=prompt_embeds, context_sigma=context_sigma,
                   attention_backend=attention_backend, seed=seed,
                   activation_checkpointing=activation_checkpointing,
                   autocast_dtype=autocast_dtype, history_window=history_window)

    def lora_root(self) -> nn.Module:
        """The module whose linears :meth:`add_lora` adapts (the transformer): the root of the
        adapter's names in peft's format."""
        return self.transformer

    def add_lora(self, rank: int, alpha: float, targets: tuple[str, ...], *,
                 seed: int = 0) -> None:
        """LoRA adapters of ``rank`` on the transformer's linears named by ``targets`` (peft's
        ``target_modules``), scaled by ``alpha / rank`` (``alpha`` 0: the rank); then only the
        adapters and :meth:`conditioning_parameters` require a gradient.

        peft starts each adapter's second factor at zero, so the predictions are unchanged, and
        draws the first from the global generator, here seeded with ``seed`` (and restored
        afterwards) so that every process and every run builds the same adapters. A target that
        names no linear layer raises ``ValueError`` naming ``model.lora_targets``.
        """
        self.lora = (rank, alpha, tuple(targets))
        inject_lora(self.transformer, rank, alpha, targets, seed=seed)
        self.requires_grad_(False)
        for p in (*self.lora_parameters(), *self.conditioning_parameters()):
            p.requires_grad_(True)

    def fresh_copy(self) -> WanWorldModel:
        """A new model of this architecture and options on the CPU: a freshly initialised
        transformer of the same config, action layers drawn from the same seed, the same
        LoRA adapters."""
        copy = WanWorldModel(WanTransformer3DModel.from_config(self.transformer.config),
                             clip_frames=self.clip_frames, latent_size=self.latent_size,
                             prompt_embeds=self.prompt_embeds.cpu(),
                             context_sigma=self.context_sigma,
                             attention_backend=self.attention_backend, seed=self.seed,
                             activation_checkpointing=self.activation_checkpointing,
                             autocast_dtype=self.autocast_dtype, pixels=self.pixels,
                             cfg=self.cfg, reference_frame=self.reference_frame,
                             history_window=self.history_window)
        if self.lora is not None:
            copy.add_lora(*self.lora, seed=self.seed)
        return copy

    def lora_parameters(self) -> list[nn.Parameter]:
        """Both factors of every LoRA adapter (none without :meth:`add_lora`)."""
        return lora_parameters(self.transformer)

    # -- what the trainer needs ----------------------------------------------------------------

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The 2-D weights of the transformer blocks' attention and FFN linears: the ones Muon
        orthogonalises. The patch embedding, the condition embedders, the action layers and
        the output projection are not, nor are LoRA factors (AdamW trains them, as peft's
        recipes do: Muon's orthogonal update is meant for a whole weight matrix)."""
        lora = {id(p) for p in self.lora_parameters()}
        return [m.weight for block in self.transformer.blocks for m in block.modules()
                if isinstance(m, nn.Linear) and id(m.weight) not in lora]

    def shard_units(self) -> list[nn.Module]:
        """The submodules FSDP2 shards as units of their own: every block's self-attention,
        cross-attention and FFN. Not the blocks: :func:`block_forward` runs a block's parts
        with per-frame modulation instead of calling the block, so a block unit would never
        gather its parameters. Each block's norms and ``scale_shift_table`` stay with the
        root unit."""
        return [part for block in self.transformer.blocks
                for part in (block.attn1, block.attn2, block.ffn)]

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """The weights between the command (and noise level) and the network: the action
        embedding and projection, the timestep embedder and its modulation projection, and
        every block's and the output's ``scale_shift_table``; the analog of
        :meth:`TinyWorldDiT.conditioning_parameters`."""
        tr = self.transformer
        embedder = tr.condition_embedder
        modules = [self.key_embed, self.action_proj, embedder.time_embedder, embedder.time_proj]
        tables = [block.scale_shift_table for block in tr.blocks]
        return [*(p for m in modules for p in m.parameters()), *tables, tr.scale_shift_table]

    def bound_frames(self, frames: Tensor) -> Tensor:
        """Sampled clips as history and candidates: pixels clamped to [-1, 1], latents
        unchanged (they are not bounded)."""
        return frames.clamp(-1, 1) if self.pixels else frames

    def velocity_flops(self, batch: int, prefix_tokens: int) -> float:
        """Forward FLOPs of :meth:`velocity` for ``batch`` clips over ``prefix_tokens`` of history
        (see :meth:`_forward_flops`)."""
        t = self.tokens_per_frame
        keys = prefix_tokens + self.clip_frames * t
        return self._forward_flops(batch * self.clip_frames, batch,
                                   batch * self.clip_frames * t * keys, head=True)

    def history_flops(self, frames: int) -> float:
        """Forward FLOPs of building the cache of a ``frames``-frame history from empty (no
        output head), counting the keys each chunk attends to (its own and earlier chunks)."""
        sizes = history_chunks(0, frames, self.clip_frames)
        t = self.tokens_per_frame
        pairs = sum(size * t * end * t
                    for size, end in zip(sizes, itertools.accumulate(sizes), strict=True))
        return self._forward_flops(frames, 1, pairs, head=False)

    def _forward_flops(self, frames: int, rows: int, attended_pairs: int, head: bool) -> float:
        """Matmul FLOPs (2 per multiply-add) of one forward over ``frames`` frames in ``rows``
        sequences whose tokens attend to ``attended_pairs`` (query, key) pairs in all.

        Counted: the per-frame timestep, action and modulation projections, the text
        embedding (once), the patch embedding, per block the self-attention projections and
        attention, the cross-attention projections (keys and values of the ``L`` text tokens
        per row) and attention, and the FFN; with ``head`` the output projection. Norms, RoPE
        and the element-wise modulation are left out.
        """
        c = self.transformer.config
        d, tokens = c.num_attention_heads * c.attention_head_dim, frames * self.tokens_per_frame
        text = self.prompt_embeds.shape[1]
        patch = c.in_channels * c.patch_size[1] * c.patch_size[2]
        flops = 2 * frames * (c.freq_dim * d + d * d + self.key_embed.in_features * d + d * d
                              + 6 * d * d)
        flops += 2 * text * (c.text_dim * d + d * d) + 2 * tokens * patch * d
        self_attention = 8 * tokens * d * d + 4 * attended_pairs * d
        cross_attention = 4 * tokens * d * d + 4 * rows * text * d * d + 4 * tokens * text * d
        ffn = 4 * tokens * d * c.ffn_dim
        flops += c.num_layers * (self_attention + cross_attention + ffn)
        if head:
            flops += 2 * tokens * d * c.out_channels * c.patch_size[1] * c.patch_size[2]
        return float(flops)

    @property
    def signature(self) -> tuple:
        """What a cache depends on: latent channels and size, patch, width, depth, heads and the
        history window."""
        c = self.transformer.config
        return (c.in_channels, self.latent_size, tuple(c.patch_size),
                c.num_attention_heads * c.attention_head_dim, c.num_layers, c.num_attention_heads,
                self.history_window)

    @property
    def clip_shape(self) -> tuple[int, int, int, int]:
        """``(F, C, H, W)`` of one generated clip of latents."""
        return (self.clip_frames, self.transformer.config.out_channels, *self.latent_size)

    # -- checks ------------------------------------------------------------------------------

    def _check_frames(self, name: str, frames: Tensor) -> None:
        check_frames(name, frames, self.clip_shape)

    def _check_sigma(self, sigma: Tensor, shape: tuple[int, ...]) -> None:
        """``sigma`` must be a floating tensor of ``shape``."""
        if not isinstance(sigma, Tensor) or not sigma.dtype.is_floating_point:
            got = sigma.dtype if isinstance(sigma, Tensor) else type(sigma).__name__
            raise TypeError(f"sigma must be a floating-point tensor, got {got}")
        if tuple(sigma.shape) != shape:
            raise ValueError(f"sigma must have shape {list(shape)}, got {tuple(sigma.shape)}")

    def _check_cache(self, cache: ContextCache) -> None:
        check_cache(cache, self.signature)

    def _check_history(self, frames: Tensor, actions: Tensor) -> Tensor:
        """Checks shared history ``frames`` ``[1, F', C, H, W]``; returns its actions
        ``[1, F']``."""
        self._check_frames("frames", frames)
        if frames.shape[0] != 1:
            raise ValueError(f"history frames are shared: batch must be 1, got {frames.shape[0]}")
        return check_actions(actions, 1, frames.shape[1])

    # -- conditioning and layout -------------------------------------------------------------

    @property
    def _compute_dtype(self) -> torch.dtype:
        return compute_dtype(self.transformer.patch_embedding.weight.dtype)

    def _autocast(self, device: torch.device):
        """``torch.autocast`` to ``autocast_dtype`` on ``device`` (off for fp32)."""
        dtype = self.autocast_dtype
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def _conditioning(self, sigma: Tensor, actions: Tensor, action_offset: Tensor | None = None
                      ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-frame ``sigma``, ``actions`` ``[B, F]`` (and a per-row ``action_offset``
        ``[B, 8]``, :func:`pressed_keys`) -> the timestep embedding with the action added
        ``[B, F, D]``, its modulation ``[B, F, 6, D]`` and the text tokens ``[B, L, D]``.

        The steps of diffusers' ``WanTimeTextImageEmbedding``, per frame.
        """
        embedder = self.transformer.condition_embedder
        b, f = actions.shape
        context = embedder.text_embedder(self.prompt_embeds).expand(b, -1, -1)
        timestep = NUM_TRAIN_TIMESTEPS * sigma.to(self._compute_dtype).reshape(-1)
        t = embedder.timesteps_proj(timestep)
        t = t.to(next(embedder.time_embedder.parameters()).dtype)
        temb = embedder.time_embedder(t).type_as(context).unflatten(0, (b, f))
        keys = pressed_keys(self.keys_of_action, actions, action_offset)
        temb = temb + self.action_proj(self.key_embed(keys.to(self.key_embed.weight.dtype)))
        modulation = embedder.time_proj(embedder.act_fn(temb)).unflatten(-1, (6, -1))
        return temb, modulation, context

    def _rope(self, positions: Tensor) -> RopeTables:
        """Wan's RoPE (cos, sin) tables ``[1, F*h*w, 1, Dh]`` for token frames at ``positions``
        ``[F]``: the frame axis indexed by position (so a clip continues its history's
        positions), the row and column axes as diffusers' ``WanRotaryPosEmbed`` builds them."""
        rope = self.transformer.rope
        gh, gw = self.grid
        if max(gh, gw) > rope.max_seq_len or (values_checkable()
                                              and int(positions.max()) >= rope.max_seq_len):
            raise ValueError(f"positions up to {int(positions.max())} and a {gh}x{gw} grid "
                             f"exceed the transformer's rope_max_seq_len {rope.max_seq_len}")
        f = positions.shape[0]
        tables = []
        for freqs in (rope.freqs_cos, rope.freqs_sin):
            t, h, w = freqs.split([rope.t_dim, rope.h_dim, rope.w_dim], dim=1)
            grid = torch.cat([t[positions].view(f, 1, 1, -1).expand(f, gh, gw, -1),
                              h[:gh].view(1, gh, 1, -1).expand(f, gh, gw, -1),
                              w[:gw].view(1, 1, gw, -1).expand(f, gh, gw, -1)], dim=-1)
            tables.append(grid.reshape(1, f * gh * gw, 1, -1))
        return tables[0], tables[1]

    def _embed(self, frames: Tensor) -> Tensor:
        """Latents ``[B, F, C, H, W]`` -> tokens ``[B, F*h*w, D]`` (frame-major, then row,
        column)."""
        conv = self.transformer.patch_embedding
        x = conv(frames.to(conv.weight.dtype).transpose(1, 2))
        return x.flatten(2).transpose(1, 2).contiguous()

    def _unpatchify(self, tokens: Tensor, frames: int) -> Tensor:
        """Output tokens ``[B, F*h*w, p_h*p_w*C]`` -> latents ``[B, F, C, H, W]``."""
        _, p_h, p_w = self.transformer.config.patch_size
        gh, gw = self.grid
        b = tokens.shape[0]
        x = tokens.reshape(b, frames, gh, gw, p_h, p_w, -1).permute(0, 1, 6, 2, 4, 3, 5)
        return x.reshape(b, frames, -1, gh * p_h, gw * p_w)

    # -- forward -----------------------------------------------------------------------------

    def _trunk(self, frames: Tensor, sigma: Tensor, actions: Tensor, positions: Tensor,
               attend_for: Callable[[int], Attend], action_offset: Tensor | None = None,
               reference: Tensor | None = None, keep_kv: bool = True
               ) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
        """Every block on ``frames`` ``[B, F, C, H, W]`` at per-frame ``sigma`` and ``actions``
        ``[B, F]`` (movement keys shifted by ``action_offset`` ``[B, 8]``, see
        :meth:`_conditioning`) and frame ``positions`` ``[F]``; layer ``i`` attends with
        ``attend_for(i)``. ``reference`` ``[B or 1, F, C, H, W]``: each frame's reference
        frame, concatenated channel-wise (with ``reference_frame``; ``None`` without).

        Returns the last block's tokens ``[B, F*h*w, D]``, the per-frame timestep embedding
        ``[B, F, D]`` and every layer's position-encoded keys and values ``[B, H, F*h*w, Dh]``
        (empty lists without ``keep_kv``: a velocity drops each layer's as soon as the layer is
        done, instead of holding every layer's until the last).
        With activation checkpointing and gradients on, each block keeps only its input and
        runs again in the backward (its keys and values are recomputed with it).
        """
        rope = self._rope(positions)
        temb, modulation, context = self._conditioning(sigma, actions, action_offset)
        keys, values = [], []
        rerun = self.activation_checkpointing and torch.is_grad_enabled()
        with self._autocast(frames.device):
            # the residual stream stays in the weights' dtype; autocast casts each matmul's input
            if reference is not None:
                reference = reference.to(frames.dtype).expand(frames.shape[0], -1, -1, -1, -1)
                frames = torch.cat([frames, reference], dim=2)
            x = self._embed(frames).to(self.transformer.patch_embedding.weight.dtype)
            for i, block in enumerate(self.transformer.blocks):
                layer = LayerAttention(attend_for(i), keep=keep_kv)
                args = (block, x, context, modulation, rope, layer)
                x = (checkpoint(block_forward, *args, use_reentrant=False) if rerun
                     else block_forward(*args))
                if keep_kv:
                    keys.append(layer.keys)
                    values.append(layer.values)
        return x, temb, keys, values

    def _head(self, x: Tensor, temb: Tensor, first: int = 0) -> Tensor:
        """The output norm and projection on frames ``first:`` of the trunk's tokens ``x``
        ``[B, F*h*w, D]``, modulated per frame by ``temb`` ``[B, F, D]`` -> ``[B, F - first, C,
        H, W]`` in the accumulation dtype."""
        tr = self.transformer
        shift, scale = (tr.scale_shift_table.unsqueeze(0) + temb[:, first:].unsqueeze(2)).unbind(2)
        with self._autocast(x.device):
            h = modulate(tr.norm_out, x[:, first * self.tokens_per_frame:], shift, scale)
            out = tr.proj_out(h)
        return self._unpatchify(out, temb.shape[1] - first).to(self._compute_dtype)

    def _prefix_attend(self, cache: ContextCache, layer: int) -> Attend:
        """Attention of the rows' own tokens plus layer ``layer``'s shared history."""

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            if cache.keys:
                prefix_k, prefix_v = cache.keys[layer].to(q.dtype), cache.values[layer].to(q.dtype)
            else:
                prefix_k = prefix_v = q.new_zeros(1, q.shape[1], 0, q.shape[3])
            return prefix_attention(q, k, v, prefix_k, prefix_v, backend=self.attention_backend)

        return attend

    def _history_sigma(self, sigma: float, frames: int, device: torch.device) -> Tensor:
        """The history's noise level ``[1, F]`` in the accumulation dtype, so the cached and the
        whole-sequence paths embed the same value."""
        return torch.full((1, frames), float(sigma), device=device, dtype=self._compute_dtype)

    def _cache_reference(self, cache: ContextCache, frames: Tensor) -> Tensor | None:
        """Reference frames ``[1, F, C, H, W]`` of a chunk that follows ``cache``
        (:func:`chunk_reference`); ``None`` without ``reference_frame``."""
        return chunk_reference(cache.last_frame, frames) if self.reference_frame else None

    def _sequence_reference(self, frames: Tensor) -> Tensor | None:
        """Reference frames of a whole history ``[B, T, C, H, W]``
        (:func:`sequence_reference`); ``None`` without ``reference_frame``."""
        return sequence_reference(frames, self.clip_frames) if self.reference_frame else None

    # -- history -----------------------------------------------------------------------------

    def empty_cache(self) -> ContextCache:
        return ContextCache(signature=self.signature)

    def extend_cache(self, cache: ContextCache, frames: Tensor, actions: Tensor, *,
                     sigma: float) -> ContextCache:
        """Append clean history latents ``frames`` ``[1, F', C, H, W]`` with ``actions``
        ``[1, F']``, seen at noise ``sigma``.

        An empty cache takes the prompt frame first (its action ignored), then whole clips;
        each chunk attends to the cache and to itself. Returns a new cache.
        """
        self._check_cache(cache)
        actions = self._check_history(frames, actions).clone()
        if cache.num_frames == 0:
            actions[:, 0] = PROMPT_ACTION
        start = 0
        for size in history_chunks(cache.num_frames, frames.shape[1], self.clip_frames):
            cache = self._append_chunk(cache, frames[:, start:start + size],
                                       actions[:, start:start + size], sigma)
            start += size
        return cache

    def _append_chunk(self, cache: ContextCache, frames: Tensor, actions: Tensor,
                      sigma: float) -> ContextCache:
        """``cache`` with one more chunk ``[1, F', C, H, W]`` run over it."""
        f = frames.shape[1]
        positions = torch.arange(cache.num_frames, cache.num_frames + f, device=frames.device)
        _, _, keys, values = self._trunk(frames, self._history_sigma(sigma, f, frames.device),
                                         actions, positions,
                                         lambda i: self._prefix_attend(cache, i),
                                         reference=self._cache_reference(cache, frames))
        if cache.keys:
            keys = [torch.cat(pair, dim=2) for pair in zip(cache.keys, keys, strict=True)]
            values = [torch.cat(pair, dim=2) for pair in zip(cache.values, values, strict=True)]
        keys, values = trim_history(keys, values, self.history_window, self.tokens_per_frame)
        return ContextCache(keys=keys, values=values, num_frames=cache.num_frames + f,
                            signature=self.signature, last_frame=frames[:, -1])

    def build_cache_parallel(self, frames: Tensor, actions: Tensor, *, sigma: float
                             ) -> ContextCache:
        """The cache :meth:`extend_cache` builds from empty, in one block-causal forward."""
        actions = self._check_history(frames, actions).clone()
        actions[:, 0] = PROMPT_ACTION
        f = frames.shape[1]
        attend = masked_attend(history_mask(f, self.clip_frames, frames.device,
                                            self.history_window), self.tokens_per_frame)
        _, _, keys, values = self._trunk(frames, self._history_sigma(sigma, f, frames.device),
                                         actions, torch.arange(f, device=frames.device),
                                         lambda _: attend,
                                         reference=self._sequence_reference(frames))
        keys, values = trim_history(keys, values, self.history_window, self.tokens_per_frame)
        return ContextCache(keys=keys, values=values, num_frames=f, signature=self.signature,
                            last_frame=frames[:, -1])

    # -- prediction --------------------------------------------------------------------------

    def velocity(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache, *,
                 motion: Tensor | None = None, action_offset: Tensor | None = None) -> Tensor:
        """Velocity ``[B, F, C, H, W]`` (fp32; fp64 for an fp64 model) of ``B`` noisy clips.

        ``x_t`` ``[B, F, C, H, W]`` one clip per row, ``sigma`` ``[B]``, ``actions`` ``[B, F]``
        or ``[F]``; every row attends to its own tokens and the shared history in ``cache``,
        at frame positions ``cache.num_frames ...``. ``motion`` must be ``None``;
        ``action_offset`` ``[B, 8]`` shifts each row's movement-key intensities
        (:func:`pressed_keys`).
        """
        if motion is not None:
            raise ValueError("motion latents given to a model without motion latents")
        self._check_cache(cache)
        self._check_frames("x_t", x_t)
        b, f = x_t.shape[:2]
        if f != self.clip_frames:
            raise ValueError(f"x_t must hold one clip of {self.clip_frames} frames, got {f}")
        self._check_sigma(sigma, (b,))
        actions = check_actions(actions, b, f)
        action_offset = check_action_offset(action_offset, b)
        positions = torch.arange(cache.num_frames, cache.num_frames + f, device=x_t.device)
        x, temb, _, _ = self._trunk(x_t, sigma[:, None].expand(b, f), actions, positions,
                                    lambda i: self._prefix_attend(cache, i), action_offset,
                                    self._cache_reference(cache, x_t), keep_kv=False)
        return self._head(x, temb)

    def teacher_forced_velocity(self, frames: Tensor, actions: Tensor, x_t: Tensor,
                                sigma: Tensor, *, context_sigma: float) -> Tensor:
        """Velocity of every clip of a sequence given its clean history, in one forward.

        ``frames`` ``[B, 1 + N*F, C, H, W]`` clean (prompt first), ``actions`` ``[B, N*F]``,
        ``x_t`` ``[B, N*F, C, H, W]`` noisy clips at ``sigma`` ``[B, N]`` -> ``[B, N*F, ...]``.
        Noisy clip ``j`` sees the clean prompt and clean clips ``< j`` (at ``context_sigma``)
        and itself, at the positions of clean clip ``j``: what :meth:`velocity` sees over a
        cache of that history.
        """
        self._check_frames("frames", frames)
        self._check_frames("x_t", x_t)
        b, total = frames.shape[:2]
        f = self.clip_frames
        if (total - 1) % f or x_t.shape[:2] != (b, total - 1):
            raise ValueError(f"frames must be [B, 1 + N*{f}] and x_t [B, N*{f}], got "
                             f"{tuple(frames.shape[:2])} and {tuple(x_t.shape[:2])}")
        self._check_sigma(sigma, (b, (total - 1) // f))
        actions = check_actions(actions, b, total - 1)
        device = frames.device
        prompt = torch.full((b, 1), PROMPT_ACTION, dtype=actions.dtype, device=device)
        all_actions = torch.cat([prompt, actions, actions], dim=1)
        all_sigma = torch.cat([self._history_sigma(context_sigma, total, device).expand(b, -1),
                               sigma.to(self._compute_dtype).repeat_interleave(f, dim=1)], dim=1)
        positions, frame_mask = teacher_forced_layout(total, f, device, self.history_window)
        attend = masked_attend(frame_mask, self.tokens_per_frame)
        reference = self._sequence_reference(frames)
        if reference is not None:
            # noisy clip j has clean clip j's reference: the last frame before it
            reference = torch.cat([reference, reference[:, 1:]], dim=1)
        x, temb, _, _ = self._trunk(torch.cat([frames, x_t.to(frames.dtype)], dim=1), all_sigma,
                                    all_actions, positions, lambda _: attend,
                                    reference=reference, keep_kv=False)
        return self._head(x, temb, first=total)

