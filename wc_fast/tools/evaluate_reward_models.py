"""``python -m wc_fast.tools.evaluate_reward_models [--json PATH]``: acceptance numbers.

Checks the shipped reward models against the ground truth of the synthetic world, on seeds from
the held-out stream ``batch_seed(EVAL_DATA_SEED, i)`` that no training recipe uses:

- estimators: per-frame label agreement (translation and rotation labels both equal to the
  commanded ones) at each translation threshold of the ``cpu`` preset, split into basic,
  composite and no-op frames (a new random action every frame); the IF score of
  ground-truth renders (one action per clip, as the RL task commands); and the mean error of
  the estimated per-frame camera motion in units of the largest step (the world's speed
  varies, so this says whether the estimator measures how far the camera moved);
- critics (reward and eval): how often a clean frame scores above its degraded version, per
  degradation; static clips (no-op) against moving clean clips from the same start frames;
  and how often a true render scores above the shipped base world model's generation of the
  same frame, per evaluation set, on sequences of the held-out seed ``EVAL_DATA_SEED + 2``;
- with ``--only held_out --held-out CHECKPOINT...``: the same check of the evaluation critic
  on the generations of checkpoints that no comparison uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from wc_fast.actions import is_basic, is_composite, split_action
from wc_fast.config import preset
from wc_fast.rewards.critic import VisualQualityScorer, load_critic
from wc_fast.rewards.degrade import KINDS, degraded_pairs
from wc_fast.rewards.estimators import CameraEstimator, load_estimator, load_estimator_file
from wc_fast.rewards.interaction import poses_to_labels
from wc_fast.rewards.motion_spread import estimator_motion_error
from wc_fast.rewards.scoring import if_scores
from wc_fast.tools.train_reward_models import generated_pairs
from wc_fast.world import batch_seed, sample_clips

EVAL_DATA_SEED = 9000
_BATCH = 100


def _batches(count: int, offset: int, **options: object):
    """Held-out clip batches: ``ceil(count / _BATCH)`` batches from the evaluation stream."""
    for i in range((count + _BATCH - 1) // _BATCH):
        yield sample_clips(_BATCH, seed=batch_seed(EVAL_DATA_SEED, offset + i), **options)


def label_agreement(estimator: CameraEstimator, *, clips: int = 1000,
                    trans_thresholds: Sequence[float], rot_threshold_deg: float) -> dict:
    """Per-frame label agreement by frame class and translation threshold."""
    hits: dict[str, list[Tensor]] = {"basic": [], "composite": [], "noop": []}
    for batch in _batches(clips, 0, clip_frames=8, segment_frames=1, noop_fraction=0.1):
        with torch.no_grad():
            c2w = estimator(batch.frames)
        gt_t, gt_r = split_action(batch.actions)
        per_threshold = []
        for tau in trans_thresholds:
            trans, rot = poses_to_labels(c2w, trans_threshold=tau,
                                         rot_threshold_deg=rot_threshold_deg)
            per_threshold.append((trans == gt_t) & (rot == gt_r))
        ok = torch.stack(per_threshold, -1).flatten(0, 1)  # [frames, thresholds]
        actions = batch.actions.flatten()
        hits["basic"].append(ok[is_basic(actions)])
        hits["composite"].append(ok[is_composite(actions)])
        hits["noop"].append(ok[actions == 0])
    out = {}
    for name, parts in hits.items():
        ok = torch.cat(parts).double()
        out[name] = {"frames": ok.shape[0],
                     "by_threshold": {str(t): round(float(ok[:, i].mean()), 4)
                                      for i, t in enumerate(trans_thresholds)},
                     "all_thresholds": round(float(ok.all(-1).double().mean()), 4)}
    return out


def if_of_ground_truth(estimator: CameraEstimator, *, clips: int = 1000,
                       trans_thresholds: Sequence[float], rot_threshold_deg: float) -> dict:
    """Mean IF score of ground-truth renders (one action per clip), basic and composite."""
    scores = {"basic": [], "composite": []}
    for name, fraction, offset in (("basic", 0.0, 100), ("composite", 1.0, 200)):
        for batch in _batches(clips // 2, offset, composite_fraction=fraction):
            with torch.no_grad():
                scores[name].append(if_scores(estimator, batch.frames, batch.actions,
                                              trans_thresholds=trans_thresholds,
                                              rot_threshold_deg=rot_threshold_deg))
    means = {k: round(float(torch.cat(v).mean()), 4) for k, v in scores.items()}
    means["all"] = round((means["basic"] + means["composite"]) / 2, 4)
    return means


def critic_pairs(critic: VisualQualityScorer, *, clips: int = 1000) -> dict:
    """Share of pairs where the clean frame scores above its degraded version, per kind."""
    gen = torch.Generator().manual_seed(EVAL_DATA_SEED)
    out = {}
    for k, kind in enumerate(KINDS):
        wins = []
        for batch in _batches(clips, 300 + 20 * k, segment_frames=1):
            clean, degraded = degraded_pairs(batch.frames, kind, gen)
            with torch.no_grad():
                scores = critic(torch.stack([clean, degraded], 1))
            wins.append(scores[:, 0] > scores[:, 1])
        out[kind] = round(float(torch.cat(wins).double().mean()), 4)
    return out


def static_vs_moving(critic: VisualQualityScorer, *, clips: int = 1000) -> dict:
    """Mean clip score (over the 4 new frames) of static clips and of moving clean clips that
    start from the same frame, their difference, and the noise level of that difference."""
    static, moving, degraded = [], [], []
    gen = torch.Generator().manual_seed(EVAL_DATA_SEED + 1)
    for i in range(clips // _BATCH):
        seed = batch_seed(EVAL_DATA_SEED, 500 + i)
        still = sample_clips(_BATCH, seed=seed, noop_fraction=1.0)
        move = sample_clips(_BATCH, seed=seed)
        with torch.no_grad():
            static.append(critic(still.frames)[:, 1:].mean(1))
            moving.append(critic(move.frames)[:, 1:].mean(1))
            smeared = torch.stack([degraded_pairs(move.frames, "smear", gen)[1]] * 4, 1)
            degraded.append(critic(smeared).mean(1))
    s, m, d = torch.cat(static), torch.cat(moving), torch.cat(degraded)
    diff = s - m
    return {"static_mean": round(float(s.mean()), 4), "moving_mean": round(float(m.mean()), 4),
            "difference": round(float(diff.mean()), 4),
            "difference_std_error": round(float(diff.std() / len(diff) ** 0.5), 4),
            "clip_score_std": round(float(m.std()), 4),
            "smeared_mean": round(float(d.mean()), 4), "clips": len(diff)}


def true_vs_generated(critic: VisualQualityScorer, *, sequences: int = 32, clips: int = 6,
                      checkpoint: str | None = None) -> dict:
    """Per evaluation set: the share of frames whose true render outscores the base model's
    (or ``checkpoint``'s) generation of it, and both mean scores (the generated frames' by clip
    of the rollout)."""
    out = {}
    pairs = generated_pairs(sequences, clips, EVAL_DATA_SEED + 2, checkpoint=checkpoint)
    for name, (true, made) in pairs.items():
        with torch.no_grad():
            s_true, s_made = critic(true[:, None])[:, 0], critic(made[:, None])[:, 0]
        by_clip = s_made.reshape(sequences, clips, -1).mean((0, 2))
        out[name] = {"true_above_generated": round(float((s_true > s_made).double().mean()), 4),
                     "true_mean": round(float(s_true.mean()), 4),
                     "generated_mean": round(float(s_made.mean()), 4),
                     "generated_by_clip": [round(float(v), 3) for v in by_clip]}
    return out


def evaluate(*, clips: int = 1000, threads: int = 2,
             only: Sequence[str] = ("estimators", "critic"), held_out: Sequence[str] = (),
             estimator_files: Sequence[str] = ()) -> dict:
    """The acceptance numbers of the shipped models (``only`` some of them), with the ``cpu``
    preset's thresholds; with ``"held_out"`` in ``only``, the evaluation critic's true-vs-
    generated check on the generations of each checkpoint in ``held_out`` (checkpoints that no
    comparison uses, so that the critic is validated on world models it was not fitted to).
    ``estimator_files`` (``--which ... --out`` files, e.g. ``reward_generated``'s) are measured
    as the shipped estimators are, under ``estimator_file:PATH``."""
    torch.set_num_threads(threads)
    reward = preset("cpu").reward
    thresholds = dict(trans_thresholds=reward.trans_thresholds,
                      rot_threshold_deg=reward.rot_threshold_deg)
    report: dict = {"thresholds": {"trans": list(reward.trans_thresholds),
                                   "rot_deg": reward.rot_threshold_deg},
                    "eval_data_seed": EVAL_DATA_SEED}
    estimators = {f"estimator_{which}": lambda which=which: load_estimator(which)
                  for which in (("reward", "eval") if "estimators" in only else ())}
    estimators.update({f"estimator_file:{path}": lambda path=path: load_estimator_file(path)
                       for path in estimator_files})
    for name, load in estimators.items():
        start = time.perf_counter()
        est = load()
        report[name] = {
            "labels": label_agreement(est, clips=clips, **thresholds),
            "if_ground_truth": if_of_ground_truth(est, clips=clips, **thresholds),
            # the per-direction errors [4], averaged over the directions
            "motion_error_steps": round(float(estimator_motion_error(
                est, clips=clips, seed=EVAL_DATA_SEED + 1).mean()), 4),
            "seconds": round(time.perf_counter() - start, 1)}
    if "held_out" in only:
        critic = load_critic("eval")
        report["critic_eval_held_out"] = {
            str(path): true_vs_generated(critic, checkpoint=path) for path in held_out}
    if "critic" not in only:
        return report
    for which, name in (("reward", "critic"), ("eval", "critic_eval")):
        critic = load_critic(which)
        report[name] = {"pair_accuracy": critic_pairs(critic, clips=clips),
                        "static_vs_moving": static_vs_moving(critic, clips=clips),
                        "true_vs_generated": true_vs_generated(critic)}
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wc_fast.tools.evaluate_reward_models",
                                     description="Acceptance numbers of the shipped reward "
                                                 "models on held-out seeds.")
    parser.add_argument("--clips", type=int, default=1000, help="clips per measurement")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--only", choices=("estimators", "critic", "held_out"), default=None,
                        help="measure only these models (held_out: the evaluation critic on "
                             "the generations of --held-out checkpoints)")
    parser.add_argument("--held-out", nargs="+", default=(), metavar="CHECKPOINT",
                        help="checkpoints no comparison uses, whose generations validate the "
                             "evaluation critic (with --only held_out)")
    parser.add_argument("--estimator-file", nargs="+", default=(), metavar="PATH",
                        help="estimator files written by train_reward_models --out, measured "
                             "as the shipped estimators are (alone unless --only names more)")
    args = parser.parse_args(argv)
    if (args.only == "held_out") != bool(args.held_out):
        parser.error("--only held_out and --held-out CHECKPOINT... go together")
    only = ((args.only,) if args.only
            else () if args.estimator_file else ("estimators", "critic"))
    report = evaluate(clips=args.clips, threads=args.threads, only=only, held_out=args.held_out,
                      estimator_files=args.estimator_file)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
