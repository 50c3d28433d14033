"""Evaluation measures the field reports, beside the learned estimators and critic of
:mod:`wc_fast.eval`: distance to the ground truth (PSNR, SSIM), a classical camera fit (rotation
and translation error, action accuracy), a Fréchet distance on pooled pixels with its
true-render floor, and paired bootstrap intervals of a change."""

from wc_fast.measures.bootstrap import paired_bootstrap, sequence_values
from wc_fast.measures.frames_io import NPZ_KEYS, commanded_path, save_set
from wc_fast.measures.frechet import frame_frechet, frechet_distance, pooled_features
from wc_fast.measures.psnr_ssim import psnr, psnr_clamped, ssim
from wc_fast.measures.report import (
    METRICS,
    clip_metrics,
    fit_scores,
    print_truth_table,
    summarize_truth,
)
from wc_fast.rewards.camera_fit import fit_path, pose_errors

__all__ = [
    "METRICS", "NPZ_KEYS", "clip_metrics", "commanded_path", "fit_path", "fit_scores",
    "frame_frechet", "frechet_distance", "paired_bootstrap", "pooled_features", "pose_errors",
    "print_truth_table", "psnr", "psnr_clamped", "save_set", "sequence_values", "ssim",
    "summarize_truth",
]
