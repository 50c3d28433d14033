"""How far the IF reward agrees with the evaluation, inside the groups the trainer ranks.

    python -m studies.reward_agreement --preset cpu --groups 30

Rolls out the trainer's groups with the base model (G candidates sharing a history and a
command, clip indices cycling as in training) and scores every candidate with the reward
estimator (the IF reward) and with the evaluation estimator. Prints, over all candidate pairs
of a group that both estimators tell apart, how often they order the pair the same way (0.5 is
chance), the correlation of the two scores over all candidates, and each score's mean
within-group spread. The NFT update can only climb what the reward ranks correctly.

The same numbers for the evaluation estimator against itself on the mirrored clips (frames
flipped left-right, its poses mirrored back) give the noise floor of the reading itself: how
far any estimator's verdict on a generated clip is a property of the clip.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import Tensor

from wc_fast import config as config_lib
from wc_fast.infra.runtime import resolve_device
from wc_fast.models.pretrained import initial_model
from wc_fast.rewards import if_scores, load_estimator
from wc_fast.rl.trainer import Trainer


class Mirrored:
    """An estimator read on the left-right mirrored clip, its poses mirrored back.

    Flipping the image columns mirrors the camera's x axis, so poses map as ``S @ c2w @ S``
    with ``S = diag(-1, 1, 1, 1)``: a yaw right seen in the mirror is read back as a yaw right.
    """

    def __init__(self, estimator) -> None:
        self.estimator = estimator

    def __call__(self, frames: Tensor) -> Tensor:
        c2w = self.estimator(frames.flip(-1))
        s = torch.diag(c2w.new_tensor([-1.0, 1.0, 1.0, 1.0]))
        return s @ c2w @ s


def agreement(a: list[Tensor], b: list[Tensor]) -> tuple[int, int, float, float, float]:
    """Over groups of scores ``a`` and ``b`` (one ``[G]`` tensor per group): pairs both tell
    apart, of which ordered alike; correlation over all candidates; mean within-group stds."""
    same = pairs = 0
    for x, y in zip(a, b, strict=True):
        dx = torch.sign(x[:, None] - x[None, :]).triu(1)
        dy = torch.sign(y[:, None] - y[None, :]).triu(1)
        told_apart = (dx != 0) & (dy != 0)
        pairs += int(told_apart.sum())
        same += int((told_apart & (dx == dy)).sum())
    corr = torch.corrcoef(torch.stack([torch.cat(a), torch.cat(b)]))[0, 1].item()
    return same, pairs, corr, torch.stack([x.std() for x in a]).mean().item(), \
        torch.stack([y.std() for y in b]).mean().item()


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
    scores: dict[str, list[Tensor]] = {"reward": [], "evaluation": [], "mirrored": []}
    readers = {"evaluation": evaluator, "mirrored": Mirrored(evaluator)}
    step = 0
    while len(scores["reward"]) < args.groups:
        groups = trainer.rollout(step, step % cfg.rollout.num_clips + 1)[:args.groups
                                                                         - len(scores["reward"])]
        scores["reward"] += list(trainer.rewards(groups)[0].double().cpu())
        step += 1
        for group in groups:
            for name, reader in readers.items():
                scores[name].append(if_scores(
                    reader, group.reward_frames(), group.clip_actions,
                    trans_thresholds=rw.trans_thresholds,
                    rot_threshold_deg=rw.rot_threshold_deg).double().cpu())
    print(f"{args.groups} groups of {cfg.rollout.group_size} ({args.preset} preset, base model)")
    for a, b in (("reward", "evaluation"), ("mirrored", "evaluation")):
        same, pairs, corr, std_a, std_b = agreement(scores[a], scores[b])
        print(f"{a} IF vs {b} IF: pairs both tell apart ordered alike {same}/{pairs} = "
              f"{same / max(pairs, 1):.2f} (chance 0.50); correlation over all candidates "
              f"{corr:.2f}; mean within-group std {std_a:.3f} / {std_b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
