"""Where a world model fails on two-key (or single-key) commands: accuracy and per-label
errors by kind of command, on clip 1 of the held-out prompts of ``studies/learning_curve.py``.

    python -m studies.two_key_errors [--base tiny|wan] [--weights W.safetensors] [--keys 2]
                                   [--n 32] [--candidates 8] [--latent-scale S]
                                   [--key-scale T,R]

Kinds: TR (one translation and one rotation key), RR (two rotations), TT (two translations);
with ``--keys 1``, T (one translation key) and R (one rotation key).
Per kind: full-action accuracy, its best candidate's (what selection could reach in one
round), how often each label is right, and the estimated per-frame translation norm
``t_norm`` and rotation (degrees), with the same numbers for the ground-truth renders, all
read by the evaluation estimator: a model that moves too little reads a smaller ``t_norm`` or
rotation than the truth. ``--base``: the shipped base world model; ``--weights``: a state dict
of that model (default: the shipped weights). Two probes of what the model can be made to do
on clip 1 (whose only history frame is the prompt, which neither touches), on the tiny model
only: ``--latent-scale S`` reads every candidate's motion latents at S times their value (the
motion embedding's weight scaled: wider speeds, turn rates and onsets than pretraining drew);
``--key-scale T,R`` scales the embeddings of the translation and the rotation keys. Results:
docs/experiment_log.md.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from safetensors.torch import load_file

from wc_fast.actions import label_to_bits, split_action
from wc_fast.config import BASES, preset
from wc_fast.infra.runtime import generator
from wc_fast.models.pretrained import load_base_model
from wc_fast.rewards import load_estimator
from wc_fast.rewards.interaction import poses_to_labels, relative_motion, rotation_angles
from wc_fast.rl.rollout import rollout_clip_level
from wc_fast.rl.sampler import ClipSampler
from wc_fast.world import sample_sequences

HELD_OUT_SEED = 777_000  # the two-key set of studies/learning_curve.py
# keys pressed -> translation keys pressed -> kind
KINDS = {2: {2: "TT", 1: "TR", 0: "RR"}, 1: {1: "T", 0: "R"}}


def frame_stats(c2w: torch.Tensor, actions: torch.Tensor, cfg) -> dict[str, torch.Tensor]:
    """Per-candidate numbers ``[n]`` of poses ``[n, F+1, 4, 4]`` against commands ``[F]``."""
    trans_gt, rot_gt = split_action(actions)
    trans, rot = poses_to_labels(c2w, trans_threshold=min(cfg.reward.trans_thresholds),
                                 rot_threshold_deg=cfg.reward.rot_threshold_deg)
    t_ok, r_ok = (trans == trans_gt).double(), (rot == rot_gt).double()
    rel = relative_motion(c2w)
    pitch, yaw = rotation_angles(rel)
    return {"accuracy": (t_ok * r_ok).mean(-1), "translation_ok": t_ok.mean(-1),
            "rotation_ok": r_ok.mean(-1), "t_norm": rel[..., :3, 3].norm(dim=-1).mean(-1),
            "rotation_deg": torch.hypot(pitch, yaw).mean(-1)}


@torch.no_grad()
def scale_conditioning(model, latent: float, translation: float, rotation: float) -> None:
    """Scale the motion embedding's weight and the key embedding's translation (columns 0-3)
    and rotation (4-7) columns in place; the prompt frame's column 8 is left as it is."""
    model.motion_embed.weight.mul_(latent)
    model.key_embed.weight[:, :4].mul_(translation)
    model.key_embed.weight[:, 4:8].mul_(rotation)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", choices=BASES, default="tiny", help="shipped base world model")
    p.add_argument("--weights", default="", help="state dict of that model (.safetensors)")
    p.add_argument("--keys", type=int, choices=(1, 2), default=2, help="keys per command")
    p.add_argument("--n", type=int, default=32, help="held-out prompts")
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--latent-scale", type=float, default=1.0,
                   help="scale of the motion latents the model reads")
    p.add_argument("--key-scale", default="1,1",
                   help="scales of the translation and rotation key embeddings")
    args = p.parse_args(argv)
    cfg = preset("cpu")
    model = load_base_model(args.base).eval()
    if args.weights:
        model.load_state_dict(load_file(args.weights))
    if (args.latent_scale, args.key_scale) != (1.0, "1,1"):
        if args.base != "tiny":
            p.error("--latent-scale and --key-scale probe the tiny model's embeddings")
        scale_conditioning(model, args.latent_scale, *map(float, args.key_scale.split(",")))
    sampler = ClipSampler(model, steps=cfg.rollout.steps, shift=cfg.rollout.shift,
                          capture="eager")
    estimator = load_estimator("eval")
    data = sample_sequences(args.n, num_clips=1, seed=HELD_OUT_SEED,
                            composite_fraction=1.0 if args.keys == 2 else 0.0,
                            composite_keys=(2,), clip_frames=model.clip_frames,
                            resolution=model.clip_shape[-1])
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i in range(args.n):
        actions = data.actions[i]
        kind = KINDS[args.keys][int(label_to_bits(split_action(actions[:1])[0]).sum())]
        group = rollout_clip_level(model, sampler, data.frames[i:i + 1, :1], actions, 1,
                                   args.candidates, generator(4242, i))
        with torch.no_grad():
            made = frame_stats(estimator(group.reward_frames()).double(), actions, cfg)
            truth = frame_stats(estimator(data.frames[i:i + 1]).double(), actions, cfg)
        rows[kind]["prompts"].append(1.0)
        for key, value in made.items():
            rows[kind][key].append(float(value.mean()))
        rows[kind]["best accuracy"].append(float(made["accuracy"].max()))
        for key in ("accuracy", "t_norm", "rotation_deg"):
            rows[kind][f"truth {key}"].append(float(truth[key].mean()))
    columns = ["accuracy", "best accuracy", "translation_ok", "rotation_ok", "t_norm",
               "rotation_deg", "truth accuracy", "truth t_norm", "truth rotation_deg"]
    print("| kind | prompts | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    for kind in KINDS[args.keys].values():
        if kind in rows:
            r = rows[kind]
            cells = [f"{sum(r[c]) / len(r[c]):.3f}" for c in columns]
            print(f"| {kind} | {len(r['prompts'])} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
