"""Per-clip distance-to-truth metrics of one evaluation set and their JSON summary.

:func:`clip_metrics` scores generated sequences ``[n, 1 + N*F, 3, H, W]`` against the true
renders of the same sequences clip by clip (``[n, N]`` per metric); :func:`summarize_truth`
averages them over slices of clips (horizons, the trained clip 1) and adds the Fréchet distance
of each slice's frames with its true-render floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from wc_fast.actions import split_action
from wc_fast.measures.frechet import frame_frechet
from wc_fast.measures.psnr_ssim import psnr_clamped, ssim
from wc_fast.rewards.camera_fit import pose_errors
from wc_fast.rewards.interaction import action_accuracy

# The metrics of :func:`clip_metrics`, in report order.
METRICS = ("fit_accuracy", "psnr", "ssim", "rot_err_deg", "trans_err")


def clip_windows(frames: Tensor, clip_frames: int) -> Tensor:
    """``[n, 1 + N*F, ...]`` -> ``[n, N, F+1, ...]``: each clip with its context frame first."""
    clips = (frames.shape[1] - 1) // clip_frames
    idx = torch.arange(clips)[:, None] * clip_frames + torch.arange(clip_frames + 1)[None, :]
    return frames[:, idx]


def fit_accuracy(c2w_fit: Tensor, actions: Tensor, *, clip_frames: int,
                 trans_thresholds: Sequence[float], rot_threshold_deg: float) -> Tensor:
    """Action accuracy ``[n, N]`` of a fitted path ``[n, 1 + N*F, 4, 4]`` against the commanded
    actions ``[n, N*F]``, per clip and by the evaluation's rule
    (:func:`wc_fast.rewards.interaction.action_accuracy`)."""
    windows = clip_windows(c2w_fit, clip_frames)
    n, clips = windows.shape[:2]
    trans_gt, rot_gt = split_action(actions.reshape(n, clips, clip_frames))
    return action_accuracy(windows.double(), trans_gt, rot_gt, trans_thresholds=trans_thresholds,
                           rot_threshold_deg=rot_threshold_deg).float()


def fit_scores(c2w_fit: Tensor, c2w_true: Tensor, actions: Tensor, *, clip_frames: int,
               trans_thresholds: Sequence[float], rot_threshold_deg: float) -> dict[str, Tensor]:
    """The classical fit's accuracy, rotation error (degrees) and translation error per
    sequence and clip ``[n, N]``, from the fitted path and the true one ``[n, 1 + N*F, 4, 4]``:
    per-frame relative pose errors averaged over each clip's frames."""
    n = c2w_fit.shape[0]
    clips = (c2w_fit.shape[1] - 1) // clip_frames
    rot_err, trans_err = pose_errors(c2w_fit, c2w_true)
    return {"fit_accuracy": fit_accuracy(c2w_fit, actions, clip_frames=clip_frames,
                                         trans_thresholds=trans_thresholds,
                                         rot_threshold_deg=rot_threshold_deg),
            "rot_err_deg": _per_clip(rot_err, n, clips),
            "trans_err": _per_clip(trans_err, n, clips)}


def _per_clip(values: Tensor, n: int, clips: int) -> Tensor:
    """Per-frame values ``[n, N*F]`` -> their mean per clip ``[n, N]``."""
    return values.reshape(n, clips, -1).mean(-1).float()


def frame_distances(generated: Tensor, truth: Tensor, clip_frames: int) -> dict[str, Tensor]:
    """PSNR and SSIM of ``generated`` against ``truth`` ``[n, 1 + N*F, 3, H, W]``, each the mean
    over a clip's new frames ``[n, N]``."""
    if generated.shape != truth.shape:
        raise ValueError(f"generated and truth must have one shape, got "
                         f"{tuple(generated.shape)} and {tuple(truth.shape)}")
    n = generated.shape[0]
    clips = (generated.shape[1] - 1) // clip_frames
    return {"psnr": _per_clip(psnr_clamped(generated[:, 1:], truth[:, 1:]), n, clips),
            "ssim": _per_clip(ssim(generated[:, 1:], truth[:, 1:]), n, clips)}


def clip_metrics(generated: Tensor, truth: Tensor, c2w_fit: Tensor, c2w_true: Tensor,
                 actions: Tensor, *, clip_frames: int, trans_thresholds: Sequence[float],
                 rot_threshold_deg: float) -> dict[str, Tensor]:
    """Each metric of :data:`METRICS` per sequence and clip ``[n, N]``.

    ``generated`` and ``truth`` ``[n, 1 + N*F, 3, H, W]`` (frame 0 the shared prompt),
    ``c2w_fit`` the classical fit of ``generated``
    (:func:`~wc_fast.rewards.camera_fit.fit_path`), ``c2w_true`` ``[n, 1 + N*F, 4, 4]`` the
    path the world rendered, ``actions`` ``[n, N*F]``. PSNR and SSIM are means over each clip's
    new frames.
    """
    distances = frame_distances(generated, truth, clip_frames)
    scores = fit_scores(c2w_fit, c2w_true, actions, clip_frames=clip_frames,
                        trans_thresholds=trans_thresholds, rot_threshold_deg=rot_threshold_deg)
    return {"fit_accuracy": scores["fit_accuracy"], **distances,
            "rot_err_deg": scores["rot_err_deg"], "trans_err": scores["trans_err"]}


def clip_frames_of(frames: Tensor, clips: slice, clip_frames: int) -> Tensor:
    """The new frames of the clips ``clips`` of sequences ``[n, 1 + N*F, ...]``."""
    total = (frames.shape[1] - 1) // clip_frames
    chosen = range(total)[clips]
    idx = [1 + c * clip_frames + k for c in chosen for k in range(clip_frames)]
    return frames[:, idx]


def summarize_truth(per_clip: Mapping[str, Tensor], generated: Tensor, truth: Tensor,
                    floor_truth: Tensor, *, clip_frames: int,
                    slices: Mapping[str, slice]) -> dict:
    """JSON block: every metric of ``per_clip`` (``[n, N]`` each) averaged over each named slice
    of clips and per clip, with ``frechet`` (generated vs true renders of those clips) and
    ``frechet_floor`` (``floor_truth``, true renders of the same commands at other speeds, vs
    the true renders)."""
    clips = next(iter(per_clip.values())).shape[1]

    def block(sl: slice) -> dict:
        row = {name: values[:, sl].mean().item() for name, values in per_clip.items()}
        gen, ref = (clip_frames_of(x, sl, clip_frames) for x in (generated, truth))
        row["frechet"] = frame_frechet(gen, ref)
        row["frechet_floor"] = frame_frechet(clip_frames_of(floor_truth, sl, clip_frames), ref)
        return row

    out = {name: block(sl) for name, sl in slices.items() if sl.stop > sl.start}
    out["by_clip"] = [{"clip": c + 1, **block(slice(c, c + 1))} for c in range(clips)]
    return out


def print_truth_table(result: dict, kinds: Sequence[str], console: Console) -> None:
    """Distance to the ground truth per set, over all clips and on clip 1 alone: accuracy
    (evaluation estimator, classical fit, and the fit on true renders), PSNR beside its floor,
    SSIM, camera errors and the Fréchet distance beside its floor."""
    table = Table(title="distance to the ground truth (rotation error in degrees, translation "
                        "error in world units, FD: Fréchet distance on pooled pixels)")
    columns = ("set", "clips", "est acc", "fit acc", "GT fit", "PSNR (floor)", "SSIM",
               "rot err", "trans err", "FD (floor)")
    for col in columns:
        table.add_column(col, justify="left" if col == "set" else "right")
    for kind in kinds:
        metrics = result[kind]["metrics"]
        truth = result["ground_truth"][kind]
        for label, block in (("all", metrics["all"]), ("1", metrics["clip1"])):
            table.add_row(kind if label == "all" else "", label, f"{block['accuracy']:.3f}",
                          f"{block['fit_accuracy']:.3f}",
                          f"{truth['fit_accuracy']:.3f}" if label == "all" else "",
                          f"{block['psnr']:.1f} ({block['psnr_floor']:.1f})",
                          f"{block['ssim']:.3f}", f"{block['rot_err_deg']:.2f}",
                          f"{block['trans_err']:.3f}",
                          f"{block['frechet']:.2f} ({block['frechet_floor']:.2f})")
    console.print(table)
