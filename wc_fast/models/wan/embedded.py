"""The embedded Wan world model: a tiny diffusers ``WanTransformer3DModel`` on the world's
pixel frames, sized by the ``model`` section of a run.

It shares nothing with :class:`~wc_fast.models.TinyWorldDiT` but the world and the key
embedding: Wan's patch embedding, 3-D rotary embedding, blocks and output head, on RGB frames
``[B, F, 3, H, W]`` in [-1, 1] (codec :class:`~wc_fast.models.protocol.PixelFrames`), with no
warp head and no motion prior. With ``model.reference_frame`` each frame also receives the last
frame before its chunk as extra input channels, as Wan's image-to-video models take their
conditioning image. Its text conditioning is one fixed zero
token (the world has no prompts).
"""

from __future__ import annotations

from diffusers import WanTransformer3DModel

from wc_fast.config import ModelConfig
from wc_fast.models.tiny.dit import DTYPES
from wc_fast.models.wan.model import WanWorldModel

# the width of the (fixed, zero) text token and of the sinusoidal timestep features
TEXT_DIM = 16
FREQ_DIM = 256
# the FFN's hidden width per model width (Wan2.1-1.3B: 8960 / 1536 = 5.8)
FFN_RATIO = 4


def embedded_transformer(cfg: ModelConfig) -> WanTransformer3DModel:
    """A randomly initialised ``WanTransformer3DModel`` of ``cfg``'s sizes: ``channels`` out
    (and in; twice as many in with ``reference_frame``), ``(1, patch, patch)`` patches,
    ``heads`` heads of ``dim // heads``, ``depth`` blocks, an FFN of ``FFN_RATIO * dim``."""
    return WanTransformer3DModel(patch_size=(1, cfg.patch, cfg.patch),
                                 num_attention_heads=cfg.heads,
                                 attention_head_dim=cfg.dim // cfg.heads,
                                 in_channels=cfg.channels * (2 if cfg.reference_frame else 1),
                                 out_channels=cfg.channels,
                                 text_dim=TEXT_DIM, freq_dim=FREQ_DIM, ffn_dim=FFN_RATIO * cfg.dim,
                                 num_layers=cfg.depth)


def embedded_wan_model(cfg: ModelConfig, *, seed: int = 0) -> WanWorldModel:
    """The embedded :class:`WanWorldModel` of ``cfg`` (``model.backbone wan`` with an empty
    ``model.path``): a fresh transformer from the global generator, key vectors from
    ``seed``, frames ``cfg.resolution`` square pixels. Load weights with
    ``load_state_dict``."""
    if cfg.backbone != "wan" or cfg.path:
        raise ValueError(f"the embedded Wan model needs model.backbone 'wan' and an empty "
                         f"model.path, got {cfg.backbone!r} and {cfg.path!r}")
    model = WanWorldModel(embedded_transformer(cfg), clip_frames=cfg.clip_frames,
                          latent_size=(cfg.resolution, cfg.resolution),
                          context_sigma=cfg.context_sigma, seed=seed,
                          activation_checkpointing=cfg.activation_checkpointing,
                          autocast_dtype=DTYPES[cfg.dtype], pixels=True, cfg=cfg,
                          reference_frame=cfg.reference_frame,
                          history_window=cfg.history_window)
    return model
