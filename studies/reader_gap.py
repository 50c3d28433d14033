"""Why the learned estimators and the classical camera fit read a model's action
following differently: the readers side by side on the same saved frames, frame by frame.

    python -m wc_fast.eval --final --sequences 64 --save-frames runs/frames/base
    python -m wc_fast.eval --final --sequences 64 --checkpoint CKPT --save-frames runs/frames/rl
    python -m studies.reader_gap runs/frames/base runs/frames/rl [--set composite_2key]
                                 [--blur 0.5,1,1.5] [--noise 0.05] [--json OUT]

Two readings of a gap between them are possible: the update learned what the learned
estimators reward (frames an estimator reads as the command while the camera did not do it),
or the fit misses motion that is there (generated frames may be blurrier or noisier than true
renders, and the fit aligns image gradients). For each frames directory (and for the true
renders, sharp, Gaussian-blurred at ``--blur`` sigmas and with ``--noise``, so each reader's
sensitivity to blur and noise is measured where the truth is known), on clip 1 (the trained
clip) and on all clips, per reader (``est``: the evaluation estimator; ``rew``: the RL
reward's estimator, a different network trained on the same world; ``fit``: the classical
camera fit):

- ``acc``: full-action accuracy by the evaluation's rule (best translation threshold per clip);
- ``trans ok`` / ``rot ok``: how often each half of the label is right, at that threshold;
- ``|t|`` and ``rot``: the read per-frame translation norm and rotation (degrees);

and between the readers: ``agree`` (the estimator and the fit give the same full label),
``agree est/rew`` (the two learned estimators do), ``est only`` (a frame the estimator reads
as the command and the fit does not), ``fit only``; ``sharp`` is the frames' mean luminance
gradient magnitude. Composite sets are also split by kind of command (TR: one translation and
one rotation key; RR: two rotations; TT: two translations), the accuracy by each reader.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from wc_fast.actions import label_to_bits, split_action
from wc_fast.config import preset
from wc_fast.eval import EvalSettings
from wc_fast.measures import fit_path
from wc_fast.measures.report import clip_windows
from wc_fast.rewards import load_estimator
from wc_fast.rewards.camera_fit import luminance
from wc_fast.rewards.degrade import add_noise, gaussian_blur
from wc_fast.rewards.interaction import poses_to_labels, relative_motion, rotation_angles

# the evaluation estimator, the RL reward's estimator and the classical fit
READERS = ("est", "rew", "fit")
# translation keys pressed by a two-key command -> its kind
KIND_OF_TRANSLATION_KEYS = {2: "TT", 1: "TR", 0: "RR"}


def read_labels(c2w: Tensor, trans_gt: Tensor, rot_gt: Tensor, *,
                trans_thresholds: Sequence[float], rot_threshold_deg: float
                ) -> tuple[Tensor, Tensor]:
    """Per-frame (translation, rotation) labels ``[W, F]`` of clip windows ``[W, F+1, 4, 4]``,
    the translation labels at each window's best threshold for full-action accuracy (the
    evaluation's rule, :func:`wc_fast.rewards.interaction.action_accuracy`)."""
    per = [poses_to_labels(c2w, trans_threshold=t, rot_threshold_deg=rot_threshold_deg)
           for t in trans_thresholds]
    trans = torch.stack([labels[0] for labels in per])  # [M, W, F]
    rot = per[0][1]
    hits = ((trans == trans_gt) & (rot == rot_gt)).double().mean(-1)  # [M, W]
    best = hits.argmax(0)  # the first best threshold, as amax's value
    return trans.gather(0, best[None, :, None].expand(1, *trans.shape[1:]))[0], rot


def motion_read(c2w: Tensor) -> tuple[Tensor, Tensor]:
    """Per-frame translation norm and rotation angle (degrees) ``[W, F]`` of windows
    ``[W, F+1, 4, 4]``."""
    rel = relative_motion(c2w)
    pitch, yaw = rotation_angles(rel)
    return rel[..., :3, 3].norm(dim=-1), torch.hypot(pitch, yaw)


def sharpness(frames: Tensor) -> float:
    """Mean luminance gradient magnitude of the new frames of ``[n, T, 3, H, W]``."""
    lum = luminance(frames[:, 1:])
    gx, gy = lum[..., :, 1:] - lum[..., :, :-1], lum[..., 1:, :] - lum[..., :-1, :]
    return float((gx[..., :-1, :] ** 2 + gy[..., :, :-1] ** 2).sqrt().mean())


def blur_frames(frames: Tensor, sigma: float) -> Tensor:
    """``[n, T, 3, H, W]`` blurred frame by frame (Gaussian, ``sigma`` pixels)."""
    flat = frames.flatten(0, 1)
    out = gaussian_blur(flat, torch.full((flat.shape[0],), sigma, dtype=flat.dtype))
    return out.reshape(frames.shape)


def noisy_frames(frames: Tensor, std: float, seed: int = 0) -> Tensor:
    """``[n, T, 3, H, W]`` with Gaussian noise of ``std`` on every frame after the prompt,
    clipped to [-1, 1] (:func:`wc_fast.rewards.degrade.add_noise`)."""
    new = frames[:, 1:].flatten(0, 1)
    noisy = add_noise(new, torch.full((new.shape[0],), std, dtype=new.dtype),
                      torch.Generator().manual_seed(seed))
    return torch.cat([frames[:, :1], noisy.reshape(frames[:, 1:].shape)], 1)


def clip_commands(actions: Tensor, clips: slice, clip_frames: int) -> Tensor:
    """The commands ``[n * len(clips), F]`` of the clips ``clips`` of ``actions`` ``[n, N*F]``."""
    n = actions.shape[0]
    return actions.reshape(n, -1, clip_frames)[:, clips].flatten(0, 1)


def reader_poses(frames: Tensor, clip_frames: int, estimators: dict) -> dict[str, Tensor]:
    """Each reader's camera windows ``[n, N, F+1, 4, 4]`` of sequences ``[n, T, 3, H, W]``:
    the estimators (``{"est": ..., "rew": ...}``) read each clip window, the fit the whole path
    (as the evaluation does)."""
    windows = clip_windows(frames, clip_frames)
    n, clips = windows.shape[:2]
    poses = {}
    with torch.no_grad():
        for name, estimator in estimators.items():
            poses[name] = estimator(windows.flatten(0, 1)).double().reshape(
                n, clips, clip_frames + 1, 4, 4)
    return {**poses, "fit": clip_windows(fit_path(frames), clip_frames)}


def compare_readers(poses: dict[str, Tensor], actions: Tensor, *, clips: slice,
                    settings: EvalSettings) -> dict[str, float]:
    """Each reader's numbers, and the agreement of ``est`` with ``fit`` (and with ``rew``), on
    the clips ``clips`` of windows ``[n, N, F+1, 4, 4]`` (one entry per reader of
    :data:`READERS`, ``est`` and ``fit`` required) commanded by ``actions`` ``[n, N*F]``."""
    trans_gt, rot_gt = split_action(clip_commands(actions, clips, poses["est"].shape[2] - 1))
    row: dict[str, float] = {}
    hit = {}
    labels = {}
    for reader, windows in poses.items():
        c2w = windows[:, clips].flatten(0, 1)
        trans, rot = read_labels(c2w, trans_gt, rot_gt,
                                 trans_thresholds=settings.trans_thresholds,
                                 rot_threshold_deg=settings.rot_threshold_deg)
        t_norm, rot_deg = motion_read(c2w)
        hit[reader] = (trans == trans_gt) & (rot == rot_gt)
        labels[reader] = (trans, rot)
        row |= {f"{reader} acc": hit[reader].double().mean().item(),
                f"{reader} trans ok": (trans == trans_gt).double().mean().item(),
                f"{reader} rot ok": (rot == rot_gt).double().mean().item(),
                f"{reader} |t|": t_norm.mean().item(), f"{reader} rot": rot_deg.mean().item()}

    def agree(a: str, b: str) -> float:
        same = (labels[a][0] == labels[b][0]) & (labels[a][1] == labels[b][1])
        return same.double().mean().item()

    row |= {"agree": agree("est", "fit"),
            **({"agree est/rew": agree("est", "rew")} if "rew" in labels else {}),
            "est only": (hit["est"] & ~hit["fit"]).double().mean().item(),
            "fit only": (hit["fit"] & ~hit["est"]).double().mean().item()}
    return row


def kind_accuracy(poses: dict[str, Tensor], actions: Tensor, *, clips: slice,
                  settings: EvalSettings) -> dict[str, dict[str, float]]:
    """Per kind of two-key command (TR / RR / TT, by the clip's first frame's command), each
    reader's accuracy and the number of clips, on the clips ``clips``."""
    commands = clip_commands(actions, clips, poses["est"].shape[2] - 1)
    translation_keys = label_to_bits(split_action(commands[:, 0])[0]).sum(-1)
    out = {}
    for keys, kind in KIND_OF_TRANSLATION_KEYS.items():
        chosen = translation_keys == keys
        if not chosen.any():
            continue
        per_kind = {reader: window[:, clips].flatten(0, 1)[chosen]
                    for reader, window in poses.items()}
        sub = compare_readers({r: p[:, None] for r, p in per_kind.items()},
                              commands[chosen], clips=slice(0, 1), settings=settings)
        out[kind] = {"clips": int(chosen.sum()),
                     **{f"{r} acc": sub[f"{r} acc"] for r in poses}}
    return out


def load_set(directory: str | Path, kind: str) -> dict[str, Tensor]:
    """The arrays of ``directory/<kind>.npz`` (written by ``python -m wc_fast.eval
    --save-frames``) as tensors."""
    path = Path(directory) / f"{kind}.npz"
    if not path.is_file():
        raise ValueError(f"no {path}: write it with python -m wc_fast.eval --save-frames "
                         f"{directory}")
    with np.load(path) as data:
        return {key: torch.from_numpy(data[key]) for key in data.files}


def load_sets(directories: Sequence[str | Path], kind: str) -> list[dict[str, Tensor]]:
    """Set ``kind`` of every ``--save-frames`` directory (:func:`load_set`), refused unless
    there is at least one and all hold the same commands (one evaluation seed set)."""
    if not directories:
        raise ValueError("directories must name at least one --save-frames directory")
    sets = [load_set(d, kind) for d in directories]
    for directory, data in zip(directories, sets, strict=True):
        if not torch.equal(data["actions"], sets[0]["actions"]):
            raise ValueError(f"{directory} holds other commands than {directories[0]}: "
                             f"save every model's frames with the same evaluation seeds")
    return sets


def parse_positive(text: str, flag: str) -> list[float]:
    """``"0.5,1"`` -> ``[0.5, 1.0]`` (``""`` -> ``[]``); ``ValueError`` naming ``--flag``
    unless every value is a number > 0."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{flag} must be comma-separated numbers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"--{flag} values must be > 0, got {text!r}")
    return values


def write_rows(path: str | Path, rows: dict) -> None:
    """Write a study's rows to ``path`` as JSON (parent folders created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rows, indent=2))
    print(f"wrote {path}")


def study(directories: Sequence[str | Path], *, kind: str, blur: Sequence[float],
          clip_frames: int, settings: EvalSettings, noise: Sequence[float] = (),
          estimators: dict | None = None) -> dict:
    """Rows (``name -> {"sharp", "clip1": {...}, "all": {...}, "kinds": {...}}``) of every
    directory's generated frames, then the true renders of the first one, sharp, blurred at
    each sigma of ``blur`` and with noise of each std of ``noise``.
    All directories must hold the same commands (one evaluation seed set)."""
    sets = load_sets(directories, kind)
    estimators = estimators or {"est": load_estimator("eval"), "rew": load_estimator("reward")}
    actions = sets[0]["actions"]
    frames = {str(d): s["generated"] for d, s in zip(directories, sets, strict=True)}
    truth = sets[0]["ground_truth"]
    frames["true renders"] = truth
    for sigma in blur:
        frames[f"true renders, blur {sigma:g}"] = blur_frames(truth, sigma)
    for std in noise:
        frames[f"true renders, noise {std:g}"] = noisy_frames(truth, std)
    clips = actions.shape[1] // clip_frames
    rows = {}
    for name, x in frames.items():
        poses = reader_poses(x, clip_frames, estimators)
        rows[name] = {"sharp": sharpness(x)}
        for label, sl in (("clip1", slice(0, 1)), ("all", slice(0, clips))):
            rows[name][label] = compare_readers(poses, actions, clips=sl, settings=settings)
        if kind.startswith("composite"):
            rows[name]["kinds"] = kind_accuracy(poses, actions, clips=slice(0, 1),
                                                settings=settings)
    return rows


def print_rows(rows: dict, console: Console) -> None:
    """One table per slice of clips, a column per frames source (directories by their last
    name) and a row per measure; then clip 1 by kind of command."""
    names = {name: Path(name).name if Path(name).name else name for name in rows}
    measures = [m for m in next(iter(rows.values()))["clip1"]]
    for label in ("clip1", "all"):
        table = Table(title=f"readers on {'clip 1' if label == 'clip1' else 'all clips'}")
        table.add_column("measure")
        for short in names.values():
            table.add_column(short, justify="right")
        table.add_row("sharp", *(f"{row['sharp']:.4f}" for row in rows.values()))
        for m in measures:
            table.add_row(m, *(f"{row[label][m]:.3f}" for row in rows.values()))
        console.print(table)
    if any("kinds" in row for row in rows.values()):
        table = Table(title="clip 1 by kind of command: accuracy by each reader (clips)")
        table.add_column("kind, reader")
        for short in names.values():
            table.add_column(short, justify="right")
        for kind in KIND_OF_TRANSLATION_KEYS.values():
            for reader in READERS:
                cells = [f"{row['kinds'][kind][f'{reader} acc']:.2f} "
                         f"({row['kinds'][kind]['clips']})"
                         if kind in row.get("kinds", {}) else "-" for row in rows.values()]
                table.add_row(f"{kind}, {reader}", *cells)
        console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.reader_gap",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("directories", nargs="+", help="--save-frames directories of wc_fast.eval")
    p.add_argument("--set", default="composite_2key",
                   choices=("basic", "composite", "composite_2key"), help="evaluation set")
    p.add_argument("--blur", default="0.5,1,1.5",
                   help="Gaussian sigmas (pixels) at which to blur the true renders")
    p.add_argument("--noise", default="0.05",
                   help="Gaussian noise stds (frames in [-1, 1]) to add to the true renders")
    p.add_argument("--clip-frames", type=int, default=4, help="frames per clip")
    p.add_argument("--preset", default="cpu",
                   help="preset whose label thresholds to use (as wc_fast.eval --preset)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    try:
        levels = {flag: parse_positive(getattr(args, flag), flag) for flag in ("blur", "noise")}
    except ValueError as err:
        p.error(str(err))
    settings = EvalSettings.from_config(preset(args.preset))
    rows = study(args.directories, kind=args.set, blur=levels["blur"], noise=levels["noise"],
                 clip_frames=args.clip_frames, settings=settings)
    print_rows(rows, Console())
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
