"""The update-rule interface: what one RL update trains on and its loss (docs/design.md
section 4.4).

The trainer rolls out, scores and computes advantages the same way for every rule, then asks
its one :class:`Update` which candidates each group keeps, what rows they become and the loss
of a micro-batch of rows; it never asks which rule it holds. A rule sees the run through an
:class:`UpdateContext` (the models' velocity functions, the rank's groups, the schedule's
largest sigma), never the trainer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from wc_fast.config import Config
from wc_fast.models import ContextCache, WorldModel
from wc_fast.rl.ema import ema_decay
from wc_fast.rl.optim import frozen_copy
from wc_fast.rl.rollout import GroupRollout

# rows per micro-batch on a CPU when ``update.micro_batch`` is 0 (a GPU takes all rows at once)
CPU_MICRO_BATCH = 32


class MicroLoss(NamedTuple):
    """What :meth:`Update.micro_loss` returns for a micro-batch of ``n`` rows."""

    loss: Tensor  # the scalar to back-propagate
    flops: float  # spent on the forwards and backward
    kl: Tensor | None = None  # [n] each row's KL to the reference model, detached (with a KL)


class Items(Protocol):
    """One group's rows an update trains on: ``candidate[i]`` is the index into the group of
    the candidate row ``i`` comes from (``N`` rows)."""

    group: GroupRollout
    candidate: list[int]


# a world model's velocity: (x_t [N, F, C, H, W], sigma [N], actions, cache, motion=...) -> v
Velocity = Callable[..., Tensor]


@dataclass(frozen=True, slots=True)
class UpdateContext:
    """What an update rule is given of the run: the velocity functions by role (compiled with
    ``update.compile``), the cost of one, this rank's groups and the sampler's schedule. Built
    once by the trainer."""

    device: torch.device
    velocity: Velocity  # the current model's, with gradient
    old_velocity: Velocity  # the old (rollout) model's
    ref_velocity: Velocity | None  # the frozen initial model's, with a KL; else None
    velocity_flops: Callable[[int, int], float]  # (rows, history tokens) -> FLOPs of a forward
    sigma_max: float  # the largest sigma the sampler steps from (its schedule's second)
    group_ids: tuple[int, ...]  # global indices of this rank's groups
    exploring: bool  # whether rollouts explore in camera motion (rollout.*_exploration)


class Update(ABC):
    """One update rule: items from a group, their micro-batch loss, and the old model's EMA.
    Every method that needs the run's models or groups takes an :class:`UpdateContext`."""

    loss_title = "loss"  # how plots name the rule's loss (metrics.jsonl logs it as "loss")

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @property
    def kl_beta(self) -> float:
        """Weight of the loss's KL to the frozen initial model (0: none, no reference kept)."""
        return 0.0

    def reference(self, model: WorldModel,
                  copy: Callable[[WorldModel], WorldModel] = frozen_copy) -> WorldModel | None:
        """The KL's reference, ``copy(model)`` of the initial ``model`` made before training
        (by default :func:`~wc_fast.rl.optim.frozen_copy`: the trained weights copied, the rest
        shared; the trainer passes its own copy, which under FSDP2 is built on the meta
        device and sharded; a resumed run rebuilds it from the init), or ``None`` without a
        KL."""
        if self.kl_beta <= 0:
            return None
        return copy(model)

    @abstractmethod
    def rollout_fn(self) -> Callable[..., GroupRollout]:
        """The rollout of one group (``wc_fast.rl.rollout``), called as ``fn(old, sampler,
        prompt, actions, clip_index, group_size, generator, explore=...)``."""

    @abstractmethod
    def kept(self, ctx: UpdateContext, step: int, adv: Tensor) -> Tensor:
        """The candidates each of the rank's groups trains on ``[B, K]``, from the combined
        advantages ``adv`` ``[B, G]``."""

    @abstractmethod
    def items(self, ctx: UpdateContext, step: int, gid: int, group: GroupRollout, r: Tensor,
              adv: Tensor, chosen: Tensor) -> Items:
        """What the ``chosen`` candidates ``[K']`` of global group ``gid`` are trained on;
        ``r`` optimality and ``adv`` advantage ``[G]``."""

    @abstractmethod
    def micro_loss(self, ctx: UpdateContext, item: Items, part: Tensor, actions: Tensor,
                   cache: ContextCache, frozen: dict[str, ContextCache], scale: float
                   ) -> MicroLoss:
        """The loss of rows ``part`` of ``item`` (its share of the step's mean: weighted by
        ``scale`` = 1 / rows of the step), its FLOPs and, with a KL, each row's KL.
        ``cache``: the current model's history cache; ``frozen``: the frozen models' caches of
        the same history by role, ``"old"`` and, with a reference model, ``"ref"``."""

    def ema_decay(self, step: int, schedule_steps: int) -> float:
        """The old model's EMA decay at iteration ``step`` of a schedule over
        ``schedule_steps`` (``ema.*``)."""
        em = self.cfg.ema
        return ema_decay(step, schedule_steps, start=em.start, end=em.end, schedule=em.schedule)
