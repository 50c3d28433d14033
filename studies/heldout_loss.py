"""The flow-matching loss of exported world models on one fixed held-out batch.

    python -m studies.heldout_loss RUN/base_model.safetensors [MORE.safetensors ...] [--by-sigma]
                                   [--other-keys]

Every model sees the same 8 rendered sequences of 3 basic-key clips (world seed 777, which
pretraining never draws) and the same three noise draws, so the numbers compare models of any
size, patch or training batch (each run's own held-out batch has its run's batch size).
``--by-sigma`` also prints, at a few noise levels, the mean squared error of the one-step
clean-clip estimate ``x_t - sigma v`` (every clip at that sigma, over its clean history): how
sharp the sampler's last step can make a frame (with 10 steps at shift 5 it starts at sigma
0.357), beside the error of the noisy input itself. ``--other-keys`` prints the same numbers
with every sequence given the keys of the next one (rolled over the batch): how much the model
uses the command at all (a model that ignores the keys scores the same).
"""

from __future__ import annotations

import argparse
import sys

import torch

from wc_fast.models.pretrained import load_world_model
from wc_fast.pretrain import flow_matching_loss
from wc_fast.world import sample_sequences

SEED, SEQUENCES, CLIPS, DRAWS, SHIFT = 777, 8, 3, 3, 5.0
SIGMAS = (0.9, 0.6, 0.357, 0.1)


@torch.no_grad()
def x0_errors(model, frames: torch.Tensor, actions: torch.Tensor, sigma: float
              ) -> tuple[float, float]:
    """MSE of the one-step clean-clip estimate and of the noisy input, every clip of
    ``frames`` ``[B, 1 + N*F, C, H, W]`` noised at ``sigma`` (fixed noise draw)."""
    x0 = frames[:, 1:]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    x_t = (1 - sigma) * x0 + sigma * noise
    clips = x0.shape[1] // model.clip_frames
    v = model.teacher_forced_velocity(frames, actions, x_t,
                                      torch.full((x0.shape[0], clips), sigma),
                                      context_sigma=model.context_sigma)
    return ((x_t - sigma * v - x0).square().mean().item(),
            (x_t - x0).square().mean().item())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("weights", nargs="+", help="exported .safetensors (with .json card)")
    parser.add_argument("--by-sigma", action="store_true",
                        help="also the clean-clip estimate's error at a few noise levels")
    parser.add_argument("--other-keys", action="store_true",
                        help="also every number with each sequence given the next one's keys")
    args = parser.parse_args(argv)
    for path in args.weights:
        model = load_world_model(path)
        batch = sample_sequences(SEQUENCES, num_clips=CLIPS, seed=SEED, composite_fraction=0.0,
                                 clip_frames=model.clip_frames, resolution=model.clip_shape[-1])
        keys = {"": batch.actions}
        if args.other_keys:
            keys[" (other keys)"] = batch.actions.roll(1, 0)
        for label, actions in keys.items():
            with torch.no_grad():
                losses = [flow_matching_loss(model, batch.frames, actions, shift=SHIFT,
                                             gen=torch.Generator().manual_seed(k),
                                             motion_factors=batch.motion_factors).item()
                          for k in range(DRAWS)]
            print(f"{path}: held-out loss{label} {sum(losses) / DRAWS:.4f}")
            if args.by_sigma and not model.motion_latent:
                for sigma in SIGMAS:
                    est, noisy = x0_errors(model, batch.frames, actions, sigma)
                    print(f"  sigma {sigma}: clean-clip estimate MSE {est:.4f} (noisy input "
                          f"{noisy:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
