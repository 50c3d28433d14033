"""HY-WorldPlay's transformer pieces, in its checkpoint's key layout.

WorldPlay (HY-World 1.5) is HunyuanVideo-1.5 with double-stream blocks only, a discrete action
embedding added to the timestep embedding, and a PRoPE camera branch in every block's image
self-attention. The modules here hold exactly the official parameters under the official names
(``double_blocks.{i}.img_attn_q``, ``time_in.mlp.0``, ``txt_in.individual_token_refiner...``), so
an official state dict loads strictly. diffusers supplies the sinusoidal embedding and the
rotary tables and rotation (the same formulas); its ``HunyuanVideo15Transformer3DModel`` keys and
blocks differ (fused text/image attention, no action or camera branch), so the blocks are
written here. Tensor layouts: tokens ``[B, N, D]``, heads ``[B, H, N, Dh]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import (
    apply_rotary_emb,
    get_1d_rotary_pos_embed,
    get_timestep_embedding,
)
from torch import Tensor, nn

FREQUENCY_DIM = 256  # the sinusoid width of every TimestepEmbedder
EPS = 1e-6


def sinusoid(t: Tensor) -> Tensor:
    """``t`` ``[N]`` -> ``[N, 256]`` fp32 ``cat(cos, sin)``: the official ``timestep_embedding``."""
    return get_timestep_embedding(t.float(), FREQUENCY_DIM, flip_sin_to_cos=True,
                                  downscale_freq_shift=0)


class TimestepEmbedder(nn.Module):
    """Sinusoid -> Linear -> SiLU -> Linear (keys ``mlp.0``, ``mlp.2``); also the action
    embedder, which embeds the action id as if it were a timestep."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQUENCY_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(sinusoid(t).to(self.mlp[0].weight.dtype))


class Mlp(nn.Module):
    """``fc2(act(fc1(x)))`` (keys ``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), act, nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Modulation(nn.Module):
    """``linear(silu(vec))`` into ``factor`` vectors (key ``linear``)."""

    def __init__(self, dim: int, factor: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, factor * dim)

    def forward(self, vec: Tensor) -> Tensor:
        return self.linear(F.silu(vec))


def layer_norm(x: Tensor) -> Tensor:
    """The blocks' LayerNorm without affine parameters (eps 1e-6)."""
    return F.layer_norm(x, x.shape[-1:], eps=EPS)


class RefinerBlock(nn.Module):
    """One ``IndividualTokenRefinerBlock``: gated self-attention and SiLU MLP on the text tokens
    ``[1, L, D]``, gated by the pooled conditioning ``c`` ``[1, D]``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=EPS)
        self.self_attn_qkv = nn.Linear(dim, 3 * dim)
        self.self_attn_proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), nn.SiLU())
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        gate_attn, gate_mlp = self.adaLN_modulation(c).unsqueeze(1).chunk(2, dim=-1)
        q, k, v = self.self_attn_qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2))
        x = x + self.self_attn_proj(attn.transpose(1, 2).flatten(2)) * gate_attn
        return x + self.mlp(self.norm2(x)) * gate_mlp


class TextProjection(nn.Module):
    """``linear_2(silu(linear_1(x)))``: the refiner's pooled-text embedder."""

    def __init__(self, dim_in: int, dim: int) -> None:
        super().__init__()
        self.linear_1, self.act_1, self.linear_2 = nn.Linear(dim_in, dim), nn.SiLU(), nn.Linear(
            dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.act_1(self.linear_1(x)))


class IndividualTokenRefiner(nn.Module):
    def __init__(self, dim: int, heads: int, depth: int, mlp_ratio: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(RefinerBlock(dim, heads, mlp_ratio) for _ in range(depth))


class TokenRefiner(nn.Module):
    """``SingleTokenRefiner`` (key ``txt_in``): the text encoder's states ``[1, L, text_dim]``
    (valid tokens only) at text timestep ``t`` ``[1]`` -> text tokens ``[1, L, D]``."""

    def __init__(self, dim_in: int, dim: int, heads: int, depth: int = 2,
                 mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.input_embedder = nn.Linear(dim_in, dim)
        self.t_embedder = TimestepEmbedder(dim)
        self.c_embedder = TextProjection(dim_in, dim)
        self.individual_token_refiner = IndividualTokenRefiner(dim, heads, depth, mlp_ratio)

    def forward(self, text: Tensor, t: Tensor) -> Tensor:
        c = self.t_embedder(t) + self.c_embedder(text.mean(dim=1))
        x = self.input_embedder(text)
        for block in self.individual_token_refiner.blocks:
            x = block(x, c)
        return x


class VisionProjection(nn.Module):
    """The SigLIP image tokens' projection (key ``vision_in.proj``)."""

    def __init__(self, dim_in: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(dim_in), nn.Linear(dim_in, dim_in), nn.GELU(),
                                  nn.Linear(dim_in, dim), nn.LayerNorm(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class ByT5Mapper(nn.Module):
    """The glyph (ByT5) tokens' projection (key ``byt5_in``), 1472 -> 2048 -> 2048 -> D."""

    def __init__(self, dim: int, dim_in: int = 1472, hidden: int = 2048) -> None:
        super().__init__()
        self.layernorm = nn.LayerNorm(dim_in)
        self.fc1, self.fc2, self.fc3 = (nn.Linear(dim_in, hidden), nn.Linear(hidden, hidden),
                                        nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.fc2(F.gelu(self.fc1(self.layernorm(x)))))
        return self.fc3(x)


class FinalLayer(nn.Module):
    """Per-frame modulated LayerNorm and the output projection (key ``final_layer``)."""

    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        """``x`` ``[B, F*T, D]``, ``vec`` ``[B, F, D]``."""
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=-1)
        return self.linear(modulate(layer_norm(x), shift, scale))


def per_frame(x: Tensor, m: Tensor) -> Tensor:
    """Frame-major tokens ``[B, F*T, D]`` -> ``[B, F, T, D]``, beside a per-frame ``m``
    ``[B, F, D]`` -> ``[B, F, 1, D]``; returns the first."""
    return x.unflatten(1, (m.shape[1], -1))


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """``x * (1 + scale) + shift`` with per-frame ``shift, scale`` ``[B, F, D]``."""
    y = per_frame(x, shift) * (1 + scale.unsqueeze(2)) + shift.unsqueeze(2)
    return y.flatten(1, 2)


def gate(x: Tensor, g: Tensor) -> Tensor:
    """``x * g`` with a per-frame gate ``g`` ``[B, F, D]``."""
    return (per_frame(x, g) * g.unsqueeze(2)).flatten(1, 2)


# -- positions and cameras -------------------------------------------------------------------


def rope_tables(axes: tuple[int, int, int], theta: float, positions: Tensor,
                grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Real (cos, sin) tables ``[F*h*w, Dh]`` of HunyuanVideo's 3-axis RoPE for token frames at
    ``positions`` ``[F]`` on an ``h x w`` grid (channels split ``axes`` over frame, row,
    column; each pair rotates together): the official ``get_nd_rotary_pos_embed`` rows."""
    f, (h, w) = positions.shape[0], grid
    device = positions.device
    coords = (positions.float(), torch.arange(h, device=device).float(),
              torch.arange(w, device=device).float())
    shapes = ((f, 1, 1), (1, h, 1), (1, 1, w))
    cos, sin = [], []
    for dim, pos, shape in zip(axes, coords, shapes, strict=True):
        c, s = get_1d_rotary_pos_embed(dim, pos, theta=theta, use_real=True)
        cos.append(c.to(device).view(*shape, dim).expand(f, h, w, dim))
        sin.append(s.to(device).view(*shape, dim).expand(f, h, w, dim))
    return torch.cat(cos, -1).reshape(f * h * w, -1), torch.cat(sin, -1).reshape(f * h * w, -1)


def rotate(x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
    """RoPE on ``x`` ``[B, H, N, Dh]`` (computed in fp32, returned in ``x``'s dtype)."""
    return apply_rotary_emb(x, tables, use_real=True, use_real_unbind_dim=-1)


def prope_matrices(w2c: Tensor, ks: Tensor) -> tuple[Tensor, Tensor]:
    """PRoPE's projective transforms of cameras ``w2c`` ``[B, F, 4, 4]`` with intrinsics
    ``ks`` ``[B, F, 3, 3]``: ``P = lift(K') w2c`` and ``P^-1 = c2w lift(K'^-1)``, where ``K'``
    keeps only the focal lengths (the official ``_prepare_apply_fns_all_dim``)."""
    fx, fy = ks[..., 0, 0], ks[..., 1, 1]
    lift = torch.zeros_like(w2c)
    lift[..., 0, 0], lift[..., 1, 1], lift[..., 2, 2], lift[..., 3, 3] = fx, fy, 1.0, 1.0
    lift_inv = torch.zeros_like(w2c)
    lift_inv[..., 0, 0], lift_inv[..., 1, 1] = 1.0 / fx, 1.0 / fy
    lift_inv[..., 2, 2], lift_inv[..., 3, 3] = 1.0, 1.0
    rt = w2c[..., :3, :3].transpose(-1, -2)
    c2w = torch.zeros_like(w2c)
    c2w[..., :3, :3] = rt
    c2w[..., :3, 3:] = -rt @ w2c[..., :3, 3:]
    c2w[..., 3, 3] = 1.0
    return lift @ w2c, c2w @ lift_inv


def apply_projective(x: Tensor, matrix: Tensor) -> Tensor:
    """``x`` ``[B, H, F*T, Dh]``: every 4-channel group of a token of frame ``f`` multiplied by
    ``matrix[:, f]`` ``[B, F, 4, 4]`` (``y = M x``), in fp32 at least; returns ``x``'s dtype."""
    b, heads, n, dh = x.shape
    f = matrix.shape[1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    groups = x.to(dtype).reshape(b, heads, f, n // f, dh // 4, 4)
    out = torch.einsum("bfij,bhftkj->bhftki", matrix.to(dtype), groups)
    return out.reshape(b, heads, n, dh).to(x.dtype)


class DoubleBlock(nn.Module):
    """``MMDoubleStreamBlock`` with WorldPlay's PRoPE projection (``img_attn_prope_proj``).

    ``forward`` runs one of its two streams (so that an FSDP unit wrapping the block gathers
    its weights on every use): ``"text"`` updates the text tokens alone and returns their keys
    and values; ``"vision"`` updates the image tokens, whose queries attend through ``attend``
    over the text, the history and their own keys (RoPE heads first, then PRoPE heads).
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float, qkv_bias: bool) -> None:
        super().__init__()
        self.heads = heads
        head_dim, hidden = dim // heads, int(dim * mlp_ratio)
        for stream in ("img", "txt"):
            setattr(self, f"{stream}_mod", Modulation(dim, 6))
            for name in ("q", "k", "v", "proj"):
                setattr(self, f"{stream}_attn_{name}", nn.Linear(dim, dim, bias=qkv_bias))
            setattr(self, f"{stream}_attn_q_norm", nn.RMSNorm(head_dim, eps=EPS))
            setattr(self, f"{stream}_attn_k_norm", nn.RMSNorm(head_dim, eps=EPS))
            setattr(self, f"{stream}_mlp", Mlp(dim, hidden, nn.GELU(approximate="tanh")))
        self.img_attn_prope_proj = nn.Linear(dim, dim, bias=qkv_bias)

    def forward(self, stream: str, *args, **kwargs):
        if stream == "text":
            return self._text(*args, **kwargs)
        return self._vision(*args, **kwargs)

    def _qkv(self, stream: str, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Normalised tokens ``[B, N, D]`` -> q, k (RMS-normed), v ``[B, H, N, Dh]``."""
        q, k, v = (getattr(self, f"{stream}_attn_{n}")(x).unflatten(-1, (self.heads, -1))
                   .transpose(1, 2) for n in ("q", "k", "v"))
        # the RMS norms in their weights' dtype (fp32 weights under bf16 autocast)
        q_norm, k_norm = (getattr(self, f"{stream}_attn_{n}_norm") for n in ("q", "k"))
        q = q_norm(q.to(q_norm.weight.dtype)).to(v.dtype)
        k = k_norm(k.to(k_norm.weight.dtype)).to(v.dtype)
        return q, k, v

    def _text(self, txt: Tensor, vec: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Text tokens ``[1, L, D]`` at text conditioning ``vec`` ``[1, 1, D]`` -> updated
        tokens and their keys, values ``[1, H, L, Dh]``."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.txt_mod(vec).chunk(6, dim=-1)
        q, k, v = self._qkv("txt", modulate(layer_norm(txt), shift1, scale1))
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        txt = txt + gate(self.txt_attn_proj(attn), gate1)
        mlp = self.txt_mlp(modulate(layer_norm(txt), shift2, scale2))
        return txt + gate(mlp, gate2), k, v

    def _vision(self, img: Tensor, vec: Tensor, rope: tuple[Tensor, Tensor],
                cameras: tuple[Tensor, Tensor], attend) -> tuple[Tensor, Tensor, Tensor]:
        """Image tokens ``[B, F*T, D]`` with per-frame conditioning ``vec`` ``[B, F, D]``,
        ``rope`` tables and ``cameras`` ``(P, P^-1)`` ``[B, F, 4, 4]`` -> updated tokens and the
        keys, values ``[B, 2H, F*T, Dh]`` of both branches (what a cache keeps).

        The RoPE branch rotates q, k; the PRoPE branch multiplies q by ``P^T`` (as
        ``q @ P``), k and v by ``P^-1`` and its output by ``P``; the two outputs are projected
        by ``img_attn_proj`` and ``img_attn_prope_proj`` and summed.
        """
        shift1, scale1, gate1, shift2, scale2, gate2 = self.img_mod(vec).chunk(6, dim=-1)
        q, k, v = self._qkv("img", modulate(layer_norm(img), shift1, scale1))
        p, p_inv = cameras
        q_p = apply_projective(q, p.transpose(-1, -2))
        k_p, v_p = apply_projective(k, p_inv), apply_projective(v, p_inv)
        keys = torch.cat([rotate(k, rope), k_p], dim=1)
        values = torch.cat([v, v_p], dim=1)
        out = attend(torch.cat([rotate(q, rope), q_p], dim=1), keys, values)
        h = self.heads
        plain = out[:, :h].transpose(1, 2).flatten(2)
        projected = apply_projective(out[:, h:], p).transpose(1, 2).flatten(2)
        attn = self.img_attn_proj(plain) + self.img_attn_prope_proj(projected)
        img = img + gate(attn, gate1)
        mlp = self.img_mlp(modulate(layer_norm(img), shift2, scale2))
        return img + gate(mlp, gate2), keys, values
