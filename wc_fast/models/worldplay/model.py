"""WorldPlayWorldModel: HY-WorldPlay (HY-World 1.5, the model WorldCompass post-trains) as a
:class:`~wc_fast.models.WorldModel` over a shared history cache.

It runs the official autoregressive path (``forward_txt`` / ``forward_vision`` of
``hyvideo/models/transformers/worldplay_1_5_transformer.py``) on latents ``[B, F, C, H, W]``:

* **Text** (prompt, optional SigLIP image and ByT5 glyph tokens; fixed tensors, no encoder)
  goes through the text stream of every double block once, at text timestep 0; its keys and
  values open every cache.
* **History**: the clean history latents (prompt frame first) at ``context_sigma`` (WorldCompass:
  timestep 14 of 1000) attend to the text and to each other, bidirectionally, in one forward,
  at RoPE frames ``0..P-1``; their keys and values of both attention branches are the cache.
  This is how the official rollout rebuilds its context before each chunk (all earlier frames
  while there are fewer than 20; the FOV-based memory selection beyond that is not built), so
  :meth:`extend_cache` rebuilds the cache over the whole history kept in
  :class:`WorldPlayCache`.
* **Candidates**: ``B`` noisy clips at RoPE frames ``P..P+F-1`` attend to the cache and to
  their own tokens through :func:`wc_kernels.prefix_attention` (one shared copy of the prefix),
  with the RoPE and PRoPE branches folded into one call on ``2H`` heads.

Conditioning per frame: ``time_in(1000 sigma) + action_in(action id)`` (the id embedded like a
timestep, as the official model does), the image condition channels (the prompt frame's own
latent with mask 1 on history frame 0, zeros elsewhere), and the camera of
:mod:`wc_fast.models.worldplay.camera` through PRoPE. A cache is expressed in the camera
frame of its last history frame (its text's PRoPE keys transformed to match, see
:meth:`WorldPlayWorldModel._cache_from`), so a clip's camera path starts at the identity and
the cache alone carries the history's pose: the official outputs, world = prompt frame.

``action_offset`` ``[B, 8]`` softens the 8 movement keys per candidate: the action embedding is
the mix of the 81 ids' embeddings weighted by the probability of each id's key pattern when
each key is pressed independently with its intensity (normalised over the 81 valid patterns;
exactly the discrete embedding for 0/1 keys), and the camera steps by the soft keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from wc_fast.actions import NUM_ACTIONS, NUM_LABELS, label_to_bits
from wc_fast.models.clips import (
    check_action_offset,
    check_actions,
    check_cache,
    check_frames,
    history_chunks,
)
from wc_fast.models.lora import inject_lora, lora_parameters
from wc_fast.models.protocol import ContextCache
from wc_fast.models.worldplay.camera import (
    action_keys,
    camera_path,
    history_cameras,
    intrinsics,
    rebase,
    view_matrices,
)
from wc_fast.models.worldplay.modules import (
    ByT5Mapper,
    DoubleBlock,
    FinalLayer,
    TimestepEmbedder,
    TokenRefiner,
    VisionProjection,
    apply_projective,
    prope_matrices,
    rope_tables,
)
from wc_kernels import prefix_attention
from wc_kernels.reference import compute_dtype

NUM_TRAIN_TIMESTEPS = 1000
TEXT_TIMESTEP = 0.0  # the official text stream runs at timestep 0


@dataclass(frozen=True, slots=True)
class WorldPlayConfig:
    """The fields of the official ``config.json`` the model is built from (the rest of the
    official options are checked to have the values WorldPlay uses)."""

    in_channels: int = 32
    out_channels: int = 32
    hidden_size: int = 2048
    heads_num: int = 16
    mlp_width_ratio: float = 4.0
    mm_double_blocks_depth: int = 54
    patch_size: tuple[int, int, int] = (1, 1, 1)
    rope_dim_list: tuple[int, int, int] = (16, 56, 56)
    rope_theta: float = 256.0
    qkv_bias: bool = True
    text_states_dim: int = 3584
    vision_states_dim: int = 1152
    vision_projection: str = "linear"
    glyph_byT5_v2: bool = True
    use_cond_type_embedding: bool = True

    # official option -> the value this implementation supports
    REQUIRED = {"mm_single_blocks_depth": 0, "concat_condition": True, "qk_norm": True,
                "qk_norm_type": "rms", "mlp_act_type": "gelu_tanh", "guidance_embed": False,
                "use_meanflow": False, "text_projection": "single_refiner",
                "text_pool_type": None, "is_reshape_temporal_channels": False}

    @classmethod
    def from_json(cls, path: Path) -> WorldPlayConfig:
        """The config of an official ``config.json``; an unsupported option raises
        ``ValueError`` naming it."""
        raw = json.loads(path.read_text())
        for key, want in cls.REQUIRED.items():
            if key in raw and raw[key] != want:
                raise ValueError(f"{path}: {key} = {raw[key]!r} is not supported (WorldPlay "
                                 f"uses {want!r})")
        names = set(cls.__dataclass_fields__)
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names}
        if fields.get("out_channels") is None:
            fields["out_channels"] = fields.get("in_channels", cls.in_channels)
        return cls(**fields)


@dataclass(slots=True)
class WorldPlayCache(ContextCache):
    """A :class:`ContextCache` that also keeps the history it was built from (``frames``
    ``[1, P, C, H, W]``, ``actions`` ``[1, P]``), so that :meth:`WorldPlayWorldModel.extend_cache`
    can rebuild it bidirectionally as the official rollout does."""

    frames: Tensor | None = None
    actions: Tensor | None = None


def key_pattern_weights(keys: Tensor) -> Tensor:
    """Soft key intensities ``[..., 8]`` in [0, 1] -> weights ``[..., 81]`` of the action ids:
    the probability of each id's translation and rotation key patterns with independent keys,
    normalised over the valid patterns (one-hot for 0/1 keys of a valid id)."""
    bits = label_to_bits(torch.arange(NUM_LABELS, device=keys.device)).to(keys.dtype)  # [9, 4]

    def labels(k: Tensor) -> Tensor:
        p = (k.unsqueeze(-2) * bits + (1 - k.unsqueeze(-2)) * (1 - bits)).prod(-1)
        return p / p.sum(-1, keepdim=True).clamp_min(1e-12)

    trans, rot = labels(keys[..., :4]), labels(keys[..., 4:])
    return (trans.unsqueeze(-1) * rot.unsqueeze(-2)).flatten(-2)


def checkpoint_files(path: str | Path) -> tuple[Path, list[Path]]:
    """``config.json`` and the ``*.safetensors`` weights of a WorldPlay transformer: in
    ``path/transformer`` when that exists, else in ``path``; ``FileNotFoundError`` naming what
    is missing."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"WorldPlay model directory {root} not found")
    if (root / "transformer").is_dir():
        root = root / "transformer"
    config = root / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found: expected the official transformer config "
                                "(transformer/480p_i2v/config.json of HunyuanVideo-1.5)")
    weights = sorted(root.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{root} holds no *.safetensors weights (the WorldPlay action "
                                "model, e.g. ar_model/diffusion_pytorch_model.safetensors)")
    return config, weights


class WorldPlayWorldModel(nn.Module):
    """WorldPlay's transformer implementing :class:`wc_fast.models.WorldModel` on latents.

    ``config``: the official transformer config; ``clip_frames``: latent frames per clip (4 in
    WorldPlay); ``latent_size``: latent ``(H, W)``; ``text_states`` ``[1, L, text_dim]`` (the
    valid tokens of the text encoder's output), ``vision_states`` ``[1, Lv, vision_dim]`` and
    ``byt5_states`` ``[1, Lb, 1472]`` (optional); ``context_sigma``: the history's noise level;
    ``activation_checkpointing`` reruns each block in the backward; ``autocast_dtype`` the
    matmul dtype (weights and the modulation stay in their own dtype).
    """

    motion_latent = False
    exploration_inputs = frozenset({"action_offset"})

    def __init__(self, config: WorldPlayConfig, *, clip_frames: int,
                 latent_size: tuple[int, int], text_states: Tensor | None = None,
                 vision_states: Tensor | None = None, byt5_states: Tensor | None = None,
                 context_sigma: float = 0.014, attention_backend: str = "auto",
                 activation_checkpointing: bool = False,
                 autocast_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        c = config
        p_t, p_h, p_w = c.patch_size
        height, width = latent_size
        if p_t != 1 or height % p_h or width % p_w or clip_frames < 1:
            raise ValueError(f"need a temporal patch of 1, latent_size a multiple of the patch "
                             f"({p_h}, {p_w}) and clip_frames >= 1; got patch {c.patch_size}, "
                             f"{latent_size}, {clip_frames}")
        if c.hidden_size % c.heads_num or sum(c.rope_dim_list) != c.hidden_size // c.heads_num:
            raise ValueError(f"rope_dim_list {c.rope_dim_list} must sum to the head dim "
                             f"{c.hidden_size // c.heads_num}")
        if autocast_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"autocast_dtype must be float32, bfloat16 or float16, got "
                             f"{autocast_dtype}")
        self.config = c
        self.clip_frames = clip_frames
        self.latent_size = (height, width)
        self.grid = (height // p_h, width // p_w)
        self.tokens_per_frame = self.grid[0] * self.grid[1]
        self.context_sigma = context_sigma
        self.attention_backend = attention_backend
        self.activation_checkpointing = activation_checkpointing
        self.autocast_dtype = autocast_dtype
        self.lora: tuple[int, float, tuple[str, ...], int] | None = None
        d = c.hidden_size
        self.img_in = nn.Module()
        self.img_in.proj = nn.Conv3d(2 * c.in_channels + 1, d, c.patch_size, c.patch_size)
        self.txt_in = TokenRefiner(c.text_states_dim, d, c.heads_num, mlp_ratio=4.0)
        self.vision_in = (VisionProjection(c.vision_states_dim, d)
                          if c.vision_projection == "linear" else None)
        self.byt5_in = ByT5Mapper(d) if c.glyph_byT5_v2 else None
        self.cond_type_embedding = nn.Embedding(3, d) if c.use_cond_type_embedding else None
        self.time_in = TimestepEmbedder(d)
        self.action_in = TimestepEmbedder(d)
        self.double_blocks = nn.ModuleList(
            DoubleBlock(d, c.heads_num, c.mlp_width_ratio, c.qkv_bias)
            for _ in range(c.mm_double_blocks_depth))
        self.final_layer = FinalLayer(d, c.out_channels * p_h * p_w)
        text_states = torch.zeros(1, 1, c.text_states_dim) if text_states is None else text_states
        self._register_states("text_states", text_states, c.text_states_dim)
        self._register_states("vision_states", vision_states, c.vision_states_dim,
                              enabled=self.vision_in is not None)
        self._register_states("byt5_states", byt5_states, 1472, enabled=self.byt5_in is not None)
        self.register_buffer("intrinsics", intrinsics(1)[0].float(), persistent=False)

    def _register_states(self, name: str, states: Tensor | None, dim: int, *,
                         enabled: bool = True) -> None:
        """A fixed conditioning tensor ``[1, L, dim]`` as a non-persistent buffer (or None)."""
        if states is not None:
            if not enabled:
                raise ValueError(f"{name} given to a checkpoint without its projection")
            if states.dim() != 3 or states.shape[0] != 1 or states.shape[2] != dim:
                raise ValueError(f"{name} must have shape [1, L, {dim}], got "
                                 f"{tuple(states.shape)}")
            states = states.float()
        self.register_buffer(name, states, persistent=False)

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> WorldPlayWorldModel:
        """The fp32 model of a checkpoint directory in the official layout: ``config.json``
        (the transformer's) and ``*.safetensors`` holding the whole state dict under the
        official keys (the WorldPlay action model). A missing, unexpected or mis-shaped tensor
        raises ``ValueError`` naming it. ``kwargs``: the constructor's keywords."""
        config_path, weights = checkpoint_files(path)
        model = cls(WorldPlayConfig.from_json(config_path), **kwargs)
        state = {}
        for shard in weights:
            state.update(load_file(shard))
        model.load_official(state)
        return model

    def load_official(self, state: dict[str, Tensor]) -> None:
        """Copy an official state dict in; every tensor must match a parameter by name and
        shape (``ValueError`` naming the first offenders)."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        mismatched = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                      for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]
        if missing or unexpected or mismatched:
            raise ValueError(f"WorldPlay checkpoint does not match the model: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}, mismatched "
                             f"{mismatched[:5]}")
        self.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})

    def lora_root(self) -> nn.Module:
        """The module whose linears :meth:`add_lora` adapts (the double blocks): the root of
        the adapter's names in peft's format."""
        return self.double_blocks

    def add_lora(self, rank: int, alpha: float, targets: tuple[str, ...], *,
                 seed: int = 0) -> None:
        """LoRA adapters (:func:`wc_fast.models.lora.inject_lora`) on the double blocks'
        linears named by ``targets``; then only the adapters and
        :meth:`conditioning_parameters` require a gradient."""
        self.lora = (rank, alpha, tuple(targets), seed)
        inject_lora(self.double_blocks, rank, alpha, targets, seed=seed)
        self.requires_grad_(False)
        for p in (*self.lora_parameters(), *self.conditioning_parameters()):
            p.requires_grad_(True)

    def lora_parameters(self) -> list[nn.Parameter]:
        """Both factors of every LoRA adapter (none without :meth:`add_lora`)."""
        return lora_parameters(self)

    def fresh_copy(self) -> WorldPlayWorldModel:
        """A new model of this config and options on the CPU (fresh weights, the same fixed
        conditioning tensors and LoRA adapters)."""
        states = {name: None if getattr(self, name) is None else getattr(self, name).cpu()
                  for name in ("text_states", "vision_states", "byt5_states")}
        copy = WorldPlayWorldModel(self.config, clip_frames=self.clip_frames,
                                   latent_size=self.latent_size, **states,
                                   context_sigma=self.context_sigma,
                                   attention_backend=self.attention_backend,
                                   activation_checkpointing=self.activation_checkpointing,
                                   autocast_dtype=self.autocast_dtype)
        if self.lora is not None:
            rank, alpha, targets, seed = self.lora
            copy.add_lora(rank, alpha, targets, seed=seed)
        return copy

    # -- what the trainer needs ----------------------------------------------------------------

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The double blocks' attention and MLP weights of both streams (what Muon
        orthogonalises); not the modulation or PRoPE projections (conditioning), nor LoRA
        factors."""
        names = ("attn_q", "attn_k", "attn_v", "attn_proj", "mlp.fc1", "mlp.fc2")
        return [p for block in self.double_blocks for n, p in block.named_parameters()
                if n.endswith(".weight") and any(f"_{m}." in n for m in names)
                and "lora_" not in n]

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """The weights between the command (and noise level) and the network: the action and
        timestep embedders, every block's image modulation and PRoPE projection, and the
        output modulation."""
        modules = [self.action_in, self.time_in, self.final_layer.adaLN_modulation]
        for block in self.double_blocks:
            modules += [block.img_mod, block.img_attn_prope_proj]
        return [p for m in modules for n, p in m.named_parameters() if "lora_" not in n]

    def shard_units(self) -> list[nn.Module]:
        """The double blocks (each called as a module, text and image streams alike)."""
        return list(self.double_blocks)

    def bound_frames(self, frames: Tensor) -> Tensor:
        """Latents are not bounded."""
        return frames

    def velocity_flops(self, batch: int, prefix_tokens: int) -> float:
        """Forward FLOPs of :meth:`velocity` for ``batch`` clips over ``prefix_tokens`` cached
        tokens (text included)."""
        tokens = self.clip_frames * self.tokens_per_frame
        return self._vision_flops(batch * self.clip_frames, batch * tokens * (prefix_tokens
                                                                              + tokens), True)

    def history_flops(self, frames: int) -> float:
        """Forward FLOPs of building the cache of a ``frames``-frame history: the text stream
        (per block q/k/v/out and MLP per token, one modulation, text self-attention; the token
        refiner left out), then the image stream over the text and the history."""
        tokens, text = frames * self.tokens_per_frame, self.text_tokens
        d, layers = self.config.hidden_size, self.config.mm_double_blocks_depth
        ratio = self.config.mlp_width_ratio
        text_flops = layers * (2 * text * d * d * (4 + 2 * ratio) + 2 * 6 * d * d
                               + 4 * text * text * d)
        return float(text_flops) + self._vision_flops(frames, tokens * (text + tokens), False)

    def _vision_flops(self, frames: int, attended_pairs: int, head: bool) -> float:
        """Matmul FLOPs (2 per multiply-add) of the image stream over ``frames`` frames whose
        tokens attend to ``attended_pairs`` (query, key) pairs: the patch embedding, the
        timestep/action embedders and modulations per frame, per block q/k/v/out and PRoPE
        projections, both attention branches and the MLP; with ``head`` the output layer.
        Norms, RoPE and the 4x4 PRoPE transforms are left out."""
        c = self.config
        d, tokens = c.hidden_size, frames * self.tokens_per_frame
        hidden = int(d * c.mlp_width_ratio)
        flops = 2 * tokens * (2 * c.in_channels + 1) * d
        flops += 2 * frames * (2 * (256 * d + d * d) + c.mm_double_blocks_depth * 6 * d * d)
        # q, k, v, out and PRoPE projections; scores and values of both branches; the MLP
        per_block = 10 * tokens * d * d + 8 * attended_pairs * d + 4 * tokens * d * hidden
        flops += c.mm_double_blocks_depth * per_block
        if head:
            flops += 2 * frames * 2 * d * d + 2 * tokens * d * c.out_channels
        return float(flops)

    @property
    def text_tokens(self) -> int:
        """Tokens of the fixed text conditioning (text, ByT5, vision)."""
        return sum(s.shape[1] for s in (self.text_states, self.vision_states, self.byt5_states)
                   if s is not None)

    @property
    def signature(self) -> tuple:
        c = self.config
        return ("worldplay", c.in_channels, self.latent_size, c.hidden_size,
                c.mm_double_blocks_depth, c.heads_num, self.text_tokens)

    @property
    def clip_shape(self) -> tuple[int, int, int, int]:
        return (self.clip_frames, self.config.in_channels, *self.latent_size)

    # -- checks --------------------------------------------------------------------------------

    def _check_frames(self, name: str, frames: Tensor) -> None:
        check_frames(name, frames, self.clip_shape)

    def _check_cache(self, cache: ContextCache) -> None:
        check_cache(cache, self.signature)

    # -- pieces of the forward -----------------------------------------------------------------

    @property
    def _compute_dtype(self) -> torch.dtype:
        return compute_dtype(self.img_in.proj.weight.dtype)

    def _autocast(self, device: torch.device):
        dtype = self.autocast_dtype
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def _text_tokens(self) -> Tensor:
        """The text stream's input ``[1, L, D]``: vision, ByT5, then text tokens (the official
        ``reorder_txt_token`` order of valid tokens), each with its condition-type embedding."""
        t = torch.full((1,), TEXT_TIMESTEP, device=self.text_states.device)
        parts = [(self.vision_in, self.vision_states, 2), (self.byt5_in, self.byt5_states, 1)]
        tokens = [proj(states) + self._cond_type(kind) for proj, states, kind in parts
                  if states is not None]
        tokens.append(self.txt_in(self.text_states, t) + self._cond_type(0))
        return torch.cat(tokens, dim=1)

    def _cond_type(self, kind: int) -> Tensor | float:
        if self.cond_type_embedding is None:
            return 0.0
        return self.cond_type_embedding.weight[kind]

    def _text_cache(self) -> tuple[list[Tensor], list[Tensor]]:
        """Every block's text keys and values ``[1, H, L, Dh]`` (the text stream at timestep
        0)."""
        device = self.text_states.device
        vec = self.time_in(torch.full((1,), TEXT_TIMESTEP, device=device)).unsqueeze(1)
        keys, values = [], []
        with self._autocast(device):
            txt = self._text_tokens()
            for block in self.double_blocks:
                txt, k, v = block("text", txt, vec)
                keys.append(k)
                values.append(v)
        return keys, values

    def _conditioning(self, sigma: Tensor, actions: Tensor, keys: Tensor | None) -> Tensor:
        """Per-frame ``time_in(1000 sigma) + action_in(id)`` ``[B, F, D]``; with soft ``keys``
        ``[B, F, 8]`` the action embedding is their :func:`key_pattern_weights` mix of the 81
        ids' embeddings."""
        b, f = actions.shape
        timestep = NUM_TRAIN_TIMESTEPS * sigma.to(self._compute_dtype).reshape(-1)
        vec = self.time_in(timestep).unflatten(0, (b, f))
        if keys is None:
            return vec + self.action_in(actions.reshape(-1)).unflatten(0, (b, f))
        table = self.action_in(torch.arange(NUM_ACTIONS, device=actions.device))
        return vec + key_pattern_weights(keys).to(table.dtype) @ table

    def _inputs(self, frames: Tensor, prompt_first: bool) -> Tensor:
        """Latents ``[B, F, C, H, W]`` with the image condition channels (the first frame's
        latent and mask 1 on the prompt frame, zeros elsewhere) -> ``[B, 2C+1, F, H, W]``."""
        b, f, c, h, w = frames.shape
        cond = frames.new_zeros(b, f, c + 1, h, w)
        if prompt_first:
            cond[:, 0, :c] = frames[:, 0]
            cond[:, 0, c] = 1.0
        return torch.cat([frames, cond], dim=2).transpose(1, 2)

    def _cameras(self, w2c: Tensor) -> tuple[Tensor, Tensor]:
        """PRoPE's ``(P, P^-1)`` ``[B, F, 4, 4]`` (accumulation dtype) of view matrices ``w2c``
        with this model's intrinsics."""
        ks = self.intrinsics.expand(*w2c.shape[:2], 3, 3)
        dtype = self._compute_dtype
        return prope_matrices(w2c.to(dtype), ks.to(dtype))

    def _trunk(self, frames: Tensor, vec: Tensor, positions: Tensor, w2c: Tensor,
               prefix: tuple[list[Tensor], list[Tensor]], prompt_first: bool,
               keep_kv: bool = True) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The image stream on latents ``frames`` ``[B, F, C, H, W]`` with per-frame ``vec``
        ``[B, F, D]``, RoPE frame ``positions`` ``[F]`` and cameras ``w2c`` ``[B, F, 4, 4]``,
        attending to ``prefix`` (each block's ``[1, 2H, P, Dh]`` keys, values) and to itself.

        Returns the last block's tokens ``[B, F*T, D]`` and each block's own keys and values
        ``[B, 2H, F*T, Dh]`` (empty lists without ``keep_kv``: a velocity drops each block's as
        soon as the block is done, instead of holding every block's until the last).
        """
        rope = rope_tables(self.config.rope_dim_list, self.config.rope_theta, positions,
                           self.grid)
        cameras = self._cameras(w2c)
        rerun = self.activation_checkpointing and torch.is_grad_enabled()
        keys, values = [], []
        with self._autocast(frames.device):
            conv = self.img_in.proj
            x = conv(self._inputs(frames, prompt_first).to(conv.weight.dtype))
            x = x.flatten(2).transpose(1, 2).to(conv.weight.dtype)
            for block, prefix_k, prefix_v in zip(self.double_blocks, *prefix, strict=True):
                def attend(q, k, v, pk=prefix_k, pv=prefix_v):
                    return prefix_attention(q, k, v, pk.to(q.dtype), pv.to(q.dtype),
                                            backend=self.attention_backend)

                args = ("vision", x, vec, rope, cameras, attend)
                x, k, v = (checkpoint(block, *args, use_reentrant=False) if rerun
                           else block(*args))
                if keep_kv:
                    keys.append(k)
                    values.append(v)
        return x, keys, values

    def _head(self, x: Tensor, vec: Tensor) -> Tensor:
        """Output layer on tokens ``[B, F*T, D]`` -> velocity ``[B, F, C, H, W]``."""
        _, p_h, p_w = self.config.patch_size
        gh, gw = self.grid
        b, f = vec.shape[:2]
        with self._autocast(x.device):
            out = self.final_layer(x, vec)
        out = out.reshape(b, f, gh, gw, -1, p_h, p_w).permute(0, 1, 4, 2, 5, 3, 6)
        return out.reshape(b, f, -1, gh * p_h, gw * p_w).to(self._compute_dtype)

    # -- history -------------------------------------------------------------------------------

    def empty_cache(self) -> WorldPlayCache:
        """A cache with no history. It holds no keys either: the text's are computed where the
        weights are gathered (a forward method under FSDP2), by :meth:`_text_prefix`."""
        return WorldPlayCache(signature=self.signature)

    def _text_prefix(self, world: Tensor | None = None) -> tuple[list[Tensor], list[Tensor]]:
        """Every block's text keys and values for both branches ``[1, 2H, L, Dh]``."""
        keys, values = self._text_cache()
        return ([self._both_branches(k, world) for k in keys],
                [self._both_branches(v, world) for v in values])

    @staticmethod
    def _both_branches(t: Tensor, world: Tensor | None = None) -> Tensor:
        """Text keys/values ``[1, H, L, Dh]`` -> ``[1, 2H, L, Dh]`` for the RoPE heads and the
        PRoPE heads; the latter multiplied by ``world`` ``[1, 4, 4]`` when the cameras are
        expressed in another frame than the official one (see :meth:`_cache_from`)."""
        prope = t if world is None else apply_projective(t, world[:, None].to(t.device))
        return torch.cat([t, prope], dim=1)

    def build_cache_parallel(self, frames: Tensor, actions: Tensor, *, sigma: float
                             ) -> WorldPlayCache:
        """The cache of history ``frames`` ``[1, P, C, H, W]`` (prompt first) with ``actions``
        ``[1, P]``, seen at noise ``sigma``: text, then the history attending bidirectionally
        to the text and itself; its PRoPE half is expressed in the last history frame's
        camera (see :meth:`_cache_from`)."""
        self._check_frames("frames", frames)
        if frames.shape[0] != 1:
            raise ValueError(f"history frames are shared: batch must be 1, got {frames.shape[0]}")
        actions = check_actions(actions, 1, frames.shape[1]).clone()
        history_chunks(0, frames.shape[1], self.clip_frames)
        actions[:, 0] = 0  # the prompt frame: no motion before it (official label 0)
        c2w = history_cameras(actions).to(frames.device)
        p = frames.shape[1]
        sigma_frames = torch.full((1, p), float(sigma), device=frames.device,
                                  dtype=self._compute_dtype)
        return self._cache_from(frames, actions, sigma_frames,
                                view_matrices(rebase(c2w, c2w[:, -1])),
                                world=view_matrices(c2w[:, -1]))

    def _cache_from(self, frames: Tensor, actions: Tensor, sigma: Tensor, w2c: Tensor,
                    world: Tensor | None = None) -> WorldPlayCache:
        """The cache of history ``frames`` with explicit cameras ``w2c`` ``[1, P, 4, 4]``.

        The official cameras are in the prompt frame's world, and the PRoPE branch's text keys
        and values are not camera-transformed, so that world is not arbitrary: a query of
        camera ``P_q`` scores a text key ``k`` as ``q . P_q k``. With ``w2c`` re-expressed in
        another camera's frame (``w2c = w2c_official @ inv(world)``, ``world`` ``[1, 4, 4]``
        the official view matrix of that camera) every ``P`` becomes ``P' @ world``, so
        transforming the text's PRoPE keys and values by ``world`` gives the official scores
        and outputs exactly; history keys are in the new frame by construction. Clips then
        start their camera path at the identity (the last history frame).
        """
        prefix = self._text_prefix(world)
        vec = self._conditioning(sigma, actions, None)
        positions = torch.arange(frames.shape[1], device=frames.device)
        _, keys, values = self._trunk(frames, vec, positions, w2c, prefix, prompt_first=True)
        keys = [torch.cat(pair, dim=2) for pair in zip(prefix[0], keys, strict=True)]
        values = [torch.cat(pair, dim=2) for pair in zip(prefix[1], values, strict=True)]
        return WorldPlayCache(keys=keys, values=values, num_frames=frames.shape[1],
                              signature=self.signature, last_frame=frames[:, -1],
                              frames=frames, actions=actions)

    def extend_cache(self, cache: ContextCache, frames: Tensor, actions: Tensor, *,
                     sigma: float) -> WorldPlayCache:
        """The cache of the history so far plus ``frames`` ``[1, F', C, H, W]`` (``actions``
        ``[1, F']``): rebuilt over the whole history, as the official rollout rebuilds its
        context before every chunk. An empty cache takes the prompt frame first."""
        self._check_cache(cache)
        self._check_frames("frames", frames)
        actions = check_actions(actions, frames.shape[0], frames.shape[1])
        history_chunks(cache.num_frames, frames.shape[1], self.clip_frames)
        if cache.num_frames:
            if not isinstance(cache, WorldPlayCache) or cache.frames is None:
                raise TypeError("extend_cache needs the WorldPlayCache this model built (it "
                                "keeps the history frames to rebuild the cache)")
            frames = torch.cat([cache.frames, frames.to(cache.frames.dtype)], dim=1)
            actions = torch.cat([cache.actions, actions], dim=1)
        return self.build_cache_parallel(frames, actions, sigma=sigma)

    # -- prediction ----------------------------------------------------------------------------

    def velocity(self, x_t: Tensor, sigma: Tensor, actions: Tensor, cache: ContextCache, *,
                 motion: Tensor | None = None, action_offset: Tensor | None = None) -> Tensor:
        """Velocity ``[B, F, C, H, W]`` of ``B`` noisy clips ``x_t`` at ``sigma`` ``[B]`` with
        ``actions`` ``[B, F]`` or ``[F]``, over the shared ``cache`` (RoPE frames continue from
        the history; the camera path starts at the last history frame). ``action_offset``
        ``[B, 8]``: added to the 8 movement keys' intensities (clamped to [0, 1]) for the whole
        clip. ``motion`` must be None."""
        if motion is not None:
            raise ValueError("motion latents given to a model without motion latents")
        self._check_cache(cache)
        self._check_frames("x_t", x_t)
        b, f = x_t.shape[:2]
        if f != self.clip_frames:
            raise ValueError(f"x_t must hold one clip of {self.clip_frames} frames, got {f}")
        if not isinstance(sigma, Tensor) or tuple(sigma.shape) != (b,):
            raise ValueError(f"sigma must be a tensor of shape [{b}]")
        actions = check_actions(actions, b, f)
        keys = None
        if check_action_offset(action_offset, b) is not None:
            keys = (action_keys(actions).to(action_offset) + action_offset[:, None]).clamp(0, 1)
        w2c = self._clip_cameras(actions, keys)
        return self._velocity(x_t, sigma[:, None].expand(b, f), actions, keys, w2c, cache)

    def _clip_cameras(self, actions: Tensor, keys: Tensor | None) -> Tensor:
        """View matrices ``[B, F, 4, 4]`` of a clip's path from the identity (the last history
        frame's camera)."""
        steps = action_keys(actions).double() if keys is None else keys.double()
        return view_matrices(camera_path(steps))

    def _velocity(self, x_t: Tensor, sigma: Tensor, actions: Tensor, keys: Tensor | None,
                  w2c: Tensor, cache: ContextCache) -> Tensor:
        """Velocity with explicit per-frame ``sigma`` ``[B, F]`` and cameras ``w2c``."""
        f = x_t.shape[1]
        positions = torch.arange(cache.num_frames, cache.num_frames + f, device=x_t.device)
        vec = self._conditioning(sigma, actions, keys)
        prefix = (cache.keys, cache.values) if cache.keys else self._text_prefix()
        x, _, _ = self._trunk(x_t, vec, positions, w2c, prefix, prompt_first=False,
                              keep_kv=False)
        return self._head(x, vec)

    def teacher_forced_velocity(self, frames: Tensor, actions: Tensor, x_t: Tensor,
                                sigma: Tensor, *, context_sigma: float) -> Tensor:
        """Velocity of every clip of sequences given their clean history.

        ``frames`` ``[B, 1 + N*F, C, H, W]`` clean (prompt first), ``actions`` ``[B, N*F]``,
        ``x_t`` ``[B, N*F, C, H, W]`` noisy clips at ``sigma`` ``[B, N]`` -> ``[B, N*F, ...]``.
        Noisy clip ``j`` is predicted over the cache of the clean prompt and clips ``< j`` at
        ``context_sigma``: exactly :meth:`velocity` over that history. The history attends
        bidirectionally, so its keys differ for every ``j``: one cache and one forward per clip
        (no single masked forward gives them).
        """
        self._check_frames("frames", frames)
        self._check_frames("x_t", x_t)
        b, total = frames.shape[:2]
        f = self.clip_frames
        n = (total - 1) // f
        if (total - 1) % f or tuple(x_t.shape[:2]) != (b, total - 1):
            raise ValueError(f"frames must be [B, 1 + N*{f}] and x_t [B, N*{f}], got "
                             f"{tuple(frames.shape[:2])} and {tuple(x_t.shape[:2])}")
        if not isinstance(sigma, Tensor) or tuple(sigma.shape) != (b, n):
            raise ValueError(f"sigma must be a tensor of shape [{b}, {n}]")
        actions = check_actions(actions, b, total - 1)
        history_actions = torch.cat([actions.new_zeros(b, 1), actions], dim=1)
        rows = []
        for row in range(b):
            clips = []
            for j in range(n):
                cache = self.build_cache_parallel(frames[row:row + 1, :1 + j * f],
                                                  history_actions[row:row + 1, :1 + j * f],
                                                  sigma=context_sigma)
                span = slice(j * f, (j + 1) * f)
                clips.append(self.velocity(x_t[row:row + 1, span], sigma[row, j:j + 1],
                                           actions[row:row + 1, span], cache))
            rows.append(torch.cat(clips, dim=1))
        return torch.cat(rows)
