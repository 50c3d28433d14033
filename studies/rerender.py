"""Which reader is right on generated frames: re-render the world along each reader's camera
path and compare with what the model generated (analysis by synthesis), on clip 1.

    python -m wc_fast.eval --final --sequences 64 --save-frames runs/frames/base
    python -m studies.rerender runs/frames/base runs/frames/rl [--set composite_2key]
                               [--factors 0.25,0.5,0.75,1] [--json OUT]

The learned estimators and the classical fit disagree on generated key combinations
(``studies.reader_gap``), and no reader trained or tuned on true renders can settle it. The
world can (:mod:`wc_fast.rewards.render_reader`): each evaluation sequence's scene is redrawn
from the evaluation seed (checked: the true path re-renders the saved ground truth), and clip 1
starts from the true prompt frame, so its start pose is known. The ``render`` reader follows
clip 1 frame by frame from that pose, each frame's motion the one of a grid of the world's key
presses (every action, its translation and its rotation each at ``--factors`` of the largest
step) whose render is closest to the generated frame. ``press`` is the two-stage reader of the
render-read IF reward (``reward.if_reader render``): the key press first, then its size.

For each frames source (every directory's generated frames, then the true renders) and each
reader (``est``: the evaluation estimator, ``rew``: the reward's estimator, ``fit``: the
classical fit, ``render``, ``press``, and the ``true`` and ``commanded`` camera paths for
reference):

- ``acc``: full-action accuracy by the evaluation's rule (best translation threshold per clip);
- ``psnr``: PSNR (dB) of the world rendered along the reader's path, started at the prompt's
  pose, against the frames (how well the path explains them; ``render`` is the best the grid
  allows);
- ``agree``: the share of frames whose label equals the ``render`` reader's;

and the disputes: of the frames the estimator reads as the command and the fit does not
(``est only``), the share the ``render`` reader reads as the command, and the same for
``fit only``. Every directory after the first gets each reader's accuracy change from the
first, with a paired 95% bootstrap interval over sequences (``change``); ``per_sequence``
holds each reader's accuracy per sequence.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from torch import Tensor

from studies.reader_gap import (
    load_sets,
    parse_positive,
    read_labels,
    reader_poses,
    write_rows,
)
from wc_fast.actions import split_action
from wc_fast.config import preset
from wc_fast.eval import FINAL_EVAL_SEED, KINDS, EvalSettings
from wc_fast.measures.bootstrap import paired_bootstrap
from wc_fast.measures.psnr_ssim import psnr_clamped
from wc_fast.rewards import load_estimator
from wc_fast.rewards.render_reader import anchored, motion_grid, press_track, render_track
from wc_fast.world import Scenes, render, sequence_scenes

# readers of the frames, then reference paths that read nothing
READERS = ("est", "rew", "fit", "render", "press")
PATHS = ("true", "commanded")


def check_scenes(scenes: Scenes, c2w_true: Tensor, truth: Tensor) -> None:
    """Refuse scenes that do not re-render the saved true frames ``[n, T, 3, R, R]`` along the
    saved true path ``[n, T, 4, 4]``: the frames were saved with other evaluation seeds."""
    shown = render(scenes, c2w_true, resolution=truth.shape[-1])
    gap = (shown - truth).abs().max().item()
    if gap > 1e-3:
        raise ValueError(f"the scenes drawn from --seed do not re-render the saved true frames "
                         f"(max difference {gap:.3g}): pass the evaluation seed the frames "
                         f"were saved with (wc_fast.eval --final uses {FINAL_EVAL_SEED})")


def read_source(frames: Tensor, paths: dict[str, Tensor], commands: Tensor, *,
                scenes: Scenes, grid: Tensor, settings: EvalSettings,
                estimators: dict) -> dict[str, float]:
    """Every reader's numbers (see the module doc) on clip-1 frames ``[n, F+1, 3, R, R]``
    commanded by ``commands`` ``[n, F]``; ``paths`` are the reference paths ``[n, F+1, 4, 4]``
    (``true`` first: its first pose starts every path)."""
    start = paths["true"][:, 0]
    clip_frames = commands.shape[1]
    poses = {name: anchored(p[:, 0], start)
             for name, p in reader_poses(frames, clip_frames, estimators).items()}
    poses["render"] = render_track(scenes, start, frames, grid)
    poses["press"] = press_track(scenes, start, frames)
    poses |= {name: anchored(p, start) for name, p in paths.items()}
    trans_gt, rot_gt = split_action(commands)
    labels, hit, row = {}, {}, {"per_sequence": {}}
    for name, c2w in poses.items():
        trans, rot = read_labels(c2w, trans_gt, rot_gt,
                                 trans_thresholds=settings.trans_thresholds,
                                 rot_threshold_deg=settings.rot_threshold_deg)
        labels[name], hit[name] = (trans, rot), (trans == trans_gt) & (rot == rot_gt)
        shown = render(scenes, c2w, resolution=frames.shape[-1])[:, 1:]
        row[f"{name} acc"] = hit[name].double().mean().item()
        row["per_sequence"][name] = hit[name].double().mean(1).tolist()
        row[f"{name} psnr"] = psnr_clamped(shown, frames[:, 1:]).mean().item()
    for name in poses:
        same = ((labels[name][0] == labels["render"][0])
                & (labels[name][1] == labels["render"][1]))
        row[f"{name} agree"] = same.double().mean().item()
    for a, b in (("est", "fit"), ("fit", "est")):
        disputed = hit[a] & ~hit[b]
        row[f"{a} only"] = disputed.double().mean().item()
        row[f"{a} only: render hits"] = (hit["render"][disputed].double().mean().item()
                                         if disputed.any() else float("nan"))
    return row


def study(directories: Sequence[str | Path], *, kind: str, settings: EvalSettings,
          clip_frames: int, factors: Sequence[float], seed: int | None = None,
          estimators: dict | None = None) -> dict[str, dict[str, float]]:
    """Rows (frames source -> :func:`read_source`'s numbers) of every directory's generated
    clip 1 and of the true renders, set ``kind`` saved with evaluation seed ``seed`` (default:
    :data:`FINAL_EVAL_SEED`, as ``wc_fast.eval --final``)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    sets = load_sets(directories, kind)
    estimators = estimators or {"est": load_estimator("eval"), "rew": load_estimator("reward")}
    first = sets[0]
    n = first["actions"].shape[0]
    base_seed = FINAL_EVAL_SEED if seed is None else seed
    scenes, _ = sequence_scenes(base_seed + list(KINDS).index(kind), n)
    clip = slice(0, clip_frames + 1)
    check_scenes(scenes, first["c2w_true"][:, clip], first["ground_truth"][:, clip])
    paths = {"true": first["c2w_true"][:, clip], "commanded": first["c2w_commanded"][:, clip]}
    commands = first["actions"][:, :clip_frames]
    grid = motion_grid(factors)
    sources = {str(d): s["generated"][:, clip] for d, s in zip(directories, sets, strict=True)}
    sources["true renders"] = first["ground_truth"][:, clip]
    rows = {name: read_source(frames, paths, commands, scenes=scenes, grid=grid,
                              settings=settings, estimators=estimators)
            for name, frames in sources.items()}
    reference = rows[str(directories[0])]["per_sequence"]
    for directory in directories[1:]:
        ours = rows[str(directory)]["per_sequence"]
        rows[str(directory)]["change"] = {reader: paired_bootstrap(reference[reader], ours[reader])
                                          for reader in READERS}
    return rows


def print_rows(rows: dict, console: Console, title: str) -> None:
    """A table per frames source: a row per reader (accuracy, re-render PSNR, agreement with
    the ``render`` reader); the disputes under it."""
    first = next(iter(rows))
    for name, row in rows.items():
        table = Table(title=f"{title}: {Path(name).name or name}")
        for column in ("reader", "acc", "psnr (dB)", "agree with render"):
            table.add_column(column, justify="right")
        for reader in (*READERS, *PATHS):
            table.add_row(reader, f"{row[f'{reader} acc']:.3f}", f"{row[f'{reader} psnr']:.2f}",
                          f"{row[f'{reader} agree']:.3f}")
        console.print(table)
        console.print("; ".join(
            f"{a} only {row[f'{a} only']:.3f} of frames, the render reader reads "
            f"{row[f'{a} only: render hits']:.2f} of them as the command" for a in ("est", "fit")))
        if "change" in row:
            console.print(f"accuracy change from {Path(first).name or first} (paired 95% "
                          f"bootstrap interval over sequences): " + "; ".join(
                              f"{reader} {c['change']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"
                              for reader, c in row["change"].items()))


def parse_factors(text: str) -> list[float]:
    """``"0.25,0.5"`` -> ``[0.25, 0.5]``; ``ValueError`` naming ``--factors`` unless it holds
    at least one number, every one > 0."""
    factors = parse_positive(text, "factors")
    if not factors:
        raise ValueError(f"--factors must name at least one size, got {text!r}")
    return factors


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.rerender",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("directories", nargs="+", help="--save-frames directories of wc_fast.eval")
    p.add_argument("--set", default="composite_2key", choices=list(KINDS),
                   help="evaluation set")
    p.add_argument("--factors", default="0.25,0.5,0.75,1",
                   help="translation and rotation sizes of the render reader's grid, as "
                        "fractions of the largest step")
    p.add_argument("--seed", type=int, default=FINAL_EVAL_SEED,
                   help="evaluation seed the frames were saved with")
    p.add_argument("--clip-frames", type=int, default=4, help="frames per clip")
    p.add_argument("--preset", default="cpu",
                   help="preset whose label thresholds to use (as wc_fast.eval --preset)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    try:
        factors = parse_factors(args.factors)
    except ValueError as err:
        p.error(str(err))
    settings = EvalSettings.from_config(preset(args.preset))
    rows = study(args.directories, kind=args.set, settings=settings, factors=factors,
                 clip_frames=args.clip_frames, seed=args.seed)
    print_rows(rows, Console(), f"clip 1 of {args.set}, re-rendered")
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
