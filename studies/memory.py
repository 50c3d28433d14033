"""Peak memory of an RL iteration's phases at a real model size, measured on fake tensors
(``FakeTensorMode``: shapes and dtypes, no storage), so a CPU with a few GB sizes a GPU run.

    python -m studies.memory [--model wan2.1-1.3b|worldplay-8b|tiny] [--variants full,...]
                             [--resolution 256] [--clip-frames 4] [--group-size 12]
                             [--steps 10] [--micro-batch 8] [--lora-rank 16] [--kl]
                             [--whole-copies] [--compare WAN_ITERATION_JSON] [--json PATH]

The trainer's own setup builds the run: the model (random weights in the backbone's real
shape; bf16 autocast over fp32 weights), its frozen weights cast to bf16
(``optim.hold_frozen_matrices_in``), the old model (``optim.frozen_copy``: trained weights
copied, frozen ones shared) and with ``--kl`` the reference, and the optimizers
(``--whole-copies``: whole copies and fp32 frozen matrices, the trainer before frozen weights
were shared). Then the phases of an iteration on clip 2 (a history of the prompt frame and one
clip), twice, the second measured (the first makes the gradients and optimizer states, which
stay alive from one update to the next, as in the trainer):

- rollout: the old model's history cache and ``--group-size`` candidates sampled over it by
  the ODE sampler, without gradient;
- decode: the candidates decoded to pixels by the VAE, as the rewards read them;
- update: one micro-batch of ``--micro-batch`` noisy clips: the current model's cache, its
  velocity with gradient, the old (and reference) velocity without, the NFT loss, the
  backward and every optimizer's step (their states are made there).

Every storage a tensor holds is counted from its creation to its release (its last reference
gone), and the peak is kept: what ``torch.cuda.max_memory_allocated`` measures on a device,
less what a fake device cannot see (the attention kernels' workspaces, the allocator's
rounding and fragmentation, CUDA graphs) and less the reward models. ``--compare`` puts
``studies.wan_iteration``'s measured peaks beside (the H200's in ``bench/results/``).

``torch.distributed._tools.mem_tracker.MemTracker`` does the same by category, but refuses a
module that runs twice in one iteration, which every block here does (the history cache, then
the velocity); the count below is by storage alone.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import weakref
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from wc_fast import config as config_lib
from wc_fast.models.tiny_dit import DTYPES
from wc_fast.optim import build_optimizers, freeze_untrained, frozen_copy, hold_frozen_matrices_in
from wc_fast.runtime import generator
from wc_fast.sampler import ClipSampler
from wc_kernels import nft_loss

GIB = 2**30
VARIANTS = {"full": (0, False), "checkpointing": (0, True), "lora": (16, False),
            "lora+checkpointing": (16, True)}


class LiveBytes(TorchDispatchMode):
    """The bytes of every tensor storage alive under it, and their peak (each storage counted
    once, from the op that made it until it is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage in self._seen:
            return
        self._seen[storage] = nbytes = storage.nbytes()
        self.live += nbytes
        weakref.finalize(storage, self._free, nbytes)
        self.peak = max(self.peak, self.live)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def _wan_vae(shape: str):
    from diffusers import AutoencoderKLWan

    from studies.wan_iteration import SHAPES

    return AutoencoderKLWan(**SHAPES[shape]["vae"])


def _wan_codec(vae, pixel_size: int):
    from wc_fast.models.wan_vae import WanLatentCodec

    return WanLatentCodec(vae, pixel_size=pixel_size)


def _worldplay_vae(shape: str):
    from diffusers import AutoencoderKLHunyuanVideo15

    return AutoencoderKLHunyuanVideo15()


def _worldplay_codec(vae, pixel_size: int):
    from wc_fast.models.worldplay_vae import HunyuanLatentCodec

    return HunyuanLatentCodec(vae, pixel_size=pixel_size)


def _wan(cfg: config_lib.Config, shape: str):
    from diffusers import WanTransformer3DModel

    from studies.wan_iteration import SHAPES
    from wc_fast.models.wan import WanWorldModel

    m = cfg.model
    side = m.resolution // 8  # Wan's VAE: 8x spatial compression
    model = WanWorldModel(WanTransformer3DModel(**SHAPES[shape]["transformer"]),
                          clip_frames=m.clip_frames, latent_size=(side, side),
                          context_sigma=m.context_sigma, seed=cfg.train.seed,
                          activation_checkpointing=m.activation_checkpointing,
                          autocast_dtype=DTYPES[m.dtype])
    return model


def _worldplay(cfg: config_lib.Config, shape: str):
    from wc_fast.models.worldplay import WorldPlayConfig, WorldPlayWorldModel

    m = cfg.model
    side = m.resolution // 16  # HunyuanVideo's VAE: 16x spatial compression
    return WorldPlayWorldModel(WorldPlayConfig(), clip_frames=m.clip_frames,
                               latent_size=(side, side),
                               activation_checkpointing=m.activation_checkpointing)


# --model -> (preset whose settings the run takes, builders of the model and of its VAE in
# that shape, the codec over the VAE)
MODELS = {"wan2.1-1.3b": ("wan", _wan, _wan_vae, _wan_codec),
          "tiny": ("wan", _wan, _wan_vae, _wan_codec),
          "worldplay-8b": ("worldplay_lora", _worldplay, _worldplay_vae, _worldplay_codec)}


def _materialise(modules: list[torch.nn.Module]) -> None:
    """Replace the meta parameters and buffers of ``modules`` by CPU tensors of zeros of the
    same shapes and dtypes (fake ones under ``FakeTensorMode``), one per meta tensor (so
    weights the modules share stay shared)."""
    made: dict[int, torch.Tensor] = {}
    for module in (sub for root in modules for sub in root.modules()):
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None:
                    continue
                if id(t) not in made:
                    zeros = torch.zeros_like(t, device="cpu")
                    made[id(t)] = (torch.nn.Parameter(zeros, requires_grad=t.requires_grad)
                                   if isinstance(t, torch.nn.Parameter) else zeros)
                table[name] = made[id(t)]


class _Iteration:
    """The phases of one iteration on clip 2, as the trainer runs them, each's peak measured
    by ``counter``."""

    def __init__(self, cfg: config_lib.Config, model, copies, optimizers, sampler, codec,
                 history: torch.Tensor, counter: LiveBytes) -> None:
        self.cfg, self.model, self.copies, self.optimizers = cfg, model, copies, optimizers
        self.sampler, self.codec, self.history, self.counter = sampler, codec, history, counter
        frames = history.shape[1]
        self.history_actions = torch.zeros(1, frames, dtype=torch.long)
        self.actions = torch.zeros(cfg.model.clip_frames, dtype=torch.long)

    def _peak(self) -> int:
        peak = self.counter.peak
        self.counter.reset_peak()
        return peak

    def phases(self) -> tuple[int, int, int]:
        """Peak bytes of the rollout, the decoding for the rewards and the update."""
        ro, old, history = self.cfg.rollout, self.copies[0], self.history
        self._peak()
        with torch.no_grad():
            cache = old.build_cache_parallel(history, self.history_actions,
                                             sigma=old.context_sigma)
            clips = self.sampler.sample(cache, self.actions, num=ro.group_size,
                                        generator=generator(0, "memory")).clips
        rollout = self._peak()
        # the rewards read the candidates decoded to pixels, the clip's context frame first
        context = history[:, -1:].expand(ro.group_size, -1, -1, -1, -1)
        frames = self.codec.decode(torch.cat([context, clips], dim=1))
        del frames
        reward = self._peak()
        rows = self.cfg.nft.micro_batch
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        x_t = torch.randn(rows, *self.model.clip_shape)
        sigma = torch.rand(rows)
        with torch.no_grad():
            current = self.model.build_cache_parallel(history, self.history_actions,
                                                      sigma=self.model.context_sigma)
        v = self.model.velocity(x_t, sigma, self.actions, current)
        with torch.no_grad():
            v_old = old.velocity(x_t, sigma, self.actions, cache)
            for ref in self.copies[1:]:
                ref.velocity(x_t, sigma, self.actions, cache)
        loss = nft_loss(v, v_old, torch.randn_like(v), torch.rand(rows), beta=1.0,
                        backend="reference")
        loss.backward()
        for opt in self.optimizers:
            opt.step()
        return rollout, reward, self._peak()


def run_config(args: argparse.Namespace, lora_rank: int, checkpointing: bool
               ) -> config_lib.Config:
    """The ``--model``'s preset at the study's sizes, for one variant (every weight, or every
    adapter and the conditioning, trains, as in ``studies.wan_iteration``)."""
    cfg = config_lib.build_preset(MODELS[args.model][0])
    cfg.model.path = "random weights (studies/memory.py)"
    cfg.model.resolution, cfg.model.clip_frames = args.resolution, args.clip_frames
    cfg.model.lora_rank, cfg.model.activation_checkpointing = lora_rank, checkpointing
    cfg.optim.trainable = "all"
    cfg.rollout.group_size, cfg.rollout.steps = args.group_size, args.steps
    cfg.nft.keep = min(cfg.nft.keep, args.group_size // 2)
    cfg.nft.micro_batch = args.micro_batch
    cfg.nft.kl_beta = 0.1 if args.kl else 0.0
    config_lib.validate(cfg)
    return cfg


def measure(args: argparse.Namespace, name: str, *, fake: bool = True) -> dict:
    """GiB after the setup and at the peak of each phase, of variant ``name``; ``fake``
    False runs it on real CPU tensors (zeros), which checks the fake count at a small
    size."""
    rank, checkpointing = VARIANTS[name]
    rank = rank and args.lora_rank
    cfg = run_config(args, rank, checkpointing)
    m, ro = cfg.model, cfg.rollout
    # built on the meta device as the trainer builds it (LoRA, frozen matrices cast, the old
    # model): ``Module.to`` cannot swap fake parameters, meta ones it can
    _, build_model, build_vae, build_codec = MODELS[args.model]
    with torch.device("meta"):
        model = build_model(cfg, args.model)
        vae = build_vae(args.model)
        if rank:
            model.add_lora(rank, m.lora_alpha, m.lora_targets, seed=cfg.train.seed)
        freeze_untrained(model, cfg.optim.trainable)
        if not args.whole_copies:
            hold_frozen_matrices_in(model, DTYPES[m.dtype])
        copies = [copy.deepcopy(model).eval().requires_grad_(False) if args.whole_copies
                  else frozen_copy(model) for _ in range(2 if args.kl else 1)]
    counter = LiveBytes()
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode, counter:
        _materialise([model, *copies, vae])
        codec = build_codec(vae, m.resolution)
        old = copies[0]
        optimizers = build_optimizers(model, cfg.optim)
        setup = counter.live
        history = torch.randn(1, 1 + m.clip_frames, *model.clip_shape[1:])
        with unset_fake_temporarily():  # the sampler's schedule: plain numbers it reads
            sampler = ClipSampler(old, steps=ro.steps, shift=ro.shift, capture="eager")
        run = _Iteration(cfg, model, copies, optimizers, sampler, codec, history, counter)
        run.phases()  # the first iteration makes the gradients and the optimizers' states
        rollout, reward, update = run.phases()
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
    return {"variant": name, "lora_rank": rank, "activation_checkpointing": checkpointing,
            "parameters": total, "trained_parameters": trained, "setup_gib": setup / GIB,
            "rollout_peak_gib": rollout / GIB, "reward_peak_gib": reward / GIB,
            "update_peak_gib": update / GIB, "peak_gib": max(rollout, reward, update) / GIB}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wan2.1-1.3b", choices=list(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--resolution", type=int, default=256, help="frame side in pixels")
    parser.add_argument("--clip-frames", type=int, default=4, help="latent frames per clip")
    parser.add_argument("--group-size", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="sampler steps")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--kl", action="store_true", help="with the KL's reference model")
    parser.add_argument("--whole-copies", action="store_true",
                        help="the trainer as it was before frozen weights were shared (the "
                             "code the H200 measured on 2026-12-04): old (and reference) "
                             "models as whole copies, frozen matrices in fp32")
    parser.add_argument("--compare", default=None, metavar="JSON",
                        help="a studies.wan_iteration JSON whose measured peaks to show beside")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    if not names or set(names) - set(VARIANTS):
        parser.error(f"--variants: expected some of {list(VARIANTS)}, got {args.variants!r}")
    measured = {}
    if args.compare:
        data = json.loads(Path(args.compare).read_text())
        measured = {row["variant"]: row["peak_mib"] / 1024 for row in data["variants"]}
    rows = [measure(args, name) for name in names]
    print(f"{'variant':<20}{'params B':>9}{'trained B':>10}{'setup':>8}{'rollout':>9}"
          f"{'decode':>8}{'update':>8}{'peak GiB':>9}{'device':>8}")
    for row in rows:
        device = measured.get(row["variant"])
        row["device_peak_gib"] = device
        print(f"{row['variant']:<20}{row['parameters'] / 1e9:>9.3f}"
              f"{row['trained_parameters'] / 1e9:>10.3f}{row['setup_gib']:>8.1f}"
              f"{row['rollout_peak_gib']:>9.1f}{row['reward_peak_gib']:>8.1f}"
              f"{row['update_peak_gib']:>8.1f}"
              f"{row['peak_gib']:>9.1f}{'' if device is None else f'{device:.1f}':>8}")
    if args.json:
        result = {"model": args.model, "resolution": args.resolution,
                  "clip_frames": args.clip_frames, "group_size": args.group_size,
                  "steps": args.steps, "micro_batch": args.micro_batch, "kl": args.kl,
                  "whole_copies": args.whole_copies, "compare": args.compare,
                  "variants": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
