"""Whether a world model's exploration offsets point anywhere the IF reward rewards.

    python -m studies.offset_response [--base tiny|wan] [--checkpoint PATH] [--groups 24]
                                      [--sigma 0.25] [--json PATH]

The default recipe explores by adding a random offset to each candidate's movement-key
intensities (``rollout.action_exploration``) and lets the update distil the candidates that
followed the command. That can only work if (a) the model's camera moves with the offset and
(b) some offset direction raises the reward consistently across prompts. For ``--groups``
held-out two-key prompts, ``G = 8`` candidates of clip 1 each get a random offset of standard
deviation ``--sigma``, and five more get a fixed push ``a`` on the two pressed keys
(``a`` in ``BOOSTS``). Printed, from the reward estimator's reading of the frames:

- the mean IF under each push (does pressing the command's keys harder or softer help?);
- the correlation, over candidates, of the within-group standardised IF with the offset on the
  pressed translation key, the pressed rotation key, the keys opposite the pressed ones and the
  rest (b);
- the correlation of the offset along each axis (right, forward, yaw, pitch: key minus its
  opposite) with the motion the estimator reads along each axis, both centred per group (a);
- the action accuracy under fixed, structured offsets (``PUSHES``: the rotation key harder,
  the translation key softer, the strafe key that cancels the yaw's sideways image shift),
  ``PUSH_CANDIDATES`` each, by combination kind (two translation keys, two rotation keys, one
  of each): does any simple change of the command help where the random offsets cannot tell?
- how the offset-free candidates' frames are read, by combination kind: translation label
  right, rotation label right, and a commanded yaw read as a sideways step instead;
- the headroom in the sampler's noise alone: over ``group_size`` candidates without offsets,
  their mean accuracy against that of the candidate with the highest IF (what a perfect
  best-of-G distillation would reach).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from torch import Tensor

from wc_fast.actions import label_to_bits, split_action
from wc_fast.config import BASES, preset
from wc_fast.infra.runtime import generator
from wc_fast.models.clips import MOVEMENT_KEYS
from wc_fast.models.pretrained import load_checkpoint_model
from wc_fast.rewards import interaction_score, load_estimator
from wc_fast.rewards.interaction import action_accuracy, poses_to_labels
from wc_fast.rewards.motion_spread import camera_motion
from wc_fast.rewards.scoring import camera_poses
from wc_fast.rl.rollout import generate_history
from wc_fast.rl.sampler import ClipSampler
from wc_fast.world import sample_sequences

SEED = 920_000  # held out: no training or evaluation stream starts here
BOOSTS = (-0.25, 0.0, 0.25, 0.5, 0.75)
# each movement key's opposite (W-S, D-A, yaw right-left, pitch up-down)
OPPOSITE = (1, 0, 3, 2, 5, 4, 7, 6)
# the axes of camera_motion (x, z translation, yaw, pitch) and the keys that drive each
AXES = ("right", "forward", "yaw", "pitch")
AXIS_KEYS = ((2, 3), (0, 1), (4, 5), (6, 7))
OFFSET_GROUPS = ("pressed translation key", "pressed rotation key", "opposite keys",
                 "other keys")
# the strafe key whose image shift matches each yaw key's: yaw right -> A, yaw left -> D
COUNTER_STRAFE = {4: 3, 5: 2}
PUSH_CANDIDATES = 4
KINDS = ("two translation keys", "two rotation keys", "translation and rotation key")


def combination_kind(action: Tensor) -> str:
    """Which :data:`KINDS` a two-key action id is."""
    trans, rot = split_action(action)
    if int(rot) == 0:
        return KINDS[0]
    return KINDS[1] if int(trans) == 0 else KINDS[2]


def pushes(pressed: Tensor) -> dict[str, Tensor]:
    """Named structured offsets ``[8]`` for the pressed movement keys ``[8]``; the counter-strafe
    ones only where a yaw key is pressed."""
    translation, rotation = pressed.clone(), pressed.clone()
    translation[4:], rotation[:4] = 0, 0
    out = {"rotation key +0.5": 0.5 * rotation,
           "rotation key +1": rotation, "translation key -0.5": -0.5 * translation}
    counter = torch.zeros(8)
    for yaw, strafe in COUNTER_STRAFE.items():
        counter[strafe] = pressed[yaw]
    if counter.any():
        out |= {"counter-strafe +0.5": 0.5 * counter, "counter-strafe +1": counter}
    return out


def read_halves(c2w: Tensor, clip_actions: Tensor, thresholds: dict) -> dict[str, float]:
    """Of the frames of candidates ``c2w`` ``[n, F+1, 4, 4]`` commanded ``clip_actions``
    ``[F]``: the fraction whose translation label is right at some threshold, whose rotation
    label is right, and whose commanded yaw is read as a sideways step instead (no yaw bit, a
    sideways bit the command did not press: the failure a sideways step and a turn share)."""
    trans_gt, rot_gt = split_action(clip_actions)
    reads = [poses_to_labels(c2w, trans_threshold=t,
                             rot_threshold_deg=thresholds["rot_threshold_deg"])
             for t in thresholds["trans_thresholds"]]
    trans_right = torch.stack([trans == trans_gt for trans, _ in reads]).any(0)
    rot = reads[0][1]
    want_t, want_r = label_to_bits(trans_gt), label_to_bits(rot_gt)
    read_t, read_r = label_to_bits(reads[0][0]), label_to_bits(rot)
    yaw_wanted = want_r[..., :2].any(-1).expand(read_r.shape[:-1])
    yaw_as_step = yaw_wanted & ~(read_r[..., :2] & want_r[..., :2]).any(-1) & (
        read_t[..., 2:] & ~want_t[..., 2:]).any(-1)
    return {"translation_right": float(trans_right.float().mean()),
            "rotation_right": float((rot == rot_gt).float().mean()),
            "yaw_as_step": float(yaw_as_step.float().sum() / yaw_wanted.float().sum().clamp_min(1))
            if bool(yaw_wanted.any()) else float("nan")}


def pressed_movement_keys(action: Tensor) -> Tensor:
    """Movement keys ``[8]`` (W, S, D, A, yaw right, yaw left, pitch up, pitch down) of one
    action id, 1.0 where pressed."""
    trans, rot = split_action(action)
    return torch.cat([label_to_bits(trans), label_to_bits(rot)], dim=-1).float()


@torch.no_grad()
def measure(checkpoint: str | None, *, base: str = "tiny", groups: int, sigma: float,
            group_size: int = 8) -> dict:
    """Per group: the pressed keys, every candidate's offset ``[G + 5, 8]``, IF and mean
    per-frame motion ``[G + 5, 4]`` (the random offsets first, then the pushes); the
    combination kind, the mean accuracy under each structured push, and the IF and accuracy
    of ``G`` candidates without offsets."""
    cfg = preset("cpu")
    model = load_checkpoint_model(checkpoint, torch.device("cpu"), base=base)
    sampler = ClipSampler(model, steps=cfg.rollout.steps, shift=cfg.rollout.shift,
                          capture="eager")
    estimator = load_estimator("reward")
    thresholds = {"trans_thresholds": cfg.reward.trans_thresholds,
                  "rot_threshold_deg": cfg.reward.rot_threshold_deg}
    data = sample_sequences(groups, num_clips=1, seed=SEED, composite_fraction=1.0,
                            composite_keys=(2,))
    f = model.clip_frames
    out = []
    for g in range(groups):
        gen = generator(SEED, g, "offset_response")
        prompt, actions = data.frames[g:g + 1, :1], data.actions[g]
        _, _, cache = generate_history(model, sampler, prompt, actions, 0, gen)
        clip_actions = actions[:f]
        pressed = pressed_movement_keys(clip_actions[0])
        offsets = torch.cat([sigma * torch.randn(group_size, MOVEMENT_KEYS, generator=gen),
                             torch.stack([a * pressed for a in BOOSTS])])
        clips = sampler.sample(cache, clip_actions, num=offsets.shape[0], generator=gen,
                               offsets={"action_offset": offsets}).clips
        frames = torch.cat([prompt.expand(offsets.shape[0], -1, -1, -1, -1),
                            model.bound_frames(clips)], dim=1)
        c2w = camera_poses(estimator, frames)
        trans, rot = split_action(clip_actions)
        score = interaction_score(c2w.double(), trans, rot, **thresholds)
        # a second draw, after the first so that its candidates keep their noise: the
        # structured pushes, then group_size candidates without any offset
        named = pushes(pressed)
        fixed = torch.cat([*(v.expand(PUSH_CANDIDATES, -1) for v in named.values()),
                           torch.zeros(group_size, MOVEMENT_KEYS)])
        clips = sampler.sample(cache, clip_actions, num=fixed.shape[0], generator=gen,
                               offsets={"action_offset": fixed}).clips
        frames = torch.cat([prompt.expand(fixed.shape[0], -1, -1, -1, -1),
                            model.bound_frames(clips)], dim=1)
        fixed_c2w = camera_poses(estimator, frames).double()
        accuracy = action_accuracy(fixed_c2w, trans, rot, **thresholds)
        noise_if = interaction_score(fixed_c2w[-group_size:], trans, rot, **thresholds)
        pushed = accuracy[:-group_size].reshape(len(named), PUSH_CANDIDATES).mean(1)
        out.append({"pressed": pressed.tolist(), "offsets": offsets.tolist(),
                    "if": score.tolist(), "motion": camera_motion(c2w).mean(-2).tolist(),
                    "kind": combination_kind(clip_actions[0]),
                    "push_accuracy": dict(zip(named, pushed.tolist(), strict=True)),
                    "noise_if": noise_if.tolist(),
                    "noise_accuracy": accuracy[-group_size:].tolist(),
                    "noise_read": read_halves(fixed_c2w[-group_size:], clip_actions,
                                              thresholds)})
    return {"groups": out, "group_size": group_size, "sigma": sigma}


def _corr(a: Tensor, b: Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def summarize(result: dict) -> dict:
    """Mean IF per push, the advantage's correlation with each offset group, and the
    offset-axis by motion-axis correlation matrix (see the module docstring)."""
    g = result["group_size"]
    groups = result["groups"]
    boosts = torch.tensor([r["if"][g:] for r in groups]).mean(0)
    features, advantages, axis_offsets, motions = [], [], [], []
    for r in groups:
        pressed, offsets = torch.tensor(r["pressed"]), torch.tensor(r["offsets"][:g])
        reward, motion = torch.tensor(r["if"][:g]), torch.tensor(r["motion"][:g])
        opposite = pressed[list(OPPOSITE)]
        other = 1 - pressed - opposite
        translation, rotation = pressed.clone(), pressed.clone()
        translation[4:], rotation[:4] = 0, 0
        if reward.std() > 0:
            features.append(torch.stack([(offsets * translation).sum(1),
                                         (offsets * rotation).sum(1),
                                         (offsets * opposite).sum(1),
                                         (offsets * other).sum(1)], dim=1))
            advantages.append((reward - reward.mean()) / reward.std())
        along = torch.stack([offsets[:, i] - offsets[:, j] for i, j in AXIS_KEYS], dim=1)
        axis_offsets.append(along - along.mean(0))
        motions.append(motion - motion.mean(0))
    x, adv = torch.cat(features), torch.cat(advantages)
    offs, mot = torch.cat(axis_offsets), torch.cat(motions).float()
    return {**_push_and_noise(groups),
            "if_by_push": dict(zip(map(str, BOOSTS), boosts.tolist(), strict=True)),
            "advantage_correlation": {name: _corr(x[:, i], adv)
                                      for i, name in enumerate(OFFSET_GROUPS)},
            "candidates": int(adv.numel()),
            "offset_motion_correlation": [[_corr(offs[:, i], mot[:, j]) for j in range(4)]
                                          for i in range(4)]}


def _push_and_noise(groups: list[dict]) -> dict:
    """Mean accuracy under each structured push by combination kind (with the number of
    prompts behind it; ``none``: the offset-free candidates), and the noise headroom: the
    offset-free candidates' mean accuracy against that of the one with the highest IF in
    each group."""
    by_kind: dict[str, dict[str, list[float]]] = {}
    for r in groups:
        none = sum(r["noise_accuracy"]) / len(r["noise_accuracy"])
        for name, value in {"none": none, **r["push_accuracy"]}.items():
            by_kind.setdefault(r["kind"], {}).setdefault(name, []).append(value)
    accuracy = torch.tensor([r["noise_accuracy"] for r in groups])
    best = torch.tensor([r["noise_if"] for r in groups]).argmax(1, keepdim=True)
    reads: dict[str, dict[str, list[float]]] = {}
    for r in groups:
        for name, value in r["noise_read"].items():
            if not math.isnan(value):  # yaw_as_step where no yaw was commanded
                reads.setdefault(r["kind"], {}).setdefault(name, []).append(value)
    return {"read_by_kind": {kind: {name: sum(v) / len(v) for name, v in read.items()}
                             for kind, read in reads.items()},
            "accuracy_by_push": {kind: {name: {"accuracy": sum(v) / len(v), "prompts": len(v)}
                                        for name, v in pushed.items()}
                                 for kind, pushed in by_kind.items()},
            "noise_headroom": {"mean_accuracy": float(accuracy.mean()),
                               "best_if_accuracy": float(accuracy.gather(1, best).mean())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", choices=BASES, default="tiny")
    parser.add_argument("--checkpoint", default=None,
                        help="world model weights or checkpoint (default: the shipped base)")
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--sigma", type=float, default=0.25,
                        help="std of each candidate's random movement-key offsets")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.groups < 1 or args.sigma <= 0:
        parser.error("--groups must be >= 1 and --sigma > 0")
    torch.set_num_threads(2)
    result = measure(args.checkpoint, base=args.base, groups=args.groups, sigma=args.sigma)
    summary = summarize(result)
    pushes = "  ".join(f"{a}: {v:.3f}" for a, v in summary["if_by_push"].items())
    print(f"two-key IF by push on the pressed keys  {pushes}")
    print(f"correlation of the standardised IF with the offset on "
          f"({summary['candidates']} candidates):")
    for name, value in summary["advantage_correlation"].items():
        print(f"  {name:24s} {value:+.3f}")
    print("correlation of the offset along (row) with the motion along (column):")
    print("         " + "".join(f"{a:>9s}" for a in AXES))
    for axis, row in zip(AXES, summary["offset_motion_correlation"], strict=True):
        print(f"  {axis:7s}" + "".join(f"{v:+9.2f}" for v in row))
    print(f"action accuracy under fixed pushes ({PUSH_CANDIDATES} candidates per prompt):")
    for kind, pushed in summary["accuracy_by_push"].items():
        cells = "  ".join(f"{name} {v['accuracy']:.3f}" for name, v in pushed.items())
        print(f"  {kind} ({next(iter(pushed.values()))['prompts']} prompts): {cells}")
    print("offset-free candidates' frames: translation right, rotation right, commanded yaw "
          "read as a sideways step")
    for kind, read in summary["read_by_kind"].items():
        print(f"  {kind}: " + "  ".join(f"{v:.3f}" for v in read.values()))
    room = summary["noise_headroom"]
    print(f"noise alone, {result['group_size']} candidates: mean accuracy "
          f"{room['mean_accuracy']:.3f}, the highest-IF candidate's {room['best_if_accuracy']:.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**summary, "groups": args.groups,
                                               "sigma": args.sigma,
                                               "base": args.checkpoint or args.base},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
