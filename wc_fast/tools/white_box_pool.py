"""Generated clip-1 frames labelled by the white-box reader: training data for a camera reader
that has seen a world model's frames, not only true renders.

A world model (the shipped base or a checkpoint) generates clip 1 of sequences drawn from the
evaluation's prompt distributions (:data:`wc_fast.eval.KINDS`: basic, composite, two keys) as
the evaluation and ``studies/white_box.py`` generate it (:func:`wc_fast.eval.generate_clip1`),
and each clip's camera path is read from the model's own predicted flow against the prompt's
true depth (:func:`wc_fast.rewards.flow_reader.read_path`). The label is what the model's
geometry did, not what was commanded, so a reader trained on it learns to read generated
frames without learning to reward the command.

The sequences come from :data:`POOL_SEED` (set ``k`` of :data:`~wc_fast.eval.KINDS` from
``POOL_SEED + k``), a seed range apart from the evaluation's tuning, validation and final
seeds (:data:`wc_fast.eval.SEED_SETS`, each also taken ``+ k``) and from the other reward-model
streams (``wc_fast.tools.train_reward_models``, ``wc_fast.tools.evaluate_reward_models``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from wc_fast.config import preset
from wc_fast.eval import KINDS, EvalSettings, generate_clip1
from wc_fast.models.pretrained import load_checkpoint_model
from wc_fast.rewards.flow_reader import read_path
from wc_fast.world import sample_sequences, sequence_scenes
from wc_fast.world.render import depth as render_depth

POOL_SEED = 4_400_001  # set k's sequences are drawn from POOL_SEED + k


@dataclass(slots=True)
class Pool:
    """Generated clips ``frames`` ``[n, F+1, C, H, W]`` (the true prompt first) and their
    white-box camera paths ``c2w`` ``[n, F+1, 4, 4]`` (float64, the prompt's pose the
    identity); ``seeds`` the data seed of each evaluation set drawn (``{set: seed}``) and
    ``source`` the world model (``"base"`` or its path)."""

    frames: Tensor
    c2w: Tensor
    seeds: dict[str, int]
    source: str


def set_sizes(sequences: int) -> dict[str, int]:
    """Sequences per evaluation set: ``sequences`` split as evenly as possible, the first sets
    taking the remainder; sets of no sequence are left out."""
    base, extra = divmod(sequences, len(KINDS))
    sizes = {kind: base + (k < extra) for k, kind in enumerate(KINDS)}
    return {kind: n for kind, n in sizes.items() if n > 0}


def white_box_pool(sequences: int, *, seed: int = POOL_SEED,
                   checkpoint: str | Path | None = None, settings: EvalSettings | None = None
                   ) -> Pool:
    """``sequences`` generated clip-1 clips (:func:`set_sizes` of each evaluation set) of the
    world model ``checkpoint`` (the shipped base when None; as ``python -m wc_fast.eval
    --checkpoint`` takes it), each labelled by :func:`read_path` of its predicted flow against
    the prompt's true depth. The sampler's steps and shift are ``settings``' (default: the cpu
    preset's, as the evaluation's). Deterministic for a ``seed``."""
    if sequences < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences}")
    model = load_checkpoint_model(checkpoint, torch.device("cpu"))
    cfg = model.cfg
    if settings is None:
        settings = EvalSettings.from_config(preset("cpu"))
    frames, paths, seeds = [], [], {}
    for k, (kind, (fraction, keys)) in enumerate(KINDS.items()):
        n = set_sizes(sequences).get(kind, 0)
        if n == 0:
            continue
        seeds[kind] = seed + k
        data = sample_sequences(n, num_clips=1, seed=seed + k, composite_fraction=fraction,
                                composite_keys=keys, clip_frames=cfg.clip_frames,
                                resolution=cfg.resolution)
        scenes, _ = sequence_scenes(seed + k, n)
        depth = render_depth(scenes, data.c2w[:, :1].double(), resolution=cfg.resolution)[:, 0]
        gen = generate_clip1(model, data.frames[:, :1], data.actions, settings=settings,
                             seed=seed + k)
        frames.append(gen["frames"])
        paths.append(read_path(gen["flow"].double(), depth))
    return Pool(frames=torch.cat(frames), c2w=torch.cat(paths), seeds=seeds,
                source="base" if checkpoint is None else str(checkpoint))
