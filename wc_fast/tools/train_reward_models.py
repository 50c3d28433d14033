"""``python -m wc_fast.tools.train_reward_models --which reward|eval|critic|critic_eval``
``|reward_generated``.

Trains one embedded reward model on freshly rendered clips of the synthetic world and writes it
to ``wc_fast/assets/`` (or ``--out``). Each recipe has its own model seed and its own stream of
data seeds (:data:`RECIPES`); batch ``i`` renders ``sample_clips(seed=batch_seed(data_seed, i))``,
so no training batch shares a seed with the held-out evaluation stream
(:data:`wc_fast.tools.evaluate_reward_models.EVAL_DATA_SEED`).

- ``reward`` / ``eval``: camera estimators (:mod:`wc_fast.rewards.estimators`) learn each frame
  pair's relative pose (:func:`~wc_fast.rewards.estimators.pose_loss`), a new random action
  every frame, 10% no-op.
- ``critic``: the reward's VQ critic (:mod:`wc_fast.rewards.critic`), logistic ranking loss of
  each clean frame against its degraded version, every degradation kind in every batch.
- ``critic_eval``: the evaluation's VQ critic, the same plus each true render ranked against
  the shipped base world model's generation of the same frame (:func:`generated_pairs`).
  Without those pairs a critic has never seen a world model's frames after their errors
  compound over a long rollout, and it scores many such frames far above clean renders.
- ``reward_generated``: the ``reward`` estimator's recipe where a share of every batch's frame
  pairs (``generated.share``) are consecutive frames of a world model's generated clip 1,
  their targets the white-box reader's path (:mod:`wc_fast.tools.white_box_pool`, built once
  at the start from ``--source``, default the shipped base). Written only to ``--out`` (never
  over the shipped reward estimator); a run reads it with ``reward.if_reader estimator
  reward.reader_checkpoint OUT/camera_reward_generated.safetensors``.

The experiment of that reader (its file, as run, is committed in ``studies/results/readers``)::

    python -m wc_fast.tools.train_reward_models --which reward_generated \
        --out studies/results/readers
    python -m studies.final_table --seeds validation --rows recipe_kl_generated_reader:3
    python -m studies.white_box --validation --checkpoints base RUN_s0 RUN_s1 RUN_s2

(``RUN_sN``: the run folder of the row's seed N, as ``studies.replicate`` names it.)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wc_fast.rewards.critic import CRITIC_ASSETS, build_critic
from wc_fast.rewards.degrade import KINDS, add_noise, degraded_pairs, gaussian_blur
from wc_fast.rewards.estimators import (
    ESTIMATOR_ASSETS,
    build_estimator,
    decode_pose,
    delta_to_params,
    pose_loss,
)
from wc_fast.rewards.weights import REGENERATE, save_model
from wc_fast.tools.white_box_pool import POOL_SEED, white_box_pool
from wc_fast.world import ROTATION_STEP_DEG, TRANSLATION_STEP, batch_seed, sample_clips

RECIPES = {
    "reward": {"arch": "pyramid_correlation", "model_seed": 11, "data_seed": 1000,
               "steps": 5000, "batch": 12, "clip_frames": 8, "lr": 2e-3,
               "composite_fraction": 0.5,
               "options": {"colour": True, "fine_radius": 3, "coarse_radius": 2}},
    "eval": {"arch": "pyramid_correlation", "model_seed": 22, "data_seed": 2000, "steps": 5000,
             "batch": 12, "clip_frames": 8, "lr": 2e-3, "composite_fraction": 0.6,
             "options": {"colour": False, "fine_radius": 2, "coarse_radius": 3}},
    "critic": {"arch": "frame_cnn", "model_seed": 33, "data_seed": 3000, "steps": 1500,
               "batch": 40, "lr": 2e-3},
    # the degradations of ``critic`` (the same seeds) plus generated negatives: sequences per
    # evaluation set, clips per sequence, seed, and pairs per batch
    "critic_eval": {"arch": "frame_cnn", "model_seed": 33, "data_seed": 3000, "steps": 1500,
                    "batch": 40, "lr": 2e-3,
                    "generated": {"sequences": 96, "clips": 6, "seed": 3500, "batch": 24}},
    # the reward estimator's recipe, a share of every batch's pairs from a pool of generated
    # clip-1 clips labelled by the white-box reader: pool sequences, its seed, share of pairs
    "reward_generated": {"arch": "pyramid_correlation", "model_seed": 11, "data_seed": 1000,
                         "steps": 5000, "batch": 12, "clip_frames": 8, "lr": 2e-3,
                         "composite_fraction": 0.5,
                         "options": {"colour": True, "fine_radius": 3, "coarse_radius": 2},
                         "generated": {"sequences": 192, "seed": POOL_SEED, "share": 0.5}},
}
GENERATED_READER = "camera_reward_generated"  # file name of the reward_generated estimator
NOOP_FRACTION = 0.1
AUGMENT_FRACTION = 0.3  # share of estimator training clips that are mildly blurred and noisy


def pose_targets(c2w: Tensor) -> Tensor:
    """Normalized pose parameters of each frame's true relative motion: c2w ``[B, F+1, 4, 4]``
    -> ``[B, F, 6]``."""
    c2w = c2w.double()
    return delta_to_params(torch.linalg.inv(c2w[:, :-1]) @ c2w[:, 1:]).float()


def _augment(frames: Tensor, gen: torch.Generator) -> Tensor:
    """Mild blur and noise on a random share of the clips ``[B, T, 3, H, W]``, so the estimator
    still reads motion from imperfect (generated) frames."""
    b, t = frames.shape[:2]
    picked = torch.rand(b, generator=gen) < AUGMENT_FRACTION
    if not bool(picked.any()):
        return frames
    sub = frames[picked]
    k = sub.shape[0]
    sigma = (0.2 + 0.6 * torch.rand(k, generator=gen)).repeat_interleave(t)
    flat = gaussian_blur(sub.flatten(0, 1), sigma)
    flat = add_noise(flat, 0.03 * torch.rand(k * t, generator=gen), gen)
    out = frames.clone()
    out[picked] = flat.unflatten(0, (k, t))
    return out


def _cosine_lr(step: int, steps: int, lr: float, warmup: int = 100) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def pool_pairs(frames: Tensor, c2w: Tensor, count: int, gen: torch.Generator
               ) -> tuple[Tensor, Tensor]:
    """``count`` random consecutive frame pairs ``[count, 2, C, H, W]`` of pool clips
    ``[n, F+1, C, H, W]`` and their pose targets ``[count, 1, 6]`` (:func:`pose_targets` of
    the pool's paths ``c2w`` ``[n, F+1, 4, 4]``)."""
    clip = torch.randint(0, frames.shape[0], (count,), generator=gen)
    first = torch.randint(0, frames.shape[1] - 1, (count,), generator=gen)
    index = torch.stack([first, first + 1], 1)
    return frames[clip[:, None], index], pose_targets(c2w[clip[:, None], index])


def _estimator_loss(model: nn.Module, step: int, recipe: dict, gen: torch.Generator,
                    device: torch.device) -> tuple[Tensor, dict]:
    """The pose loss of a batch's frame pairs: ``batch`` true clips, or with a pool
    (``reward_generated``) fewer of them and ``generated.share`` of the pairs from the pool,
    every pair weighing alike."""
    pairs = recipe["batch"] * (recipe["clip_frames"] - 1)
    share = recipe["generated"]["share"] if "pool" in recipe else 0.0
    from_pool = round(share * pairs)
    clips = sample_clips(round((1 - share) * recipe["batch"]),
                         seed=batch_seed(recipe["data_seed"], step),
                         clip_frames=recipe["clip_frames"], segment_frames=1,
                         noop_fraction=NOOP_FRACTION,
                         composite_fraction=recipe["composite_fraction"])
    target = pose_targets(clips.c2w).to(device).flatten(0, 1)
    raw = model.pair_outputs(_augment(clips.frames, gen).to(device)).flatten(0, 1)
    if from_pool:
        frames, pool_target = pool_pairs(*recipe["pool"], from_pool, gen)
        raw = torch.cat([raw, model.pair_outputs(frames.to(device)).flatten(0, 1)])
        target = torch.cat([target, pool_target.to(device).flatten(0, 1)])
    loss = pose_loss(raw, target)
    # Frames whose six parameters are all within a quarter step (a cheap accuracy proxy).
    agree = ((decode_pose(raw.detach()) - target).abs() < 0.25).all(-1).float().mean()
    return loss, {"agree": float(agree)}


def generated_pairs(sequences: int, clips: int, seed: int, *, checkpoint: str | Path | None = None,
                    progress: bool = False) -> dict[str, tuple[Tensor, Tensor]]:
    """Per evaluation set (:data:`wc_fast.eval.KINDS`): true renders and a world model's
    generation of the same frames, both ``[N, 3, H, W]``; the model is the shipped base, or
    ``checkpoint`` (as ``python -m wc_fast.eval --checkpoint`` takes it). ``sequences``
    sequences of ``clips`` clips from the set's prompt distribution, generated from their first
    frame and actions as ``python -m wc_fast.eval`` generates them; every frame after the
    first."""
    from wc_fast.config import preset
    from wc_fast.eval import KINDS as SETS
    from wc_fast.eval import rollout_sequences
    from wc_fast.models.pretrained import load_checkpoint_model
    from wc_fast.world import sample_sequences

    model = load_checkpoint_model(checkpoint, torch.device("cpu"))
    cfg, sampling = model.cfg, preset("cpu").rollout
    pairs = {}
    for k, (name, (fraction, keys)) in enumerate(SETS.items()):
        data = sample_sequences(sequences, num_clips=clips, seed=seed + k,
                                composite_fraction=fraction, composite_keys=keys,
                                clip_frames=cfg.clip_frames, resolution=cfg.resolution)
        generated = rollout_sequences(model, data.frames[:, :1], data.actions, steps=sampling.steps,
                                      shift=sampling.shift, seed=seed + k, progress=progress)
        pairs[name] = (data.frames[:, 1:].flatten(0, 1), generated[:, 1:].flatten(0, 1))
    return pairs


def _critic_loss(model: nn.Module, step: int, recipe: dict, gen: torch.Generator,
                 device: torch.device) -> tuple[Tensor, dict]:
    clips = sample_clips(recipe["batch"], seed=batch_seed(recipe["data_seed"], step),
                         segment_frames=1)
    pairs = [degraded_pairs(part, kind, gen)
             for part, kind in zip(clips.frames.chunk(len(KINDS)), KINDS, strict=True)]
    if "pool" in recipe:
        true, made = recipe["pool"]
        pick = torch.randint(0, true.shape[0], (recipe["generated"]["batch"],), generator=gen)
        pairs.append((true[pick], made[pick]))
    clean = torch.cat([p[0] for p in pairs])[:, None]
    degraded = torch.cat([p[1] for p in pairs])[:, None]
    scores = model(torch.cat([clean, degraded]).to(device))[:, 0]
    s_clean, s_deg = scores.chunk(2)
    margin = s_clean - s_deg
    loss = F.softplus(-margin).mean() + 1e-3 * (scores**2).mean()
    return loss, {"pair_acc": float((margin > 0).float().mean())}


def _with_pool(recipe: dict, source: str | None, sequences: int | None) -> dict:
    """The pool facts a ``reward_generated`` run records (size, seeds, source model); puts
    the pool's clips and paths in ``recipe["pool"]``."""
    g = dict(recipe["generated"])
    if sequences is not None:
        g["sequences"] = sequences
    if not 0.0 <= g["share"] < 1.0:
        raise ValueError(f"generated.share must be in [0, 1), got {g['share']}")
    start = time.perf_counter()
    pool = white_box_pool(g["sequences"], seed=g["seed"], checkpoint=source)
    recipe["generated"], recipe["pool"] = g, (pool.frames, pool.c2w)
    print(f"[reward_generated] pool of {pool.frames.shape[0]} generated clips from "
          f"{pool.source} in {time.perf_counter() - start:.0f} s", flush=True)
    return {"sequences": pool.frames.shape[0], "seeds": pool.seeds, "source": pool.source,
            "frames_per_clip": pool.frames.shape[1], "share": g["share"]}


def train(which: str, *, steps: int | None = None, out: str | None = None, threads: int = 1,
          log_every: int = 100, device: str = "cpu", max_minutes: float = 0.0,
          source: str | None = None, pool_sequences: int | None = None,
          command: str | None = None) -> dict:
    """Train recipe ``which`` and save it; returns the metadata written beside the weights.

    Clips are rendered on the CPU (``threads``); the network trains on ``device``.
    ``max_minutes`` > 0 stops after the step that spends that much wall-clock time (the
    learning-rate schedule still spans the recipe's steps); the metadata records the steps run.
    ``reward_generated`` needs ``out`` (the shipped estimator stays as it is); its pool is
    generated by the world model ``source`` (the shipped base when None), ``pool_sequences``
    overriding the recipe's size. ``command`` is recorded as the command that made the file
    (default: the recipe's regeneration command).
    """
    recipe = dict(RECIPES[which])
    if steps is not None:
        recipe["steps"] = steps
    if which == "reward_generated" and out is None:
        raise ValueError("reward_generated writes to --out only (the shipped reward estimator "
                         "is not overwritten); give an output folder")
    torch.set_num_threads(threads)
    torch.manual_seed(recipe["model_seed"])
    meta = {"arch": recipe["arch"], "resolution": 32, "translation_step": TRANSLATION_STEP,
            "rotation_step_deg": ROTATION_STEP_DEG, "options": recipe.get("options", {})}
    if which in ("critic", "critic_eval"):
        model, loss_fn = build_critic(meta), _critic_loss
        name = CRITIC_ASSETS["eval" if which == "critic_eval" else "reward"]
        if recipe.get("generated"):
            g = recipe["generated"]
            start = time.perf_counter()
            pairs = generated_pairs(g["sequences"], g["clips"], g["seed"], progress=True).values()
            recipe["pool"] = tuple(torch.cat(frames) for frames in zip(*pairs, strict=True))
            print(f"[critic] {recipe['pool'][0].shape[0]} generated frames in "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    elif which == "reward_generated":
        model, loss_fn, name = build_estimator(meta), _estimator_loss, GENERATED_READER
        meta["pool"] = _with_pool(recipe, source, pool_sequences)
    else:
        model, loss_fn, name = build_estimator(meta), _estimator_loss, ESTIMATOR_ASSETS[which]
    dev = torch.device(device)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=1e-4)
    gen = torch.Generator().manual_seed(recipe["model_seed"])
    start = time.perf_counter()
    running: dict[str, float] = {}
    for step in range(recipe["steps"]):
        for group in opt.param_groups:
            group["lr"] = _cosine_lr(step, recipe["steps"], recipe["lr"])
        loss, stats = loss_fn(model, step, recipe, gen, dev)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for key, value in {"loss": float(loss.detach()), **stats}.items():
            running[key] = 0.98 * running.get(key, value) + 0.02 * value
        out_of_time = max_minutes > 0 and time.perf_counter() - start > 60 * max_minutes
        if (step + 1) % log_every == 0 or step + 1 == recipe["steps"] or out_of_time:
            shown = " ".join(f"{k}={v:.4f}" for k, v in running.items())
            print(f"[{which}] step {step + 1}/{recipe['steps']} {shown} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        if out_of_time:
            break
    minutes = (time.perf_counter() - start) / 60
    model.cpu()
    recipe.pop("pool", None)
    meta["train"] = {**recipe, "steps_run": step + 1, "threads": threads, "device": dev.type,
                     "minutes": round(minutes, 2),
                     "final": {k: round(v, 5) for k, v in running.items()},
                     "noop_fraction": 0.0 if which.startswith("critic") else NOOP_FRACTION,
                     "command": command or REGENERATE.get(name, "")}
    path = save_model(model, name, meta, out)
    print(f"[{which}] wrote {path} after {minutes:.1f} min")
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.tools.train_reward_models",
                                     description="Train an embedded reward model and write its "
                                                 "weights to wc_fast/assets/.")
    parser.add_argument("--which", choices=tuple(RECIPES), required=True)
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's steps")
    parser.add_argument("--out", default=None, help="output folder (default: wc_fast/assets)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where the network trains (cpu, cuda)")
    parser.add_argument("--max-minutes", type=float, default=0.0,
                        help="wall-clock budget; stop after the step that spends it (0: none)")
    parser.add_argument("--source", default=None,
                        help="reward_generated: the world model that generates the pool "
                             "(exported weights or a checkpoint directory, as python -m "
                             "wc_fast.eval --checkpoint; default: the shipped base)")
    parser.add_argument("--pool-sequences", type=int, default=None,
                        help="reward_generated: override the recipe's pool size (sequences)")
    args = parser.parse_args(argv)
    if args.which == "reward_generated" and args.out is None:
        parser.error("--which reward_generated needs --out (the shipped reward estimator is "
                     "not overwritten)")
    if args.which != "reward_generated" and (args.source or args.pool_sequences is not None):
        parser.error("--source and --pool-sequences are for --which reward_generated")
    # the shipped models record their canonical command; a generated reader the one it ran
    command = None if args.which != "reward_generated" else (
        "python -m wc_fast.tools.train_reward_models "
        + " ".join(sys.argv[1:] if argv is None else argv))
    train(args.which, steps=args.steps, out=args.out, threads=args.threads, device=args.device,
          max_minutes=args.max_minutes, source=args.source, pool_sequences=args.pool_sequences,
          command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
