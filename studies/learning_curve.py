"""Held-out learning curve of RL on the embedded world: does training on fresh prompts raise
the action following of prompts it never saw?

    python -m studies.learning_curve [--iters 120] [--every 30] [--fixed N] [--out FILE]
                                   [section.field=value ...]

The ``cpu`` preset trains on clip 1 of fresh two-key prompts (``rollout.num_clips=1``,
``rollout.composite_fraction=1``, eager train phase) unless overridden; every ``--every``
iterations the current model generates 8 candidates (ODE sampler, fixed noises) of clip 1 for
``--eval-n`` held-out two-key prompts and as many basic ones, and the evaluation estimator
scores their full-action accuracy (the eval's metric; ``*_accR`` and ``*_ifR`` are the reward
estimator's accuracy and IF). ``--fixed N`` trains on N fixed prompts instead of fresh ones.
Results: docs/experiment_log.md.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from safetensors.torch import save_file

import wc_fast.rl.trainer as trainer_module
from wc_fast.actions import split_action
from wc_fast.config import apply_override, preset
from wc_fast.infra.runtime import generator
from wc_fast.models.pretrained import initial_model
from wc_fast.rewards import load_estimator
from wc_fast.rewards.interaction import action_accuracy, interaction_score
from wc_fast.rl.rollout import rollout_clip_level
from wc_fast.rl.trainer import Trainer
from wc_fast.world import sample_sequences

HELD_OUT_SEED = 777_000
FIXED_SEED = 31_337


def held_out_scores(trainer: Trainer, sets: dict, estimator) -> dict[str, float]:
    """Mean accuracy (evaluation estimator) and accuracy / IF (reward estimator) of each set."""
    cfg = trainer.cfg
    kw = {"trans_thresholds": cfg.reward.trans_thresholds,
          "rot_threshold_deg": cfg.reward.rot_threshold_deg}
    model = trainer.model.eval()
    sampler_model, trainer.sampler.model = trainer.sampler.model, model
    out = {}
    try:
        for name, data in sets.items():
            acc, acc_r, if_r = [], [], []
            for i in range(data.frames.shape[0]):
                group = rollout_clip_level(model, trainer.sampler, data.frames[i:i + 1, :1],
                                           data.actions[i], 1, 8, generator(4242, i))
                frames = group.reward_frames()
                trans, rot = split_action(group.clip_actions)
                with torch.no_grad():
                    c2w = estimator(frames).double()
                    c2w_r = trainer.reward.models.estimator(frames).double()
                acc.append(action_accuracy(c2w, trans, rot, **kw).mean())
                acc_r.append(action_accuracy(c2w_r, trans, rot, **kw).mean())
                if_r.append(interaction_score(c2w_r, trans, rot, **kw).mean())
            for suffix, values in (("", acc), ("_accR", acc_r), ("_ifR", if_r)):
                out[name + suffix] = round(float(torch.stack(values).mean()), 4)
    finally:
        trainer.sampler.model = sampler_model
        model.train()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=120)
    p.add_argument("--every", type=int, default=30)
    p.add_argument("--fixed", type=int, default=0, help="train on this many fixed prompts")
    p.add_argument("--eval-n", type=int, default=32, help="held-out prompts per set")
    p.add_argument("--out", default="", help="write the curve here (JSON)")
    p.add_argument("--save", default="", help="write the final weights here (.safetensors)")
    p.add_argument("overrides", nargs="*", help="section.field=value")
    args = p.parse_args()
    cfg = preset("cpu")
    cfg.rollout.num_clips = 1
    cfg.rollout.composite_fraction = 1.0
    cfg.update.compile = False
    for item in args.overrides:
        key, value = item.split("=", 1)
        apply_override(cfg, key, value)
    torch.manual_seed(0)
    trainer = Trainer(cfg, initial_model(cfg, torch.device("cpu")), torch.device("cpu"))
    sets = {name: sample_sequences(args.eval_n, num_clips=1, seed=HELD_OUT_SEED + i,
                                   composite_fraction=fraction, composite_keys=(2,))
            for i, (name, fraction) in enumerate((("two", 1.0), ("basic", 0.0)))}
    if args.fixed:
        fixed = sample_sequences(args.fixed, num_clips=1, seed=FIXED_SEED,
                                 composite_fraction=1.0, composite_keys=(2,))

        def fixed_prompt(cfg_, step, group, device):
            i = (step * cfg_.rollout.groups_per_rank + group) % args.fixed
            return fixed.frames[i:i + 1, :1].to(device), fixed.actions[i].to(device)

        trainer_module.group_prompt = fixed_prompt
    estimator = load_estimator("eval")
    start = time.perf_counter()
    curve = [{"it": 0, **held_out_scores(trainer, sets, estimator)}]
    print(curve[-1], flush=True)
    for step in range(args.iters):
        stats = trainer.iteration(step)
        if (step + 1) % args.every == 0:
            curve.append({"it": step + 1, "t": round(time.perf_counter() - start),
                          "train_if": stats.if_mean,
                          **held_out_scores(trainer, sets, estimator)})
            print(curve[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "curve": curve}, f, indent=1)
    if args.save:
        save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, args.save)


if __name__ == "__main__":
    main()
