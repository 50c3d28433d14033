"""The update-rule interface: what one RL update trains on and its loss (docs/design.md
section 4.4).

The trainer rolls out, scores and computes advantages the same way for every rule, then asks
its one :class:`Update` which candidates each group keeps, what rows they become, which
frozen model's cache the loss compares against, and the loss of a micro-batch of rows; it
never asks which rule it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from wc_fast.config import Config
from wc_fast.ema import ema_decay
from wc_fast.models import ContextCache, WorldModel
from wc_fast.rollout import GroupRollout

if TYPE_CHECKING:
    from wc_fast.trainer import Trainer

# rows per micro-batch on a CPU when ``nft.micro_batch`` is 0 (a GPU takes all rows at once)
CPU_MICRO_BATCH = 32


class Items(Protocol):
    """One group's rows an update trains on: ``candidate[i]`` is the index into the group of
    the candidate row ``i`` comes from (``N`` rows)."""

    group: GroupRollout
    candidate: list[int]


class Update(ABC):
    """One update rule: items from a group, their micro-batch loss, and the old model's EMA.

    Every method that needs the models, the sampler or the velocity functions takes the
    :class:`~wc_fast.trainer.Trainer` holding them.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def reference(self, model: WorldModel) -> WorldModel | None:
        """A frozen model the loss compares against besides the old one (built from the
        initial ``model`` before training; sharded and compiled with the others), or
        ``None``."""
        return None

    @abstractmethod
    def rollout_fn(self) -> Callable[..., GroupRollout]:
        """The rollout of one group (``wc_fast.rollout``), called as ``fn(old, sampler,
        prompt, actions, clip_index, group_size, generator, explore=...)``."""

    @abstractmethod
    def kept(self, trainer: Trainer, step: int, adv: Tensor) -> Tensor:
        """The candidates each of the rank's groups trains on ``[B, K]``, from the combined
        advantages ``adv`` ``[B, G]``."""

    @abstractmethod
    def items(self, trainer: Trainer, step: int, gid: int, group: GroupRollout, r: Tensor,
              adv: Tensor, chosen: Tensor) -> Items:
        """What the ``chosen`` candidates ``[K']`` of global group ``gid`` are trained on;
        ``r`` optimality and ``adv`` advantage ``[G]``."""

    def frozen_cache(self, trainer: Trainer, group: GroupRollout, row: int,
                     old_cache: ContextCache) -> tuple[ContextCache | None, float]:
        """The history cache of history ``row`` that :meth:`micro_loss` gets as ``frozen``
        and the FLOPs spent building it; the old model's own ``old_cache`` by default."""
        return old_cache, 0.0

    @abstractmethod
    def micro_loss(self, trainer: Trainer, item: Items, part: Tensor, actions: Tensor,
                   cache: ContextCache, frozen: ContextCache | None, scale: float
                   ) -> tuple[Tensor, float]:
        """The loss of rows ``part`` of ``item`` (its share of the step's mean: weighted by
        ``scale`` = 1 / rows of the step), to back-propagate, and its FLOPs. ``cache``: the
        current model's history cache, ``frozen``: :meth:`frozen_cache`'s."""

    def ema_decay(self, step: int, schedule_steps: int) -> float:
        """The old model's EMA decay at iteration ``step`` of a schedule over
        ``schedule_steps`` (``ema.*``)."""
        em = self.cfg.ema
        return ema_decay(step, schedule_steps, start=em.start, end=em.end, schedule=em.schedule)
