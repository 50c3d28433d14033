"""Resuming at another world size: the global batch stays, the groups per rank follow.

An iteration rolls out ``rollout.groups_per_rank x world size`` groups, numbered globally
(rank ``r`` holds groups ``r*b .. r*b+b-1``), and every random draw depends only on the seed,
the iteration and the global group (:mod:`wc_fast.rl.trainer`). So a run saved at 2 ranks of
1 group resumes at 1 rank of 2 groups (or the reverse) over the same groups and the same
noise; only the order of floating-point sums differs (gradients summed over ranks, then over a
rank's groups).
"""

from __future__ import annotations

import warnings

from wc_fast import config as config_lib
from wc_fast.infra.checkpoint import ConfigMismatchError

FIELD = "rollout.groups_per_rank"


def global_batch(saved_config: dict, world_size: int) -> int:
    """Groups per iteration of a run with ``saved_config`` (a config dict) at ``world_size``."""
    return int(saved_config["rollout"]["groups_per_rank"]) * world_size


def follow_world_size(cfg: config_lib.Config, saved_config: dict, saved_world: int | None,
                      world_size: int, where: str) -> None:
    """Make ``cfg`` resume checkpoint ``where`` (written with ``saved_config`` at
    ``saved_world`` ranks, ``None`` if it did not record them) at ``world_size`` ranks with
    the checkpoint's global batch: ``groups_per_rank`` becomes that batch over the new world
    size, with a warning, when the command line left it at the checkpoint's value.
    :class:`ConfigMismatchError` when the batch does not split evenly, or ``groups_per_rank``
    was set to another global batch."""
    saved_per_rank = int(saved_config["rollout"]["groups_per_rank"])
    per_rank = cfg.rollout.groups_per_rank
    if saved_world is None:  # an older checkpoint: the world size is unknown, keep the field
        if per_rank != saved_per_rank:
            raise ConfigMismatchError(f"checkpoint {where} was written with another config "
                                      f"(checkpoint -> now): {FIELD}: {saved_per_rank} -> "
                                      f"{per_rank}")
        return
    total = saved_per_rank * saved_world
    if per_rank * world_size == total:
        return
    if per_rank != saved_per_rank or total % world_size:
        raise ConfigMismatchError(
            f"checkpoint {where} was written at {saved_world} rank(s) x {saved_per_rank} "
            f"group(s) = {total} groups per iteration; resuming at {world_size} rank(s) needs "
            f"{FIELD} x ranks = {total} ({FIELD} is {per_rank})")
    cfg.rollout.groups_per_rank = total // world_size
    config_lib.validate(cfg)
    warnings.warn(f"resuming checkpoint {where} of {saved_world} rank(s) at {world_size}: "
                  f"{FIELD} {saved_per_rank} -> {cfg.rollout.groups_per_rank}, keeping "
                  f"{total} groups per iteration", stacklevel=2)
