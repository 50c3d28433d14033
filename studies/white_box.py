"""Which reader of action following is right: the warp model's own flow read white-box, beside
the classical camera fit and the evaluation estimator, on the same generated clips.

    python -m studies.white_box --checkpoints base [RUN_DIR ...] --sequences 64 --clips 1 \
                                [--seed SEED | --final | --validation] [--preset cpu] [--json OUT]

Each model (``base``: the shipped tiny base; else an exported ``.safetensors``, a checkpoint
directory or a run directory, whose latest checkpoint is read) generates clip 1 of every
evaluation set's sequences as ``python -m wc_fast.eval`` does (the same sets, seeds, noise
streams and deterministic ODE sampler; ``--clips`` is 1: the white-box reader needs the
reference frame's true depth, which only the world prompt has). At the sampler's last step
the warp head's flow, warped prompt and residual are kept (:meth:`ClipSampler.final_parts`),
and five readers label each clip by the evaluation's rule and thresholds:

- ``white box``: the camera path that explains the predicted flow against the prompt's true
  depth (:func:`wc_fast.rewards.flow_reader.read_path`), no learned weights, no pixels read;
- ``white box textured``: the same, each pixel weighted by the warp-only frame's texture
  (:func:`~wc_fast.rewards.flow_reader.texture_weights`): the flow where it shows in the frame
  (where a frame is flat, nothing trains the flow);
- ``fit`` and ``estimator``: the classical camera fit and the evaluation estimator on the
  generated frames (what the evaluation reports);
- ``fit warp`` and ``estimator warp``: the same two on the warp-only frames (the prompt warped
  by the predicted flow, no residual): where they fall from the full frames, the accuracy
  lives in the residual, which paints motion the flow does not carry.

The true renders of the same commands are read too (white box on the flow the true path and
depth imply): each reader's ceiling. Each checkpoint's change from the base per set and reader
comes with a paired bootstrap interval over the sequences.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from rich import box
from rich.console import Console
from rich.table import Table
from torch import Tensor

from wc_fast.actions import split_action
from wc_fast.config import build_preset
from wc_fast.eval import KINDS, EvalSettings, add_seed_arguments, generate_clip1
from wc_fast.infra import checkpoint
from wc_fast.measures.bootstrap import paired_bootstrap
from wc_fast.models.pretrained import load_checkpoint_model
from wc_fast.rewards import load_estimator
from wc_fast.rewards.camera_fit import fit_path
from wc_fast.rewards.estimators import LearnedEstimator
from wc_fast.rewards.flow_reader import read_path, rendered_flow, texture_weights
from wc_fast.rewards.interaction import action_accuracy
from wc_fast.world import sample_sequences
from wc_fast.world.dataset import sequence_scenes

READERS = ("white box", "white box textured", "fit", "estimator", "fit warp", "estimator warp")
BASE = "base"


def resolve(name: str) -> str | None:
    """A ``--checkpoints`` entry as :func:`load_checkpoint_model` reads it: ``None`` for the
    base, a run directory's latest checkpoint, else the path itself."""
    if name == BASE:
        return None
    path = Path(name)
    if not path.exists():
        raise ValueError(f"--checkpoints: {name} does not exist")
    if path.is_dir() and not (path / "meta.json").is_file():
        return str(checkpoint.latest(path))
    return str(path)


def accuracy(c2w: Tensor, actions: Tensor, settings: EvalSettings) -> Tensor:
    """Full-action accuracy ``[n]`` of clip-1 paths ``[n, F+1, 4, 4]`` commanded by ``actions``
    ``[n, F]``: the evaluation's rule and thresholds (:func:`action_accuracy`)."""
    trans_gt, rot_gt = split_action(actions)
    return action_accuracy(c2w.double(), trans_gt, rot_gt,
                           trans_thresholds=settings.trans_thresholds,
                           rot_threshold_deg=settings.rot_threshold_deg)


def read_all(frames: Tensor, warp_only: Tensor | None, flow: Tensor, depth: Tensor,
             actions: Tensor, settings: EvalSettings, estimator: LearnedEstimator
             ) -> dict[str, Tensor]:
    """Each reader's per-sequence accuracy ``[n]`` (:data:`READERS`; the two warp-only readers
    when ``warp_only`` is given) of clips ``[n, 1+F, C, H, W]`` whose flow from the prompt is
    ``flow`` ``[n, F, 2, H, W]`` and the prompt's true depth ``depth`` ``[n, H, W]``; the
    textured white box weighs the warp-only frames' texture (the frames' own without them)."""
    shown = (frames if warp_only is None else warp_only)[:, 1:]
    with torch.no_grad():
        paths = {"white box": read_path(flow, depth),
                 "white box textured": read_path(flow, depth, texture_weights(shown)),
                 "fit": fit_path(frames), "estimator": estimator(frames)}
        if warp_only is not None:
            paths |= {"fit warp": fit_path(warp_only), "estimator warp": estimator(warp_only)}
    return {name: accuracy(c2w, actions, settings) for name, c2w in paths.items()}


def study(names: Sequence[str], settings: EvalSettings, *, device: torch.device,
          estimator: LearnedEstimator | None = None, console: Console | None = None
          ) -> dict:
    """The JSON-ready result: ``truth[set][reader]`` (the true renders' accuracy by each
    reader), ``models[name][set]`` (each reader's mean accuracy, the mean absolute residual
    and ``per_sequence`` values) and ``changes[name][set][reader]`` (the paired bootstrap of
    each checkpoint's change from the first model)."""
    estimator = estimator or load_estimator("eval", device="cpu")
    models = [(name, load_checkpoint_model(resolve(name), device)) for name in names]
    cfg = models[0][1].cfg
    result: dict = {"settings": {k: getattr(settings, k) for k in settings.__slots__},
                    "truth": {}, "models": {name: {} for name in names}, "changes": {}}
    for k, (kind, (fraction, keys)) in enumerate(KINDS.items()):
        data = sample_sequences(settings.sequences, num_clips=1, seed=settings.seed + k,
                                composite_fraction=fraction, composite_keys=keys,
                                clip_frames=cfg.clip_frames, resolution=cfg.resolution)
        scenes, _ = sequence_scenes(settings.seed + k, settings.sequences)
        true_flow, depth = rendered_flow(scenes, data.c2w, resolution=cfg.resolution)
        truth = read_all(data.frames, None, true_flow, depth, data.actions, settings,
                         estimator)
        result["truth"][kind] = {name: v.mean().item() for name, v in truth.items()}
        for name, model in models:
            if console is not None:
                console.print(f"{kind}: {name}")
            gen = generate_clip1(model, data.frames[:, :1], data.actions, settings=settings,
                                 seed=settings.seed + k)
            read = read_all(gen["frames"], gen["warp_only"], gen["flow"], depth, data.actions,
                            settings, estimator)
            result["models"][name][kind] = {
                **{reader: v.mean().item() for reader, v in read.items()},
                "residual": gen["residual"].mean().item(),
                "per_sequence": {reader: v.tolist() for reader, v in read.items()}}
    base = names[0]
    for name in names[1:]:
        result["changes"][name] = {
            kind: {reader: paired_bootstrap(
                result["models"][base][kind]["per_sequence"][reader],
                result["models"][name][kind]["per_sequence"][reader])
                for reader in READERS} for kind in KINDS}
    return result


# the reader gaps reported beside the readers: (name, learned reader, reader it is taken from)
GAPS = (("estimator - white box", "estimator", "white box"),
        ("estimator - fit", "estimator", "fit"))


def pooled(result: dict, names: Sequence[str] | None = None) -> dict:
    """The change from the first model of ``names`` (default: every model after it, pooled as
    the training seeds of one row) per set and reader, and of each reader gap of ``GAPS``
    (per sequence, the learned reader's accuracy minus the other's): a paired bootstrap over
    the sequences and the seeds."""
    base, *rows = list(result["models"])
    rows = list(names) if names is not None else rows
    if not rows:
        raise ValueError("pooled needs at least one model after the base")
    def values(name: str, kind: str, reader: str) -> np.ndarray:
        return np.asarray(result["models"][name][kind]["per_sequence"][reader])

    def gap(name: str, kind: str, learned: str, other: str) -> np.ndarray:
        return values(name, kind, learned) - values(name, kind, other)

    out = {}
    for kind in result["models"][base]:
        out[kind] = {reader: paired_bootstrap(values(base, kind, reader),
                                              np.stack([values(n, kind, reader) for n in rows]))
                     for reader in READERS}
        out[kind].update({label: paired_bootstrap(
            gap(base, kind, a, b), np.stack([gap(n, kind, a, b) for n in rows]))
            for label, a, b in GAPS})
    return out


def markdown(result: dict, title: str) -> list[str]:
    """The pooled change (:func:`pooled`) as Markdown: one row per set, the readers no reward
    reads first (white box, fit), the estimator and the gaps beside them."""
    base = next(iter(result["models"]))
    columns = ("white box", "fit", "estimator", "estimator - white box", "estimator - fit",
               "fit warp", "estimator warp")
    lines = [f"| set | base, white box | base, fit | base, estimator | {title}: "
             + f" | {title}: ".join(columns) + " |", "|---|---|---|---|" + "---|" * len(columns)]
    for kind, row in pooled(result).items():
        means = result["models"][base][kind]
        cells = [f"{row[c]['change']:+.3f} [{row[c]['low']:+.3f}, {row[c]['high']:+.3f}]"
                 for c in columns]
        lines.append(f"| {kind} | {means['white box']:.3f} | {means['fit']:.3f} | "
                     f"{means['estimator']:.3f} | " + " | ".join(cells) + " |")
    return lines


def print_result(result: dict, console: Console) -> None:
    """One table per model (the true renders first): each reader's clip-1 accuracy per set
    and the mean absolute residual; then each checkpoint's change from the base per reader
    and set with its 95% interval."""
    blocks = [("true renders (each reader's ceiling)", result["truth"])]
    blocks += [(f"{Path(name).name}: clip-1 accuracy by reader", sets)
               for name, sets in result["models"].items()]
    for title, sets in blocks:
        table = Table(title=title, box=box.SIMPLE_HEAD)
        table.add_column("reader")
        for kind in sets:
            table.add_column(kind, justify="right")
        for reader in READERS:
            if reader in next(iter(sets.values())):
                table.add_row(reader, *(f"{row[reader]:.3f}" for row in sets.values()))
        if "residual" in next(iter(sets.values())):
            table.add_row("mean |residual|", *(f"{row['residual']:.3f}"
                                               for row in sets.values()))
        console.print(table)
    base = Path(next(iter(result["models"]))).name
    for name, sets in result["changes"].items():
        table = Table(title=f"{Path(name).name}: change from {base} (paired bootstrap)",
                      box=box.SIMPLE_HEAD)
        for column in ("set", "reader", "change", "95% low", "95% high"):
            table.add_column(column, justify="left" if column in ("set", "reader") else "right")
        for kind, row in sets.items():
            for reader in READERS:
                table.add_row(kind if reader == READERS[0] else "", reader,
                              *(f"{row[reader][key]:+.3f}" for key in ("change", "low", "high")))
        console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.white_box",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", nargs="+", default=[BASE],
                        help="'base' (the shipped tiny base) and/or exported weights, checkpoint "
                             "or run directories; the first is the one changes are taken from")
    parser.add_argument("--sequences", type=int, default=64, help="sequences per set")
    parser.add_argument("--clips", type=int, default=1, choices=(1,),
                        help="clips per sequence: 1, the only clip whose reference frame's "
                             "true depth is known")
    add_seed_arguments(parser)
    parser.add_argument("--preset", default="cpu",
                        help="preset whose sampler steps and shift and label thresholds to use "
                             "(as python -m wc_fast.eval --preset)")
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--markdown", default=None, metavar="PATH",
                        help="write the change of every model after the first, pooled as the "
                             "seeds of one row, as a Markdown table here")
    parser.add_argument("--title", default="trained", help="the pooled row's name in --markdown")
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error(f"--sequences must be >= 1, got {args.sequences}")
    try:
        names = list(dict.fromkeys(args.checkpoints))
        for name in names:
            resolve(name)
    except (ValueError, checkpoint.CheckpointError) as err:
        parser.error(str(err))
    settings = EvalSettings.from_config(build_preset(args.preset), sequences=args.sequences,
                                        clips=1, seed=args.seed)
    console = Console()
    result = study(names, settings, device=torch.device("cpu"), console=console)
    print_result(result, console)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.markdown and len(names) > 1:
        command = "python -m studies.white_box " + " ".join(
            argv if argv is not None else sys.argv[1:])
        lines = [f"`{command}` (clip 1, {args.sequences} sequences per set; change from the "
                 "first model, the others pooled as seeds [paired 95% bootstrap interval])",
                 "", *markdown(result, args.title)]
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        console.print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
