"""``python -m wc_fast.eval``: action following and visual quality of long rollouts.

For a held-out set of world prompts and action sequences (fixed seeds; a ``basic`` set with one
key per clip, a ``composite`` set with key combinations of 2 to 4 keys and a
``composite_2key`` set with exactly two keys per clip), the model generates every
sequence autoregressively clip by clip with the deterministic ODE sampler. Each clip is scored
with the EVALUATION camera estimator and the EVALUATION critic (not the ones the RL reward
uses; the evaluation critic also ranks true renders above a world model's generations):
- accuracy: fraction of frames whose full action (translation and rotation label) matches the
  command, best translation threshold per clip (:func:`action_accuracy`);
- vq: the evaluation critic's mean score over the clip's frames at ``vq_stride``.
Reported per set, per horizon (short / medium / long = first, middle, last third of the clips)
and per clip index (the exposure-bias view), like the WorldCompass paper's Table 1; the
composite set also by the number of keys pressed.

Beside them, measures no compared model was fitted to (:mod:`wc_fast.measures`), in
``result[set]["metrics"]`` per horizon, for all clips (``all``), the trained clip alone
(``clip1``), clips 2 on (``clips_2_on``) and per clip (``by_clip``): ``accuracy`` and ``vq``
as above, ``fit_accuracy`` (a classical camera fit's action accuracy), ``psnr`` and ``ssim``
against the true render of the same frames, ``rot_err_deg`` and ``trans_err`` (the fit's
per-frame relative pose error against the true camera path), ``frechet`` (generated vs true
renders on 4x4-pooled pixels), and the floors ``psnr_floor``, ``ssim_floor`` and
``frechet_floor``: the same measures of true renders of the same commands at other key-press
speeds (drawn from ``set seed + FLOOR_SEED_OFFSET``; :mod:`wc_fast.measures.floor`), what a
model that follows every command perfectly would score. ``result[set]["per_sequence"]``
holds every per-clip value ``[n, N]`` for paired bootstrap intervals
(:func:`wc_fast.measures.paired_bootstrap`); ``result["ground_truth"][set]`` the same fit on
the true renders. ``--save-frames DIR`` writes ``DIR/<set>.npz`` with the keys
``generated``, ``ground_truth``, ``actions``, ``c2w_true``, ``c2w_commanded`` and ``c2w_fit``
(shapes in :mod:`wc_fast.measures.frames_io`). ``--final`` evaluates on
:data:`FINAL_EVAL_SEED`, reserved for final tables (never for tuning); ``--validation`` on
:data:`VALIDATION_EVAL_SEED`, where a choice between recipes may be made.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich import box
from rich.console import Console
from rich.table import Table
from torch import Tensor
from tqdm import tqdm

from wc_fast import config as config_lib
from wc_fast.actions import describe, num_primitives, split_action
from wc_fast.cli import add_debug, config_pairs, run_main
from wc_fast.infra.run_dir import check_writable_file
from wc_fast.infra.runtime import generator, resolve_device
from wc_fast.measures import (
    clip_metrics,
    fit_path,
    fit_scores,
    print_truth_table,
    save_set,
    summarize_truth,
)
from wc_fast.measures.floor import draw_motion_factors, render_sequences
from wc_fast.measures.report import frame_distances
from wc_fast.models.pretrained import load_checkpoint_model
from wc_fast.models.tiny.dit import X0_MIN_SIGMA
from wc_fast.rewards import load_critic, load_estimator, vq_scores
from wc_fast.rewards.interaction import action_accuracy
from wc_fast.rl.rollout import generate_history, prompt_cache
from wc_fast.rl.sampler import ClipSampler
from wc_fast.world import sample_sequences

if TYPE_CHECKING:
    from wc_fast.models.pretrained import EmbeddedModel

# set name -> (composite fraction, keys a composite presses); the set's seed is seed + index
KINDS = {"basic": (0.0, (2, 3, 4)), "composite": (1.0, (2, 3, 4)),
         "composite_2key": (1.0, (2,))}
EVAL_SEED = 900_001
# The former reserved seeds, now for choosing between recipes (docs/replication.md).
VALIDATION_EVAL_SEED = 7_700_001
# Evaluation seeds no design choice has seen: only for final tables (docs/replication.md).
FINAL_EVAL_SEED = 6_100_001
# the named seed sets: tuning (every constant), validation (recipes), final (final tables)
SEED_SETS = {"tuning": EVAL_SEED, "validation": VALIDATION_EVAL_SEED, "final": FINAL_EVAL_SEED}
FLOOR_SEED_OFFSET = 1000  # seed offset of the other speeds the floors' true renders move at


@dataclass(slots=True)
class EvalSettings:
    """What the evaluation runs: set sizes, rollout length, sampler and scoring thresholds."""

    sequences: int = 16
    clips: int = 6
    steps: int = 10
    shift: float = 5.0
    seed: int = EVAL_SEED
    trans_thresholds: tuple[float, ...] = (0.02, 0.04)
    rot_threshold_deg: float = 1.0
    vq_stride: int = 1

    @classmethod
    def from_config(cls, cfg: config_lib.Config, **overrides) -> EvalSettings:
        values = {"steps": cfg.rollout.steps, "shift": cfg.rollout.shift,
                  "trans_thresholds": tuple(cfg.reward.trans_thresholds),
                  "rot_threshold_deg": cfg.reward.rot_threshold_deg}
        return cls(**{**values, **overrides})


def add_seed_arguments(parser: argparse.ArgumentParser) -> None:
    """``--seed N`` (default :data:`EVAL_SEED`, the tuning set), or a named set: ``--final``
    (:data:`FINAL_EVAL_SEED`) or ``--validation`` (:data:`VALIDATION_EVAL_SEED`); all set
    ``args.seed``."""
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=EVAL_SEED)
    seeds.add_argument("--final", action="store_const", dest="seed", const=FINAL_EVAL_SEED,
                       help=f"evaluate on the seeds reserved for final tables "
                            f"(FINAL_EVAL_SEED = {FINAL_EVAL_SEED})")
    seeds.add_argument("--validation", action="store_const", dest="seed",
                       const=VALIDATION_EVAL_SEED,
                       help=f"evaluate on the validation seeds, where recipes are chosen "
                            f"(VALIDATION_EVAL_SEED = {VALIDATION_EVAL_SEED})")


def rollout_sequences(model: EmbeddedModel, prompts: Tensor, actions: Tensor, *, steps: int,
                      shift: float, seed: int, progress: bool = False) -> Tensor:
    """Generate ``[n, 1 + N*F, C, H, W]`` from prompts ``[n, 1, ...]`` and actions ``[n, N*F]``.

    Each sequence runs on its own history (batch 1), clip by clip; noise comes from a stream
    seeded by ``(seed, sequence)``, so the result is deterministic.
    """
    device = next(model.parameters()).device
    sampler = ClipSampler(model, steps=steps, shift=shift, capture="eager")
    clips = actions.shape[1] // model.clip_frames
    out = []
    rows = tqdm(range(prompts.shape[0]), desc="eval rollouts", disable=not progress,
                dynamic_ncols=True)
    with torch.no_grad():
        for i in rows:
            frames, _, _ = generate_history(model, sampler, prompts[i:i + 1].to(device),
                                            actions[i].to(device), clips,
                                            generator(seed, i, "eval", device=device))
            out.append(frames.cpu())
    return torch.cat(out)


def generate_clip1(model: EmbeddedModel, prompts: Tensor, actions: Tensor, *,
                   settings: EvalSettings, seed: int) -> dict[str, Tensor]:
    """Clip 1 of each sequence, as :func:`rollout_sequences` generates it from prompts
    ``[n, 1, C, H, W]`` and commands ``[n, F]`` (one history each, noise from the
    stream ``(seed, sequence, "eval")``): ``frames`` and ``warp_only`` ``[n, 1+F, C, H, W]``
    (prompt first; bounded as the model bounds its clips), ``flow`` ``[n, F, 2, H, W]`` and the
    mean absolute ``residual`` ``[n]``."""
    device = next(model.parameters()).device
    sampler = ClipSampler(model, steps=settings.steps, shift=settings.shift, capture="eager")
    if sampler.sigmas[-2] < X0_MIN_SIGMA:
        raise ValueError(f"the sampler's last step starts at sigma {sampler.sigmas[-2]:.3f}, "
                         f"below X0_MIN_SIGMA = {X0_MIN_SIGMA}: its clip is not the head's "
                         f"(take fewer steps or a larger shift)")
    out: dict[str, list[Tensor]] = {"frames": [], "warp_only": [], "flow": [], "residual": []}
    with torch.no_grad():
        for i in range(prompts.shape[0]):
            prompt, clip_actions = prompts[i:i + 1].to(device), actions[i].to(device)
            cache = prompt_cache(model, prompt)
            noise = sampler.initial_noise(clip_actions, num=1,
                                          generator=generator(seed, i, "eval", device=device))
            parts = sampler.final_parts(cache, clip_actions, noise)
            clip = model.bound_frames(parts.warped + parts.residual)
            out["frames"].append(torch.cat([prompt, clip], 1).cpu())
            out["warp_only"].append(torch.cat([prompt, model.bound_frames(parts.warped)],
                                              1).cpu())
            out["flow"].append(parts.flow.cpu())
            out["residual"].append(parts.residual.abs().mean((1, 2, 3, 4)).cpu())
    return {name: torch.cat(values) for name, values in out.items()}


def score_sequences(frames: Tensor, actions: Tensor, *, clip_frames: int,
                    settings: EvalSettings, estimator, critic) -> tuple[Tensor, Tensor]:
    """Per-clip accuracy and VQ ``[n, N]`` of sequences ``[n, 1 + N*F, ...]``."""
    n, total = frames.shape[:2]
    clips = (total - 1) // clip_frames
    idx = torch.arange(clips)[:, None] * clip_frames + torch.arange(clip_frames + 1)[None, :]
    windows = frames[:, idx].reshape(n * clips, clip_frames + 1, *frames.shape[2:])
    with torch.no_grad():
        c2w = estimator(windows)
    trans_gt, rot_gt = split_action(actions.reshape(n * clips, clip_frames))
    acc = action_accuracy(c2w.double(), trans_gt, rot_gt,
                          trans_thresholds=settings.trans_thresholds,
                          rot_threshold_deg=settings.rot_threshold_deg)
    vq = vq_scores(critic, windows, stride=settings.vq_stride)
    return acc.float().reshape(n, clips), vq.float().reshape(n, clips)


def horizons(clips: int) -> dict[str, slice]:
    """short / medium / long: the first, middle and last third of the clip indices."""
    third = max(1, clips // 3)
    return {"short": slice(0, third), "medium": slice(third, clips - third),
            "long": slice(clips - third, clips)}


def summarize(acc: Tensor, vq: Tensor, keys: Tensor) -> dict:
    """JSON block of one set: overall, per horizon, per clip index and per number of keys
    pressed (``keys`` ``[n, N]``, the clips' commands)."""
    block = {"accuracy": acc.mean().item(), "vq": vq.mean().item(),
             "by_keys": {str(int(k)): {"accuracy": acc[keys == k].mean().item(),
                                       "clips": int((keys == k).sum())}
                         for k in keys.unique().tolist()},
             "by_clip": [{"clip": c + 1, "accuracy": acc[:, c].mean().item(),
                          "vq": vq[:, c].mean().item()} for c in range(acc.shape[1])]}
    for name, sl in horizons(acc.shape[1]).items():
        if sl.stop > sl.start:
            block[name] = {"accuracy": acc[:, sl].mean().item(), "vq": vq[:, sl].mean().item()}
    return block


def evaluate(model: EmbeddedModel, settings: EvalSettings, *, estimator=None, critic=None,
             progress: bool = False, keep_frames: bool = False) -> dict:
    """Evaluate ``model`` on the basic and composite sets; the JSON-ready result.

    ``result["ground_truth"]`` scores the true renders of the same sequences with the same
    estimator and critic: the ceiling the scoring itself allows.
    """
    estimator = estimator or load_estimator("eval", device="cpu")
    critic = critic or load_critic("eval", device="cpu")
    cfg = model.cfg
    result: dict = {"settings": {k: getattr(settings, k) for k in settings.__slots__},
                    "ground_truth": {}, "by_clip": []}
    frames_out = {}
    thresholds = {"trans_thresholds": settings.trans_thresholds,
                  "rot_threshold_deg": settings.rot_threshold_deg}
    for k, (kind, (fraction, keys)) in enumerate(KINDS.items()):
        data = sample_sequences(settings.sequences, num_clips=settings.clips,
                                seed=settings.seed + k, composite_fraction=fraction,
                                composite_keys=keys, clip_frames=cfg.clip_frames,
                                resolution=cfg.resolution)
        gen = rollout_sequences(model, data.frames[:, :1], data.actions, steps=settings.steps,
                                shift=settings.shift, seed=settings.seed + k, progress=progress)
        acc, vq = score_sequences(gen, data.actions, clip_frames=cfg.clip_frames,
                                  settings=settings, estimator=estimator, critic=critic)
        gt_acc, gt_vq = score_sequences(data.frames, data.actions, clip_frames=cfg.clip_frames,
                                        settings=settings, estimator=estimator, critic=critic)
        clip_keys = num_primitives(data.actions[:, ::cfg.clip_frames])
        result[kind] = summarize(acc, vq, clip_keys)
        floor = render_sequences(
            settings.seed + k, data.actions,
            draw_motion_factors(settings.sequences, settings.clips,
                                settings.seed + k + FLOOR_SEED_OFFSET),
            segment_frames=cfg.clip_frames, resolution=cfg.resolution)
        per_clip = {"accuracy": acc, "vq": vq,
                    **clip_metrics(gen, data.frames, fit_path(gen), data.c2w, data.actions,
                                   clip_frames=cfg.clip_frames, **thresholds),
                    **{f"{name}_floor": value for name, value
                       in frame_distances(floor, data.frames, cfg.clip_frames).items()}}
        clips = acc.shape[1]
        slices = {"all": slice(0, clips), **horizons(clips), "clip1": slice(0, 1),
                  "clips_2_on": slice(1, clips)}
        result[kind]["metrics"] = summarize_truth(per_clip, gen, data.frames, floor,
                                                  clip_frames=cfg.clip_frames, slices=slices)
        add_reader_gap(result[kind])
        result[kind]["per_sequence"] = {name: v.tolist() for name, v in per_clip.items()}
        gt_fit = fit_scores(fit_path(data.frames), data.c2w, data.actions,
                            clip_frames=cfg.clip_frames, **thresholds)
        result["ground_truth"][kind] = {"accuracy": gt_acc.mean().item(),
                                        "vq": gt_vq.mean().item(),
                                        **{name: v.mean().item() for name, v in gt_fit.items()}}
        result["by_clip"] += [{"set": kind, **row} for row in result[kind]["by_clip"]]
        if keep_frames:
            frames_out[kind] = (gen, data)
    if keep_frames:
        result["_frames"] = frames_out
    return result


def add_reader_gap(block: dict) -> None:
    """The classical fit's accuracy and the ``reader_gap`` (evaluation estimator minus fit)
    on a set's ``block`` and each of its ``by_clip`` rows. The fit reads the frames without
    anything learned, so it is a reader the reward never saw; a gap that grows with training
    is accuracy only a learned reader sees (the policy learning what such readers want)."""
    block["fit_accuracy"] = block["metrics"]["all"]["fit_accuracy"]
    block["reader_gap"] = block["accuracy"] - block["fit_accuracy"]
    for row, truth in zip(block["by_clip"], block["metrics"]["by_clip"], strict=True):
        row["fit_accuracy"] = truth["fit_accuracy"]
        row["reader_gap"] = row["accuracy"] - row["fit_accuracy"]


def _fit(block: dict) -> float | None:
    """A set's fit accuracy (None in a result written before the fit was reported)."""
    return block.get("fit_accuracy")


def _cell(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def print_table(result: dict, console: Console | None = None, title: str = "wc_fast eval"
                ) -> None:
    """The paper-style table: accuracy per set, read first by the classical camera fit (a
    reader the reward never saw) and then by the evaluation estimator per horizon, the reader
    gap between them and VQ (the estimator on the true renders below); the 3- and 4-key
    combinations inside the composite set as "3 keys (clips)"."""
    console = console or Console()
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("set", no_wrap=True, min_width=max(len(kind) for kind in KINDS))
    table.add_column("fit\nacc", justify="right")
    for name in ("short", "medium", "long", "all"):
        table.add_column(f"est\n{name}", justify="right")
    for name in ("reader\ngap", "\nVQ"):
        table.add_column(name, justify="right")
    for kind in KINDS:
        block = result[kind]
        cells = [f"{block[h]['accuracy']:.3f}" if h in block else "-"
                 for h in ("short", "medium", "long")]
        table.add_row(kind, _cell(_fit(block)), *cells, f"{block['accuracy']:.3f}",
                      _cell(block.get("reader_gap"), "+.3f"), f"{block['vq']:.3f}")
    for keys in ("3", "4"):
        if keys in result["composite"]["by_keys"]:
            entry = result["composite"]["by_keys"][keys]
            table.add_row(f"  {keys} keys ({entry['clips']})", "", "", "", "",
                          f"{entry['accuracy']:.3f}", "", "")
    truth = ", ".join(f"{kind} {result['ground_truth'][kind]['accuracy']:.3f}"
                      for kind in KINDS)
    table.caption = f"the estimator on the true renders: {truth}"
    console.print(table)
    clips = Table(title="accuracy by clip: fit / estimator")
    clips.add_column("set")
    for row in result["basic"]["by_clip"]:
        clips.add_column(str(row["clip"]), justify="right")
    for kind in KINDS:
        clips.add_row(kind, *[f"{_cell(r.get('fit_accuracy'), '.2f')} / {r['accuracy']:.2f}"
                              for r in result[kind]["by_clip"]])
    console.print(clips)


def print_comparison(before: dict, after: dict, console: Console, title: str) -> None:
    """Two evaluations side by side (base vs trained): per set, accuracy read by the classical
    camera fit (a reader the reward never saw) first, then by the evaluation estimator, each
    with its change, and the change of the reader gap (estimator minus fit: accuracy only a
    learned reader sees); the 3- and 4-key combinations inside the composite set (estimator
    only, as "3 keys" and "4 keys"). Then VQ per set, in a table of its own (both fit 80
    columns)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("set", no_wrap=True, min_width=max(len(kind) for kind in KINDS))
    for col in ("fit\nbase", "fit\ntrained", "fit\nchange", "est\nbase", "est\ntrained",
                "est\nchange", "gap\nchange"):
        table.add_column(col, justify="right")
    rows = [(kind, before[kind], after[kind]) for kind in KINDS]
    rows += [(f"  {keys} keys", before["composite"]["by_keys"][keys],
              after["composite"]["by_keys"][keys]) for keys in ("3", "4")
             if keys in before["composite"]["by_keys"]]
    for name, b, a in rows:
        fit_b, fit_a = _fit(b), _fit(a)
        fit_change = None if fit_b is None or fit_a is None else fit_a - fit_b
        est_change = a["accuracy"] - b["accuracy"]
        gap = None if fit_change is None else est_change - fit_change
        table.add_row(name, _cell(fit_b), _cell(fit_a), _cell(fit_change, "+.3f"),
                      f"{b['accuracy']:.3f}", f"{a['accuracy']:.3f}", f"{est_change:+.3f}",
                      _cell(gap, "+.3f"))
    console.print(table)
    vq = Table(title="visual quality (evaluation critic)", box=box.SIMPLE_HEAD)
    for col in ("set", "base", "trained", "change"):
        vq.add_column(col, justify="right" if col != "set" else "left")
    for kind in KINDS:
        b, a = before[kind]["vq"], after[kind]["vq"]
        vq.add_row(kind, f"{b:.3f}", f"{a:.3f}", f"{a - b:+.3f}")
    console.print(vq)


def save_grid(path: str | Path, frames: dict, estimator, max_rows: int = 4) -> Path:
    """Rollout grid: generated basic and composite sequences with commanded/estimated paths."""
    from wc_fast.infra.viz import save_rollout_grid

    rows, cmd, titles = [], [], []
    for kind, (gen, data) in frames.items():
        rows.append(gen[:max_rows])
        cmd.append(data.c2w[:max_rows])
        titles += [f"{kind}: " + ", ".join(describe(int(a)) for a in data.actions[i, ::4])
                   for i in range(min(max_rows, gen.shape[0]))]
    frames_all = torch.cat(rows)
    with torch.no_grad():
        est = estimator(frames_all)
    return save_rollout_grid(path, frames_all, torch.cat(cmd), est, titles=titles,
                             max_rows=len(titles))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.eval",
                                     description="Evaluate action following and quality.")
    parser.add_argument("--base", choices=config_lib.BASES, default="tiny",
                        help="the shipped base world model to evaluate: tiny (TinyWorldDiT) or "
                             "wan (the embedded Wan world model); default tiny")
    parser.add_argument("--checkpoint", default=None,
                        help="world model .safetensors or training checkpoint directory "
                             "(overrides --base)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--grid", default=None, help="write a rollout grid PNG here")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", default="cpu",
                        choices=[p for p in config_lib.PRESETS
                                 if p not in config_lib.NEEDS_MODEL_PATH],
                        help="preset whose sampler steps and shift and label thresholds to use "
                             "(rollout.steps, rollout.shift, reward.trans_thresholds, "
                             "reward.rot_threshold_deg); --section.field VALUE overrides them")
    source.add_argument("--config", default=None, metavar="FILE",
                        help="a config file (as wc_fast.train takes) to read them from instead")
    parser.add_argument("--sequences", type=int, default=16, help="sequences per set")
    parser.add_argument("--clips", type=int, default=6, help="clips per sequence")
    parser.add_argument("--sampler-steps", type=int, default=None,
                        help="ODE sampler steps (default: the preset's rollout.steps)")
    # the old spelling of --sampler-steps: every other command's --steps counts iterations
    parser.add_argument("--steps", type=int, default=None, dest="old_steps",
                        help=argparse.SUPPRESS)
    add_seed_arguments(parser)
    parser.add_argument("--save-frames", default=None, metavar="DIR",
                        help="write DIR/<set>.npz: generated and true frames, actions, true, "
                             "commanded and fitted camera paths")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    add_debug(parser)
    args, rest = parser.parse_known_args(argv)
    if args.old_steps is not None:
        warnings.warn("python -m wc_fast.eval --steps is deprecated: it is --sampler-steps "
                      "(--steps counts iterations in every other command)", FutureWarning,
                      stacklevel=2)
        args.sampler_steps = args.sampler_steps or args.old_steps
    if args.sequences < 1 or args.clips < 1:
        parser.error("--sequences and --clips must be >= 1")
    if args.sampler_steps is not None and args.sampler_steps < 1:
        parser.error(f"--sampler-steps must be >= 1, got {args.sampler_steps}")
    cfg = (config_lib.load(args.config) if args.config is not None
           else config_lib.build_preset(args.preset))
    for path, text in config_pairs(parser, rest):
        try:
            config_lib.apply_override(cfg, path, text)
        except (ValueError, TypeError) as exc:
            parser.error(str(exc))
    for flag, path in (("--json", args.json), ("--grid", args.grid)):
        if path:  # an unwritable path fails now, not after the whole evaluation
            check_writable_file(path, flag)
    device = resolve_device(args.device)
    model = load_checkpoint_model(args.checkpoint, device, base=args.base)
    overrides = {"sequences": args.sequences, "clips": args.clips,
                 "seed": args.seed}
    if args.sampler_steps is not None:
        overrides["steps"] = args.sampler_steps
    settings = EvalSettings.from_config(cfg, **overrides)
    estimator = load_estimator("eval", device="cpu")
    result = evaluate(model, settings, estimator=estimator, progress=True,
                      keep_frames=args.grid is not None or args.save_frames is not None)
    frames = result.pop("_frames", None)
    print_table(result)
    print_truth_table(result, tuple(KINDS), Console())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    if args.grid and frames:
        print(f"wrote {save_grid(args.grid, frames, estimator)}")
    if args.save_frames and frames:
        for kind, (gen, data) in frames.items():
            path = save_set(args.save_frames, kind, generated=gen, ground_truth=data.frames,
                            actions=data.actions, c2w_true=data.c2w, c2w_fit=fit_path(gen))
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main("python -m wc_fast.eval", main))
