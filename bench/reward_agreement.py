"""How far the IF reward agrees with the evaluation, inside the groups the trainer ranks.

    python bench/reward_agreement.py --preset cpu --groups 30

Rolls out the trainer's groups with the base model (G candidates sharing a history and a
command, clip indices cycling as in training) and scores every candidate with the reward
estimator (the IF reward) and with the evaluation estimator. Prints, over all candidate pairs
of a group that both estimators tell apart, how often they order the pair the same way (0.5 is
chance), the correlation of the two scores over all candidates, and each score's mean
within-group spread. The NFT update can only climb what the reward ranks correctly.
"""

from __future__ import annotations

import argparse
import sys

import torch

from wc_fast import config as config_lib
from wc_fast.rewards import if_scores, load_estimator
from wc_fast.runtime import resolve_device
from wc_fast.train import initial_model
from wc_fast.trainer import Trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu", choices=config_lib.PRESETS)
    parser.add_argument("--groups", type=int, default=30)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    cfg = config_lib.preset(args.preset)
    device = resolve_device(args.device)
    trainer = Trainer(cfg, initial_model(cfg, device), device)
    evaluator = load_estimator("eval", device=device)
    rw = cfg.reward
    same = pairs = 0
    rewards, evals, spread = [], [], torch.zeros(2)
    for step in range(args.groups):
        (group,) = trainer.rollout(step, step % cfg.rollout.num_clips + 1)
        reward = trainer.rewards([group])[0][0].double().cpu()
        evaluation = if_scores(evaluator, group.reward_frames(), group.clip_actions,
                               trans_thresholds=rw.trans_thresholds,
                               rot_threshold_deg=rw.rot_threshold_deg).double().cpu()
        dr = torch.sign(reward[:, None] - reward[None, :]).triu(1)
        de = torch.sign(evaluation[:, None] - evaluation[None, :]).triu(1)
        told_apart = (dr != 0) & (de != 0)
        pairs += int(told_apart.sum())
        same += int((told_apart & (dr == de)).sum())
        rewards.append(reward)
        evals.append(evaluation)
        spread += torch.tensor([reward.std().item(), evaluation.std().item()])
    corr = torch.corrcoef(torch.stack([torch.cat(rewards), torch.cat(evals)]))[0, 1].item()
    spread /= args.groups
    print(f"{args.groups} groups of {cfg.rollout.group_size} ({args.preset} preset, base model)")
    print(f"pairs both estimators tell apart, ordered alike: {same}/{pairs} = "
          f"{same / max(pairs, 1):.2f} (chance 0.50)")
    print(f"correlation of reward IF and evaluation IF over all candidates: {corr:.2f}")
    print(f"mean within-group std: reward IF {spread[0]:.3f}, evaluation IF {spread[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
