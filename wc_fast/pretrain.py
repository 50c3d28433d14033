"""``python -m wc_fast.pretrain``: flow-matching pretraining of an embedded world model
(``--base tiny``, :class:`TinyWorldDiT`, or ``--base wan``, the embedded
:class:`~wc_fast.models.wan.model.WanWorldModel` on pixels).

Teacher-forced and autoregressive over clips: every clip of a rendered sequence is denoised
given its clean history (seen at ``model.context_sigma``, with that much noise added), all
clips in one masked forward (the model's ``teacher_forced_velocity``). Sequences come
from the synthetic world with mostly basic actions (``pretrain.composite_fraction``), so the
base model follows single keys far better than combinations, like WorldPlay. Every
``pretrain.eval_every`` steps the live and EMA models are scored on a fixed held-out batch.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.optim.swa_utils import AveragedModel
from tqdm import tqdm

from wc_fast import config as config_lib
from wc_fast.cli import RunArgs, parse_run_args, run_main
from wc_fast.infra import checkpoint
from wc_fast.infra.run_dir import RunLock, check_writable_dir, claim
from wc_fast.infra.runtime import generator, resolve_device, stream_seed
from wc_fast.models.motion_latent import LATENTS, factor_latents, with_latents
from wc_fast.models.pretrained import (
    export_world_model,
    load_world_model,
    new_world_model,
)
from wc_fast.rl.sampler import time_shift
from wc_fast.world import Clips, batch_seed, sample_sequences
from wc_kernels import flow_noise

if TYPE_CHECKING:
    from wc_fast.models.pretrained import EmbeddedModel

# fields that may change between an interrupted run and its resumption: bookkeeping
RESUMABLE_CHANGES = ("pretrain.steps", "pretrain.out", "pretrain.ckpt_every",
                     "pretrain.eval_every", "pretrain.keep_last", "pretrain.max_minutes",
                     "pretrain.device")


def flow_matching_loss(model: EmbeddedModel, frames: torch.Tensor, actions: torch.Tensor, *,
                       shift: float, gen: torch.Generator,
                       motion_factors: Tensor | None = None) -> torch.Tensor:
    """Velocity MSE over every clip of ``frames`` ``[B, 1 + N*F, C, H, W]``.

    Each clip gets its own sigma (shifted uniform) and noise; the clean history gets noise at
    the context sigma the model is conditioned on. For a model with ``motion_latent``, each
    clip's noise carries its ``motion_factors`` ``[B, N, 3]`` (one key press per clip) in its
    latent directions (:mod:`wc_fast.models.motion_latent`).
    """
    b, total = frames.shape[:2]
    f = model.clip_frames
    n = (total - 1) // f
    device = frames.device
    x0 = frames[:, 1:].reshape(b * n, f, *frames.shape[2:])
    sigma = time_shift(torch.rand(b * n, 1, generator=gen, device=device), shift)
    noise = torch.randn(x0.shape, generator=gen, device=device)
    if model.motion_latent:
        if motion_factors is None or tuple(motion_factors.shape) != (b, n, LATENTS):
            raise ValueError(f"a motion_latent model needs motion_factors [{b}, {n}, "
                             f"{LATENTS}] (one key press per clip), got "
                             f"{None if motion_factors is None else tuple(motion_factors.shape)}")
        latents = factor_latents(motion_factors.reshape(b * n, LATENTS)).to(noise.dtype)
        noise = with_latents(noise, latents)
    x_t, v_target = flow_noise(x0, sigma, noise)
    ctx_sigma = model.context_sigma
    context = (1 - ctx_sigma) * frames + ctx_sigma * torch.randn(frames.shape, generator=gen,
                                                                  device=device)
    # only a motion-latent model takes (and needs) the clips' latents
    motion = {"motion": latents.reshape(b, n, LATENTS)} if model.motion_latent else {}
    v = model.teacher_forced_velocity(context, actions, x_t.reshape(b, n * f, *x0.shape[2:]),
                                      sigma.reshape(b, n), context_sigma=ctx_sigma, **motion)
    return (v - v_target.reshape(v.shape)).square().mean()


def lr_factor(step: int, warmup: int) -> float:
    """Linear warmup, then constant (the EMA weights do the averaging), so a finished run
    can be extended with ``--resume --steps N`` without changing its past schedule."""
    return min(1.0, (step + 1) / max(1, warmup))


def ema_with_warmup(decay: float):
    """EMA update with the usual warmup ``min(decay, (1 + n) / (10 + n))``: early averages
    forget the random init quickly instead of lagging behind the live model for ~1/(1-decay)
    steps."""

    def update(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor
               ) -> torch.Tensor:
        n = float(num_averaged)
        beta = min(decay, (1.0 + n) / (10.0 + n))
        return torch.lerp(current, averaged, beta)

    return update


def start_from(model: EmbeddedModel, path: str) -> None:
    """Load exported weights ``path`` into ``model``; sizes must match ``model.cfg``. Layers
    the weights lack (the zero-initialised motion embedding, when turning ``motion_latent``
    on) keep their initialisation."""
    loaded = load_world_model(path)
    if loaded.signature != model.signature:
        raise ValueError(f"pretrain.init {path}: weights of sizes {loaded.signature}, the "
                         f"config wants {model.signature}")
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    new = [k for k in missing if not k.startswith("motion_embed.")]
    if new or unexpected:
        raise ValueError(f"pretrain.init {path}: weights do not fit the model (missing "
                         f"{new}, unexpected {unexpected})")


def training_batches(cfg: config_lib.PretrainRun, start: int) -> Iterator[tuple[int, Clips]]:
    """``(step, clips)`` of every step from ``start``: batch ``step`` is rendered from
    ``batch_seed(pretrain.seed, step)``, one step ahead on a background thread, so rendering
    (CPU) overlaps the model's step (on a GPU; torch ops release the GIL)."""
    pt = cfg.pretrain

    def render(step: int) -> Clips:
        return sample_sequences(pt.batch_size, num_clips=pt.num_clips,
                                seed=batch_seed(pt.seed, step),
                                composite_fraction=pt.composite_fraction,
                                clip_frames=cfg.model.clip_frames,
                                resolution=cfg.model.resolution)

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(render, start)
        for step in range(start, pt.steps):
            batch = pending.result()
            if step + 1 < pt.steps:
                pending = pool.submit(render, step + 1)
            yield step, batch


def held_out_batch(cfg: config_lib.PretrainRun) -> Clips:
    """One fixed batch that training never draws (its own world seed)."""
    pt = cfg.pretrain
    return sample_sequences(pt.batch_size, num_clips=pt.num_clips,
                            seed=stream_seed(pt.seed, "held_out"),
                            composite_fraction=pt.composite_fraction,
                            clip_frames=cfg.model.clip_frames, resolution=cfg.model.resolution)


def batch_loss(model: EmbeddedModel, batch: Clips, cfg: config_lib.PretrainRun,
               gen: torch.Generator) -> Tensor:
    """:func:`flow_matching_loss` of a rendered batch on the model's device."""
    device = next(model.parameters()).device
    return flow_matching_loss(model, batch.frames.to(device), batch.actions.to(device),
                              shift=cfg.pretrain.shift, gen=gen,
                              motion_factors=batch.motion_factors.to(device))


@torch.no_grad()
def held_out_losses(models: dict[str, EmbeddedModel], batch: Clips, cfg: config_lib.PretrainRun
                    ) -> dict[str, float]:
    """Flow-matching loss of each of ``models`` on the held-out ``batch`` with a fixed noise
    stream, so values at different steps are comparable."""
    device = next(next(iter(models.values())).parameters()).device
    return {name: batch_loss(model, batch, cfg,
                             generator(cfg.pretrain.seed, "held_out", device=device)).item()
            for name, model in models.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Check and lock ``pretrain.out`` (:mod:`wc_fast.infra.run_dir`), then pretrain in it."""
    run = parse_run_args("python -m wc_fast.pretrain", "Pretrain an embedded world model.",
                         argv, kind=config_lib.PRETRAIN_RUN, steps_field="pretrain.steps",
                         out_field="pretrain.out", with_base=True)
    resolve_device(run.config.pretrain.device, "pretrain.device")
    out = check_writable_dir(run.config.pretrain.out, "pretrain.out")
    with RunLock(out):
        claim(out, resume=run.resume, overwrite=run.overwrite)
        return _pretrain(run)


def _pretrain(run: RunArgs) -> int:
    cfg, pt = run.config, run.config.pretrain
    device = resolve_device(pt.device, "pretrain.device")
    out = Path(pt.out)
    torch.manual_seed(pt.seed)
    model = new_world_model(cfg.model, seed=pt.seed).to(device)
    if pt.init:
        start_from(model, pt.init)
    ema = AveragedModel(model, avg_fn=ema_with_warmup(pt.ema), use_buffers=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=pt.lr, betas=(0.9, 0.99),
                                  weight_decay=pt.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, pt.warmup))
    start, log, run_id = 0, [], checkpoint.new_run_id()
    if run.resume:
        ckpt = checkpoint.load_latest_intact(out, models={"model": model, "ema": ema},
                                             required_state=("optimizer", "schedule", "log"),
                                             config=config_lib.to_dict(cfg),
                                             ignore=RESUMABLE_CHANGES,
                                             read_config=config_lib.read_saved)
        run_id = ckpt.run_id
        optimizer.load_state_dict(ckpt.state["optimizer"])
        schedule.load_state_dict(ckpt.state["schedule"])
        start, log = ckpt.step, ckpt.state["log"]
        print(f"resumed from {ckpt.path} at step {start}")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"pretraining {type(model).__name__} ({n_params / 1e6:.2f} M parameters) on {device}: "
          f"{pt.steps} steps of {pt.batch_size} sequences x {pt.num_clips} clips")
    held_out = held_out_batch(cfg)
    t0 = time.perf_counter()
    bar = tqdm(initial=start, total=pt.steps, desc="pretrain", dynamic_ncols=True)
    last = pt.steps
    for step, batch in training_batches(cfg, start):
        loss = batch_loss(model, batch, cfg, generator(pt.seed, step, "noise", device=device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if pt.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), pt.grad_clip)
        optimizer.step()
        schedule.step()
        ema.update_parameters(model)
        record = {"step": step + 1, "loss": loss.item(), "lr": schedule.get_last_lr()[0]}
        out_of_time = pt.max_minutes > 0 and time.perf_counter() - t0 > 60 * pt.max_minutes
        if out_of_time:
            last = step + 1
        if (step + 1) % pt.eval_every == 0 or step + 1 == last:
            scores = held_out_losses({"live": model, "ema": ema.module}, held_out, cfg)
            record.update({f"held_out_{k}": v for k, v in scores.items()})
            bar.write(f"step {step + 1}: held-out loss live {scores['live']:.4f}, "
                      f"EMA {scores['ema']:.4f}")
        log.append(record)
        bar.update()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % pt.ckpt_every == 0 or step + 1 == last:
            checkpoint.save(out, step + 1, models={"model": model, "ema": ema},
                            config=config_lib.to_dict(cfg), keep_last=pt.keep_last,
                            state={"optimizer": optimizer.state_dict(),
                                   "schedule": schedule.state_dict(), "log": log},
                            run_id=run_id)
        if out_of_time:
            bar.write(f"pretrain.max_minutes={pt.max_minutes} spent: stopping at step {last}")
            break
    bar.close()
    wall = time.perf_counter() - t0
    card = {"steps": last, "init": pt.init or None, "batch_size": pt.batch_size,
            "num_clips": pt.num_clips,
            "composite_fraction": pt.composite_fraction, "seed": pt.seed, "lr": pt.lr,
            "wall_seconds_this_run": round(wall, 1), "device": str(device),
            "final_loss": log[-1]["loss"] if log else None,
            "held_out_loss_ema": log[-1].get("held_out_ema") if log else None}
    path = export_world_model(ema.module, out / "base_model.safetensors", card)
    (out / "loss.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    print(f"exported the EMA weights to {path} ({wall / 60:.1f} min this run)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.pretrain", main))
