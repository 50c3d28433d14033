"""The flow-matching loss of exported world models on one fixed held-out batch.

    python bench/heldout_loss.py RUN/base_model.safetensors [MORE.safetensors ...]

Every model sees the same 8 rendered sequences of 3 basic-key clips (world seed 777, which
pretraining never draws) and the same three noise draws, so the numbers compare models of any
size, patch or training batch (each run's own held-out batch has its run's batch size).
"""

from __future__ import annotations

import argparse
import sys

import torch

from wc_fast.models.pretrained import load_world_model
from wc_fast.pretrain import flow_matching_loss
from wc_fast.world import sample_sequences

SEED, SEQUENCES, CLIPS, DRAWS, SHIFT = 777, 8, 3, 3, 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("weights", nargs="+", help="exported .safetensors (with .json card)")
    args = parser.parse_args(argv)
    for path in args.weights:
        model = load_world_model(path)
        batch = sample_sequences(SEQUENCES, num_clips=CLIPS, seed=SEED, composite_fraction=0.0,
                                 clip_frames=model.clip_frames, resolution=model.clip_shape[-1])
        with torch.no_grad():
            losses = [flow_matching_loss(model, batch.frames, batch.actions, shift=SHIFT,
                                         gen=torch.Generator().manual_seed(k),
                                         motion_factors=batch.motion_factors).item()
                      for k in range(DRAWS)]
        print(f"{path}: held-out loss {sum(losses) / DRAWS:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
