"""One RL iteration of a Wan2.1-shaped world model with random weights, per variant: rollout /
reward / train seconds, peak memory and the train phase's MFU, with and without LoRA and
activation checkpointing.

    python -m studies.wan_iteration [--shape wan2.1-1.3b|tiny] [--variants full,lora,...]
                                  [--layers N] [--resolution R] [--json PATH]
                                  [--device auto|cpu|cuda]

The transformer has the shape of Wan2.1-T2V-1.3B (30 blocks of width 1536, 12 heads, FFN
8960, text width 4096) and the VAE that of Wan2.1's, both randomly initialised in memory, so
nothing is downloaded or read from disk: the timings do not depend on the weights. The run
is the ``wan`` preset (bf16 autocast over fp32 weights, NFT update, micro-batches) at a
shorter rollout (``--steps`` sampler steps, ``--num-clips`` clips, clip index N timed after
one warm-up iteration). Variants: ``full`` (every weight trains), ``checkpointing`` (every
block rerun in the backward), ``lora`` (rank-16 adapters and the conditioning parameters
train) and ``lora+checkpointing``. MFU is the train phase's model FLOP/s over two
denominators: a large bf16 matmul measured in the same run, and on a known GPU its spec
sheet's dense bf16 peak. ``--shape tiny`` runs the same path with the tests' few-thousand-weight
model (the CPU dry run of the GPU check); ``--layers N`` keeps the shape's blocks but only N of
them (a reduced size with the same per-block work, for a CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from wc_fast import config as config_lib
from wc_fast.infra.metrics import matmul_flops
from wc_fast.infra.runtime import resolve_device
from wc_fast.models.tiny.dit import DTYPES
from wc_fast.models.wan.model import WanWorldModel
from wc_fast.models.wan.vae import WanLatentCodec
from wc_fast.rl.trainer import Trainer

# transformer/config.json and vae/config.json of Wan2.1-T2V-1.3B-Diffusers (the VAE's are
# AutoencoderKLWan's defaults), and the tests' tiny model
SHAPES = {
    "wan2.1-1.3b": {
        "transformer": dict(patch_size=(1, 2, 2), num_attention_heads=12,
                            attention_head_dim=128, in_channels=16, out_channels=16,
                            text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                            rope_max_seq_len=1024),
        "vae": {}},
    "tiny": {
        "transformer": dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                            in_channels=4, out_channels=4, text_dim=16, freq_dim=16,
                            ffn_dim=32, num_layers=2, rope_max_seq_len=32),
        "vae": dict(base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                    latents_mean=[0.0] * 4, latents_std=[1.0] * 4)},
}
# (LoRA rank, activation checkpointing)
VARIANTS = {"full": (0, False), "checkpointing": (0, True), "lora": (16, False),
            "lora+checkpointing": (16, True)}
# dense bf16 tensor-core peaks from NVIDIA's spec sheets (no sparsity), FLOP/s
SPEC_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "H20": 148e12,
                  "A100": 312e12}


def spec_peak(device: torch.device) -> float | None:
    """The spec sheet's dense bf16 peak of ``device``'s GPU, if it is one we know."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in SPEC_BF16_PEAK.items() if key in name.split()), None)


def run_config(args: argparse.Namespace, rank: int, rerun: bool) -> config_lib.Config:
    """The ``wan`` preset at the benchmark's rollout size, for one variant."""
    cfg = config_lib.build_preset("wan")
    cfg.model.path = "random weights (studies/wan_iteration.py)"
    cfg.model.resolution = args.resolution
    cfg.model.clip_frames = args.clip_frames
    cfg.model.lora_rank = rank
    # every weight (or every adapter) trains, whatever the recipe trains: the variants measure
    # the full update's and LoRA's cost
    cfg.optim.trainable = "all"
    cfg.model.activation_checkpointing = rerun
    cfg.rollout.group_size = args.group_size
    cfg.rollout.num_clips = args.num_clips
    cfg.rollout.steps = args.steps
    cfg.nft.keep = min(cfg.nft.keep, args.group_size // 2)
    cfg.update.micro_batch = args.micro_batch
    if args.device == "cpu" or not torch.cuda.is_available():
        cfg.model.dtype = "float32"  # CPU autocast to bf16 is slower than fp32 there
    config_lib.validate(cfg)
    return cfg


def with_layers(shape: dict, layers: int | None) -> dict:
    """``shape`` with ``layers`` transformer blocks (``None``: its own number)."""
    if layers is None:
        return shape
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers: expected a positive int or None, got {layers!r}")
    return {**shape, "transformer": {**shape["transformer"], "num_layers": layers}}


def build(shape: dict, cfg: config_lib.Config, device: torch.device
          ) -> tuple[WanWorldModel, WanLatentCodec]:
    """A random world model and VAE of ``shape``, built on ``device``."""
    torch.manual_seed(0)
    with device:
        transformer = WanTransformer3DModel(**shape["transformer"])
        vae = AutoencoderKLWan(**shape["vae"])
    factor = vae.config.scale_factor_spatial
    side = cfg.model.resolution // factor
    m = cfg.model
    model = WanWorldModel(transformer, clip_frames=m.clip_frames, latent_size=(side, side),
                          context_sigma=m.context_sigma, seed=cfg.train.seed,
                          activation_checkpointing=m.activation_checkpointing,
                          autocast_dtype=DTYPES[m.dtype])
    if m.lora_rank:
        model.add_lora(m.lora_rank, m.lora_alpha, m.lora_targets, seed=cfg.train.seed)
    return model.to(device), WanLatentCodec(vae, pixel_size=m.resolution)


def measure(args: argparse.Namespace, name: str, device: torch.device) -> dict:
    """Warm-up iteration, then one timed iteration at clip N, of variant ``name``."""
    rank, rerun = VARIANTS[name]
    cfg = run_config(args, rank, rerun)
    model, codec = build(with_layers(SHAPES[args.shape], args.layers), cfg, device)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    trainer = Trainer(cfg, model, device, codec=codec)
    step = cfg.rollout.num_clips - 1
    trainer.iteration(step)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    stats = trainer.iteration(step + cfg.rollout.num_clips)
    peak_mib = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
                else None)
    result = {"variant": name, "lora_rank": rank, "activation_checkpointing": rerun,
              "parameters": total, "trained_parameters": trained,
              "phases_s": dict(stats.times), "total_s": sum(stats.times.values()),
              "train_flops_per_s": stats.train_flops / stats.times["train"],
              "peak_mib": peak_mib}
    del trainer, model, codec
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options (also the RL-iteration benchmark's sizes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="wan2.1-1.3b", choices=list(SHAPES))
    parser.add_argument("--layers", type=int, default=None,
                        help="transformer blocks (default: the shape's own, 30 for Wan2.1-1.3B)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--resolution", type=int, default=256, help="frame side in pixels")
    parser.add_argument("--clip-frames", type=int, default=4, help="latent frames per clip")
    parser.add_argument("--group-size", type=int, default=12)
    parser.add_argument("--num-clips", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="sampler steps")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers: expected a positive number of blocks, got {args.layers}")
    names = [v for v in args.variants.split(",") if v]
    if set(names) - set(VARIANTS) or not names:
        parser.error(f"--variants: expected some of {list(VARIANTS)}, got {args.variants!r}")
    args.variants = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    rows = [measure(args, name, device) for name in args.variants]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    measured = matmul_flops(device, dtype, n=8192 if device.type == "cuda" else 2048, repeat=3)
    spec = spec_peak(device)
    for row in rows:
        row["mfu_measured"] = row["train_flops_per_s"] / measured
        row["mfu_spec"] = row["train_flops_per_s"] / spec if spec else None
    result = {"shape": args.shape, "layers": args.layers, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu", "resolution": args.resolution, "clip_frames": args.clip_frames,
              "group_size": args.group_size, "num_clips": args.num_clips, "steps": args.steps,
              "matmul_dtype": str(dtype).removeprefix("torch."), "matmul_flops_per_s": measured,
              "spec_bf16_flops_per_s": spec, "variants": rows}
    print(f"{'variant':<20}{'rollout':>9}{'reward':>8}{'train':>8}{'total s':>9}"
          f"{'peak GiB':>10}{'MFU meas.':>10}{'MFU spec':>9}")
    for row in rows:
        p = row["phases_s"]
        peak = f"{row['peak_mib'] / 1024:.1f}" if row["peak_mib"] is not None else "-"
        spec_mfu = f"{100 * row['mfu_spec']:.0f}%" if row["mfu_spec"] is not None else "-"
        print(f"{row['variant']:<20}{p['rollout']:>9.2f}{p['reward']:>8.2f}{p['train']:>8.2f}"
              f"{row['total_s']:>9.2f}{peak:>10}{100 * row['mfu_measured']:>9.0f}%{spec_mfu:>9}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
