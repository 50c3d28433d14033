"""Memory per GPU of the WorldPlay presets, from the model's shapes, with the activation and
cache terms measured on the tiny model and scaled.

    python -m studies.worldplay_memory

1. Parameter counts of WorldPlay-8B (HunyuanVideo-1.5 480p i2v: 54 double blocks, width 2048,
   16 heads, text 3584, SigLIP 1152, ByT5) from :class:`WorldPlayWorldModel` on the meta device.
2. Bytes saved for the backward of one :meth:`velocity` forward of the tiny model (the
   ``wc_fast.models.worldplay.tiny`` config) in fp32, with and without activation
   checkpointing, counted by ``torch.autograd.graph.saved_tensors_hooks`` (each storage once)
   at 2 and 4 blocks: the slope per block, token and model width is what the 8B estimate
   scales by (the rest, embedding and head, is left out). Without checkpointing the slope
   includes the CPU attention's saved scores, which a flash-style GPU kernel does not keep:
   an upper bound for the one block a checkpointed backward reruns.
3. The history cache's bytes (``ContextCache.nbytes``) of the tiny model against the formula
   ``2 (k, v) x blocks x 2 branches x tokens x width x bytes``.
4. The table: per GPU, fp32 weights of the model and of the old (EMA) model (for a LoRA run the
   old model holds only the trained weights, over the model's frozen base), fp32 gradients and
   optimizer states of what trains (Muon: one momentum for the blocks' matrices, AdamW: two
   moments for the rest), activations of one micro-batch with checkpointing, and the shared
   history cache in bf16 against one replicated per candidate.
"""

from __future__ import annotations

import torch

from wc_fast.models.worldplay.model import WorldPlayConfig, WorldPlayWorldModel
from wc_fast.models.worldplay.tiny import TINY_CONFIG

GB = 1e9
TEXT_TOKENS = 256 + 729  # a typical prompt's valid text + ByT5 tokens, and SigLIP's 27 x 27


def saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves while ``fn()`` runs."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def tiny_model(depth: int, checkpointing: bool) -> WorldPlayWorldModel:
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in TINY_CONFIG.items()
              if k in WorldPlayConfig.__dataclass_fields__}
    config = WorldPlayConfig(**{**fields, "mm_double_blocks_depth": depth})
    torch.manual_seed(0)
    return WorldPlayWorldModel(config, clip_frames=4, latent_size=(8, 8),
                               activation_checkpointing=checkpointing)


def velocity_saved_bytes(model: WorldPlayWorldModel, rows: int) -> tuple[int, int, int]:
    """Saved bytes of a ``rows``-clip velocity over a 5-frame history, its query tokens and
    the history cache's bytes."""
    frames = torch.randn(1, 5, *model.clip_shape[1:])
    with torch.no_grad():
        cache = model.build_cache_parallel(frames, torch.randint(0, 81, (1, 5)), sigma=0.014)
    x = torch.randn(rows, *model.clip_shape)
    actions = torch.randint(0, 81, (rows, 4))
    nbytes = saved_bytes(lambda: model.velocity(x, torch.rand(rows), actions, cache))
    return nbytes, rows * model.clip_frames * model.tokens_per_frame, cache.nbytes()


def measure_tiny() -> dict[str, float]:
    """Per-block, per-token, per-width saved bytes and the cache check on the tiny model."""
    out = {}
    for ckpt in (False, True):
        (shallow, tokens, _), (deep, _, cache_bytes) = (
            velocity_saved_bytes(tiny_model(depth, ckpt), rows=4) for depth in (2, 4))
        width = TINY_CONFIG["hidden_size"]
        out["ckpt" if ckpt else "full"] = (deep - shallow) / (2 * tokens * width)
    model = tiny_model(4, False)
    cache_tokens = model.text_tokens + 5 * model.tokens_per_frame
    out["cache_measured"] = cache_bytes
    out["cache_formula"] = 2 * 4 * 2 * cache_tokens * width * 4
    return out


def main() -> None:
    with torch.device("meta"):
        model = WorldPlayWorldModel(WorldPlayConfig(), clip_frames=4, latent_size=(30, 30))
    c = model.config
    total = sum(p.numel() for p in model.parameters())
    muon = sum(p.numel() for p in model.hidden_matrices())
    cond = sum(p.numel() for p in model.conditioning_parameters())
    d, layers, t = c.hidden_size, c.mm_double_blocks_depth, model.tokens_per_frame
    # LoRA rank 64 on the image stream's q, k, v, out (d x d) and MLP (d x 4d, 4d x d)
    lora = layers * 64 * (4 * 2 * d + 2 * (d + 4 * d))
    print(f"WorldPlay-8B: {total / 1e9:.3f}B parameters; block matrices (Muon) "
          f"{muon / 1e9:.3f}B; conditioning {cond / 1e9:.3f}B; LoRA r64 {lora / 1e6:.1f}M")
    tiny = measure_tiny()
    print(f"tiny model, saved for backward per block x token x width: {tiny['full']:.1f} B "
          f"without checkpointing, {tiny['ckpt']:.1f} B with")
    print(f"tiny cache: measured {tiny['cache_measured']} B, formula {tiny['cache_formula']} B")
    micro, frames = 8, 4  # update.micro_batch clips of clip_frames latent frames
    tokens = micro * frames * t
    # checkpointing keeps every block's input and reruns one block: its full activations
    act = (tiny["ckpt"] * layers + tiny["full"]) * tokens * d
    history_frames = 1 + 4 * (4 - 1)  # prompt + 3 clips before the last of rollout.num_clips 4
    cache_tokens = TEXT_TOKENS + history_frames * t
    cache = 2 * layers * 2 * cache_tokens * d * 2  # bf16
    print(f"activations of a micro-batch of {micro} clips ({tokens} tokens): {act / GB:.1f} GB "
          f"(fp32 measurement; bf16 autocast keeps the residual stream fp32)")
    print(f"history cache at {cache_tokens} tokens, bf16: {cache / GB:.1f} GB shared, "
          f"{12 * cache / GB:.1f} GB replicated for 12 candidates")
    trained_lora = lora + cond

    def lora_weights(copies: int) -> float:
        """The LoRA model (frozen block matrices bf16, the rest fp32) and ``copies`` fp32
        copies of its trained weights (the old model; the reference)."""
        return 2 * muon + 4 * (total - muon) + copies * 4 * trained_lora

    rows = {
        # model and old model fp32, sharded over 8 ranks
        "worldplay (8 GPUs, FSDP2)": dict(shards=8, weights=2 * 4 * total, trained=total,
                                          muon=muon, act=act),
        # as built: the frozen block matrices in bf16 (optim.hold_frozen_matrices_in), the
        # rest of the model fp32; the old model copies only the trained weights over the
        # model's frozen ones (optim.frozen_copy), and with nft.kl_beta the reference too;
        # the preset's micro-batches of 4 clips
        "worldplay_lora (1 GPU)": dict(shards=1, weights=lora_weights(1), trained=trained_lora,
                                       muon=0, act=act / 2),
        "worldplay_lora with a KL (1 GPU)": dict(shards=1, weights=lora_weights(2),
                                                 trained=trained_lora, muon=0, act=act / 2),
        "worldplay_lora at micro_batch 8": dict(shards=1, weights=lora_weights(1),
                                                trained=trained_lora, muon=0, act=act),
    }
    print("\n| preset | weights (model + old) | gradients | optimizer | activations | cache "
          "| total |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        weights = r["weights"] / r["shards"]
        grads = 4 * r["trained"] / r["shards"]
        optim = (4 * r["muon"] + 8 * (r["trained"] - r["muon"])) / r["shards"]
        sum_gb = (weights + grads + optim + r["act"] + cache) / GB
        print(f"| {name} | {weights / GB:.1f} | {grads / GB:.1f} | {optim / GB:.1f} | "
              f"{r['act'] / GB:.1f} | {cache / GB:.1f} | {sum_gb:.1f} |")


if __name__ == "__main__":
    main()
