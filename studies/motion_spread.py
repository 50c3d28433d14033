"""How differently a world model's candidates move: ``motion_spread`` on held-out groups.

    python -m studies.motion_spread [--checkpoint PATH] [--groups 8] [--json PATH]
                                  [--action-exploration S] [--warp-exploration S]

For ``--groups`` held-out world prompts and commands of each kind (one key, two keys), the
model rolls out ``G`` candidates of clip 2 over one shared generated history, exactly as an RL
iteration does (``cpu`` preset sampler); the reward estimator reads their per-frame camera
motion. Prints, per kind, the mean ``motion_spread`` (within-group standard deviation of the
motion along the commanded directions over the estimator's error there on ground-truth
renders; above 1 means the candidates really move differently) and the mean IF with its
within-group standard deviation. ``--action-exploration`` / ``--warp-exploration`` roll out
under the rollout's exploration in camera motion (``rollout.action_exploration`` /
``rollout.warp_exploration``), as the trainer does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from wc_fast.actions import split_action
from wc_fast.config import preset
from wc_fast.infra.runtime import generator
from wc_fast.models.pretrained import load_checkpoint_model
from wc_fast.rewards import interaction_score, load_estimator
from wc_fast.rewards.motion_spread import (
    camera_motion,
    commanded_directions,
    estimator_motion_error,
    motion_spread,
)
from wc_fast.rewards.scoring import camera_poses
from wc_fast.rl.rollout import NO_EXPLORATION, MotionExploration, rollout_clip_level
from wc_fast.rl.sampler import ClipSampler
from wc_fast.world import sample_sequences

SEED = 910_000  # held out: no training or evaluation stream starts here
KINDS = {"basic": (0.0, (2,)), "composite_2key": (1.0, (2,))}


def measure(checkpoint: str | None, *, groups: int, group_size: int = 8,
            explore: MotionExploration = NO_EXPLORATION) -> dict:
    cfg = preset("cpu")
    device = torch.device("cpu")
    model = load_checkpoint_model(checkpoint, device)
    sampler = ClipSampler(model, steps=cfg.rollout.steps, shift=cfg.rollout.shift,
                          capture="eager")
    estimator = load_estimator("reward")
    error = estimator_motion_error(estimator)
    out: dict = {"estimator_error_steps": error.tolist(), "group_size": group_size}
    for k, (kind, (fraction, keys)) in enumerate(KINDS.items()):
        data = sample_sequences(groups, num_clips=2, seed=SEED + k, composite_fraction=fraction,
                                composite_keys=keys)
        spreads, ifs, if_stds = [], [], []
        for g in range(groups):
            rollout = rollout_clip_level(model, sampler, data.frames[g:g + 1, :1],
                                         data.actions[g], 2, group_size,
                                         generator(SEED, k, g, "motion_spread"),
                                         explore=explore)
            c2w = camera_poses(estimator, rollout.reward_frames())
            trans, rot = split_action(rollout.clip_actions)
            score = interaction_score(c2w.double(), trans, rot,
                                      trans_thresholds=cfg.reward.trans_thresholds,
                                      rot_threshold_deg=cfg.reward.rot_threshold_deg)
            spreads.append(motion_spread(camera_motion(c2w), error,
                                         commanded_directions(rollout.clip_actions)))
            ifs.append(float(score.mean()))
            if_stds.append(float(score.std()))
        out[kind] = {"motion_spread": statistics.mean(spreads), "if_mean": statistics.mean(ifs),
                     "if_std_within_group": statistics.mean(if_stds), "groups": groups}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default=None,
                        help="world model weights or checkpoint (default: the shipped base)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--json", default=None)
    parser.add_argument("--action-exploration", type=float, default=0.0,
                        help="std of each candidate's movement-key offsets")
    parser.add_argument("--warp-exploration", type=float, default=0.0,
                        help="std in pixels per frame of each candidate's warp-head motion")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    explore = MotionExploration(action=args.action_exploration, warp=args.warp_exploration)
    result = measure(args.checkpoint, groups=args.groups, explore=explore)
    result["exploration"] = {"action": explore.action, "warp": explore.warp}
    for kind in KINDS:
        r = result[kind]
        print(f"{kind:15s} motion_spread {r['motion_spread']:.2f}  IF {r['if_mean']:.3f} "
              f"(within-group std {r['if_std_within_group']:.3f}, {r['groups']} groups)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
