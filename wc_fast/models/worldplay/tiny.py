"""Write a tiny random WorldPlay model directory in the layout ``--model.path`` reads, for smoke
runs and tests (no real weights needed)::

    python -m wc_fast.models.worldplay.tiny DIR

``DIR/transformer/config.json`` holds the official transformer config keys and
``DIR/transformer/diffusion_pytorch_model.safetensors`` every tensor of a 2-block, 64-wide
WorldPlay under the official state-dict keys (the layout of HY-WorldPlay's action models), all
drawn at random (the official init zeroes the action and camera projections, which would train
nothing visible); ``DIR/vae`` a random diffusers ``AutoencoderKLHunyuanVideo15`` with spatial
factor 4; ``DIR/prompt.safetensors`` the fixed conditioning (``prompt_embeds`` ``[1, 5, 16]``
and ``vision_states`` ``[1, 3, 12]``) for ``--model.prompt_embeds``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from diffusers import AutoencoderKLHunyuanVideo15
from safetensors.torch import save_file

from wc_fast.models.worldplay.model import WorldPlayConfig, WorldPlayWorldModel

# the official config.json keys of a 2-double-block WorldPlay at width 64
TINY_CONFIG = {
    "_class_name": "HunyuanVideo_1_5_DiffusionTransformer", "patch_size": [1, 1, 1],
    "in_channels": 4, "concat_condition": True, "out_channels": 4, "hidden_size": 64,
    "heads_num": 2, "mlp_width_ratio": 4.0, "mlp_act_type": "gelu_tanh",
    "mm_double_blocks_depth": 2, "mm_single_blocks_depth": 0, "rope_dim_list": [8, 12, 12],
    "qkv_bias": True, "qk_norm": True, "qk_norm_type": "rms", "guidance_embed": False,
    "use_meanflow": False, "text_projection": "single_refiner", "use_attention_mask": True,
    "text_states_dim": 16, "text_states_dim_2": 8, "text_pool_type": None, "rope_theta": 256,
    "glyph_byT5_v2": False, "vision_projection": "linear", "vision_states_dim": 12,
    "is_reshape_temporal_channels": False, "use_cond_type_embedding": False,
}


def tiny_vae() -> AutoencoderKLHunyuanVideo15:
    """A random HunyuanVideo-1.5 VAE with 4 latent channels and spatial factor 4."""
    return AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 8),
                                       layers_per_block=1, spatial_compression_ratio=4,
                                       temporal_compression_ratio=2)


def random_weights(config: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Every tensor of the official state dict of ``config``: matrices ~ N(0, 1/fan_in),
    norm gains ~ 1 + N(0, 0.1^2), other vectors ~ N(0, 0.1^2)."""
    model = WorldPlayWorldModel(WorldPlayConfig(**{
        k: tuple(v) if isinstance(v, list) else v for k, v in config.items()
        if k in WorldPlayConfig.__dataclass_fields__}), clip_frames=1, latent_size=(1, 1))
    weights = {}
    for name, p in model.state_dict().items():
        if p.dim() >= 2:
            weights[name] = torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5
        elif "norm" in name and name.endswith("weight"):
            weights[name] = 1 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            weights[name] = 0.1 * torch.randn(p.shape, generator=gen)
    return weights


def write_tiny_checkpoint(root: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny model directory (see the module docstring) to ``root``; returns it."""
    root = Path(root)
    gen = torch.Generator().manual_seed(seed)
    transformer = root / "transformer"
    transformer.mkdir(parents=True, exist_ok=True)
    (transformer / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2) + "\n")
    save_file(random_weights(TINY_CONFIG, gen),
              transformer / "diffusion_pytorch_model.safetensors")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tiny_vae().save_pretrained(root / "vae")
    save_file({"prompt_embeds": torch.randn(1, 5, TINY_CONFIG["text_states_dim"], generator=gen),
               "vision_states": torch.randn(1, 3, TINY_CONFIG["vision_states_dim"],
                                            generator=gen)}, root / "prompt.safetensors")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = write_tiny_checkpoint(args.dir, seed=args.seed)
    print(f"wrote a tiny WorldPlay model to {root}: train it with `python -m wc_fast.train "
          f"--preset worldplay_smoke --model.path {root} --model.prompt_embeds "
          f"{root / 'prompt.safetensors'}`")


if __name__ == "__main__":
    main()
