"""One WorldCompass RL iteration (docs/design.md section 4), the state it needs, and its metrics.

Per iteration ``k``: target clip ``n = k mod N + 1``; for each group (world prompt + action
sequence) the old model rolls out ``G`` candidates of clip ``n`` over one shared history;
IF and VQ rewards; group advantages and optimality ``r``; the top-k and bottom-k candidates are
noised at ``ceil(frac * T)`` schedule sigmas each; the current and old models predict their
velocities in micro-batches over the shared history; the fused ``nft_loss``; Muon + AdamW;
EMA of the old model. Groups are split across ranks by a global group index, so every random
draw (prompts, rollout noise, sigma picks, flow noise) depends only on
``(seed, iteration, global group)`` and any rank layout computes the same update.

The update rule (which candidates a group keeps, the rows they become, their micro-batch loss,
the old model's EMA) is one :class:`wc_fast.rl.updates.Update` chosen from ``train.update``: NFT
as above, or Flow-GRPO (``flow_grpo``: SDE rollouts with recorded steps and the PPO-clipped
``grpo_sde_loss``, docs/design.md section 4.1); the trainer runs either over the same shared
history and micro-batches without asking which (section 4.4).

World-R1's options (docs/design.md section 4.2): periodic decoupled iterations
(``reward.decouple_every``) train on VQ alone over high-motion prompts, and
``rollout.noise_warp`` samples from noise warped along the commanded camera motion.
``rollout.action_exploration`` (any backbone: a random change of each candidate's pressed
keys) and ``rollout.warp_exploration`` (the embedded model's warp head) impose a random camera
motion on each candidate of a group, so that candidates differ in how they move
(docs/design.md section 4.3).
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from wc_fast.actions import is_composite, num_primitives
from wc_fast.config import Config, RewardConfig
from wc_fast.infra import checkpoint
from wc_fast.infra.distributed import (
    full_state_dict,
    load_full_state_dict,
    shard_frozen_copy,
    shard_model,
)
from wc_fast.infra.runtime import compile_unavailable, generator, stream_seed
from wc_fast.models import ContextCache, FrameCodec, PixelFrames, WorldModel
from wc_fast.models.protocol import check_world_model
from wc_fast.models.tiny.dit import DTYPES
from wc_fast.rewards import RewardModels
from wc_fast.rewards import build as build_reward
from wc_fast.rewards.motion_spread import (
    camera_motion,
    commanded_directions,
    estimator_motion_error,
    motion_spread,
)
from wc_fast.rl.advantages import optimality
from wc_fast.rl.ema import ema_update
from wc_fast.rl.optim import (
    build_optimizers,
    freeze_untrained,
    hold_frozen_matrices_in,
    policy_copies,
)
from wc_fast.rl.rollout import NO_EXPLORATION, GroupRollout, MotionExploration
from wc_fast.rl.sampler import ClipSampler
from wc_fast.rl.updates import CPU_MICRO_BATCH, Items, Update, UpdateContext, build_update
from wc_fast.world import sample_sequences

# redraws of a decoupled iteration's prompt before giving up (with the validated filter a
# draw is rejected only for a rare forced no-op, wc_fast.world.trajectory)
HIGH_MOTION_DRAWS = 100


@dataclass(slots=True)
class IterationStats:
    """What one iteration measured (one row of ``metrics.jsonl``)."""

    step: int
    clip_index: int
    if_mean: float
    vq_mean: float
    r_std: float
    loss: float | None
    skipped_groups: int
    ema_decay: float
    skipped_updates: int = 0
    times: dict[str, float] = field(default_factory=dict)
    clips_per_s: float = 0.0
    train_flops: float = 0.0
    motion_spread: dict[str, float] = field(default_factory=dict)
    decoupled: bool = False
    kl: float | None = None  # the mean KL to the reference model per trained row (with one)
    # label IF by the reward's reader minus by the classical fit (train.reader_gap_every)
    reader_gap: float | None = None


@dataclass(slots=True)
class UpdateStats:
    """What :meth:`Trainer.update` measured over an iteration's updates."""

    loss: float | None  # mean loss of the updates made; None when every one was skipped
    skipped_groups: int  # groups whose advantages were all zero
    flops: float
    skipped_updates: int  # for a NaN or inf loss or gradient, or by the guarded step
    kl: float | None  # mean KL to the reference model per trained row (None without one)


def decoupled(rw: RewardConfig, step: int) -> bool:
    """Whether iteration ``step`` (0-based) lies in a decoupled phase: the last
    ``decouple_length`` of every ``decouple_every`` iterations (never when that is 0)."""
    k, p = rw.decouple_every, rw.decouple_length
    return k > 0 and step % k >= k - p


def _sequence(cfg: Config, seed: int, composite_fraction: float,
              composite_keys: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """World prompt frame ``[1, 1, C, H, W]`` and action ids ``[N*F]`` of one sequence of the
    embedded world, drawn from ``seed``."""
    data = sample_sequences(1, num_clips=cfg.rollout.num_clips, seed=seed,
                            composite_fraction=composite_fraction, composite_keys=composite_keys,
                            clip_frames=cfg.model.clip_frames, resolution=cfg.model.resolution)
    return data.frames[:, :1], data.actions[0]


def prompt_seed(cfg: Config, step: int, group: int) -> int:
    """The embedded world's seed of a global group's sequence (:func:`group_prompt`): its
    scene, start pose and commands."""
    return stream_seed(cfg.train.seed, step, group, "prompt") % 2**31


def group_prompt(cfg: Config, step: int, group: int, device: torch.device
                 ) -> tuple[Tensor, Tensor]:
    """World prompt frame ``[1, 1, C, H, W]`` and action ids ``[N*F]`` of a global group."""
    ro = cfg.rollout
    frame, actions = _sequence(cfg, prompt_seed(cfg, step, group), ro.composite_fraction,
                               ro.composite_keys)
    return frame.to(device), actions.to(device)


def is_high_motion(actions: Tensor, min_keys: int) -> bool:
    """Whether every frame of action ids ``[...]`` presses at least ``min_keys`` keys."""
    return bool((num_primitives(actions) >= min_keys).all())


def high_motion_prompt(cfg: Config, step: int, group: int, device: torch.device
                       ) -> tuple[Tensor, Tensor]:
    """A decoupled iteration's world prompt ``[1, 1, C, H, W]`` and action ids ``[N*F]``:
    every clip presses at least ``reward.decouple_min_keys`` keys.

    Drawn as the rollout's sequences are, but only key combinations of the
    ``rollout.composite_keys`` counts that reach the minimum (all of them for a minimum of 1,
    at the rollout's ``composite_fraction``); a sequence with a clip below it (a segment that
    fell back to a no-op) is redrawn from the next seed of the group's own stream, so the
    prompt depends only on ``(seed, step, group)``.
    """
    ro, need = cfg.rollout, cfg.reward.decouple_min_keys
    keys = tuple(k for k in ro.composite_keys if k >= need)
    fraction = 1.0 if need >= 2 else ro.composite_fraction
    for attempt in range(HIGH_MOTION_DRAWS):
        seed = stream_seed(cfg.train.seed, step, group, "high_motion_prompt", attempt)
        frame, actions = _sequence(cfg, seed % 2**31, fraction, keys)
        if is_high_motion(actions, need):
            return frame.to(device), actions.to(device)
    raise RuntimeError(f"no sequence with {need} or more keys in every clip in "
                       f"{HIGH_MOTION_DRAWS} draws (iteration {step}, group {group})")


class RewardNaNError(ValueError):
    """A reward model returned NaN or inf."""


class NumericalFaultError(RuntimeError):
    """Too many consecutive updates had a NaN or inf loss or gradient."""


class Trainer:
    """Holds the current and old models, optimizers, sampler, update rule and reward models of
    a run.

    ``rewards``: the IF estimator and VQ critic of the run's reward
    (:func:`wc_fast.rewards.build` of the config, which builds them unless given); ``rule``:
    the update rule (:func:`~wc_fast.rl.updates.build_update` of the config unless given).
    ``codec``: the map between the model's frames and pixel frames (the Wan VAE for a latent
    model; the identity, by default, for a pixel model): world prompts are encoded once per
    group, the rewards read decoded frames.
    """

    def __init__(self, cfg: Config, model: WorldModel, device: torch.device, *,
                 rank: int = 0, world_size: int = 1,
                 process_group: dist.ProcessGroup | None = None,
                 codec: FrameCodec | None = None, rewards: RewardModels | None = None,
                 rule: Update | None = None) -> None:
        check_world_model(model)
        self._check_exploration(cfg, model)
        self.cfg = cfg
        # the update rule (train.update unless one is given); the trainer never asks which
        self.rule = build_update(cfg) if rule is None else rule
        # prompts are encoded into the model's frames, rewards read decoded pixel frames
        self.codec = PixelFrames() if codec is None else codec
        self.device = device
        self.rank, self.world_size, self.process_group = rank, world_size, process_group
        self.sharded = cfg.train.distributed == "fsdp2" and world_size > 1
        self.model = model.to(device).train()
        freeze_untrained(self.model, cfg.optim.trainable)
        # the state-dict names of the weights this run trains (set before sharding, which
        # keeps the names)
        self.trained = frozenset(name for name, p in self.model.named_parameters()
                                 if p.requires_grad)
        if not self.sharded:
            self.frozen_base  # noqa: B018 - a partial checkpoint names the base as loaded
            hold_frozen_matrices_in(self.model, DTYPES[cfg.model.dtype])
        # the old (rollout) model and the frozen initial model the rule's loss compares
        # against, if any: copies of the trained weights over the model's own frozen ones;
        # under FSDP2, which shards each module's own parameters, whole copies built shard by
        # shard from the sharded model
        self.old, self.ref = policy_copies(self.model, DTYPES[cfg.model.dtype],
                                           self.rule.reference, on_meta=self.sharded)
        if self.sharded:
            mesh = DeviceMesh.from_group(process_group, device.type)
            shard_model(self.model, process_group, device.type, mesh=mesh)
            self.old, self.ref = (
                None if structure is None else
                shard_frozen_copy(structure, self.model, process_group, device, mesh=mesh)
                for structure in (self.old, self.ref))
        self.optimizers = build_optimizers(self.model, cfg.optim)
        # consecutive updates skipped for a NaN or inf loss or gradient
        self.bad_streak = 0
        # whether this iteration's rewards also measure the reader gap, and each group's gap
        self.read_gap, self.gaps = False, []
        # the run length the EMA decay schedule spans (kept when a resumed run is extended)
        self.schedule_steps = cfg.train.steps
        ro = cfg.rollout
        capture = "eager" if self.sharded else ro.capture
        self.sampler = ClipSampler(self.old, steps=ro.steps, shift=ro.shift, capture=capture,
                                   candidate_noise=ro.candidate_noise, sde_noise=ro.sde_noise,
                                   noise_warp=ro.noise_warp,
                                   candidate_chunk=ro.candidate_chunk)
        self.explore = MotionExploration(action=ro.action_exploration, warp=ro.warp_exploration)
        why_not = compile_unavailable(device) if cfg.update.compile else None
        if why_not:
            warnings.warn(f"update.compile: {why_not}; the train phase runs eagerly", stacklevel=2)
        self.compiled = cfg.update.compile and why_not is None
        self.context = self._update_context()
        self.reward = build_reward(cfg, device, rewards)
        # the reward estimator's own error on ground-truth renders: the unit of motion_spread
        self.estimator_error = estimator_motion_error(
            self.reward.models.estimator, clip_frames=cfg.model.clip_frames,
            resolution=cfg.model.resolution)

    def _update_context(self) -> UpdateContext:
        """What the rule sees of this run: each model's velocity by role (compiled with
        update.compile), the rank's groups and the sampler's largest sigma."""
        def fn(model: WorldModel | None) -> Callable[..., Tensor] | None:
            if model is None:
                return None
            return torch.compile(model.velocity) if self.compiled else model.velocity

        return UpdateContext(device=self.device, velocity=fn(self.model),
                             old_velocity=fn(self.old), ref_velocity=fn(self.ref),
                             velocity_flops=self.model.velocity_flops,
                             sigma_max=self.sampler.sigmas[1],
                             group_ids=tuple(self.group_ids()),
                             exploring=self.explore != NO_EXPLORATION)

    @staticmethod
    def _check_exploration(cfg: Config, model: WorldModel) -> None:
        """The rollout's exploration in camera motion must be one the model takes."""
        ro = cfg.rollout
        for name, strength, needs in (("rollout.action_exploration", ro.action_exploration,
                                       "action_offset"),
                                      ("rollout.warp_exploration", ro.warp_exploration,
                                       "affine_offset")):
            if strength > 0 and needs not in model.exploration_inputs:
                raise ValueError(f"{name} needs a model whose velocity takes {needs}; "
                                 f"{type(model).__name__} takes "
                                 f"{sorted(model.exploration_inputs)}")

    # -- groups ---------------------------------------------------------------------------------

    def group_ids(self) -> list[int]:
        """Global indices of this rank's groups."""
        b = self.cfg.rollout.groups_per_rank
        return [self.rank * b + i for i in range(b)]

    # -- phases ---------------------------------------------------------------------------------

    def rollout(self, step: int, clip_index: int) -> list[GroupRollout]:
        """Each of this rank's groups rolled out for clip ``clip_index``, from high-motion
        prompts in a decoupled iteration."""
        run = functools.partial(self.rule.rollout_fn(), explore=self.explore)
        prompt_of = high_motion_prompt if decoupled(self.cfg.reward, step) else group_prompt
        groups = []
        for g in self.group_ids():
            prompt, actions = prompt_of(self.cfg, step, g, self.device)
            prompt = self.codec.encode(prompt)
            gen = generator(self.cfg.train.seed, step, g, "rollout", device=self.device)
            group = run(self.old, self.sampler, prompt, actions, clip_index,
                        self.cfg.rollout.group_size, gen)
            if prompt_of is group_prompt:
                group.prompt_seed = prompt_seed(self.cfg, step, g)
            groups.append(group)
        return groups

    def _scores(self, groups: list[GroupRollout]) -> tuple[Tensor, Tensor, list[float]]:
        """Raw IF and VQ scores ``[B, G]`` by the run's reward, and each group's motion spread
        (from the same camera paths); with :attr:`read_gap` set, :attr:`gaps` gets each
        group's reader gap."""
        s_if, s_vq, spread = [], [], []
        for group in groups:
            frames = self.codec.decode(group.reward_frames())
            scores = self.reward(group, frames)
            if self.read_gap:
                self.gaps.append(self.reward.reader_gap(group, frames, scores))
            s_if.append(scores.s_if)
            s_vq.append(scores.s_vq)
            spread.append(motion_spread(camera_motion(scores.c2w.cpu()), self.estimator_error,
                                        commanded_directions(group.clip_actions.cpu())))
        return torch.stack(s_if).float(), torch.stack(s_vq).float(), spread

    def rewards(self, groups: list[GroupRollout]) -> tuple[Tensor, Tensor, dict[str, float]]:
        """IF and VQ scores ``[B, G]`` and the mean motion spread of this rank's basic and
        composite groups (keys absent when there is no such group); NaN or inf raises
        :class:`RewardNaNError`."""
        s_if, s_vq, spread = self._scores(groups)
        for name, s in (("IF", s_if), ("VQ", s_vq)):
            if not bool(torch.isfinite(s).all()):
                raise RewardNaNError(f"the {name} reward returned NaN or inf for clip "
                                     f"{groups[0].clip_index}; check the reward model")
        by_kind: dict[str, list[float]] = {}
        for group, value in zip(groups, spread, strict=True):
            kind = "composite" if bool(is_composite(group.clip_actions[0])) else "basic"
            if not math.isnan(value):  # NaN: a command that moves nothing
                by_kind.setdefault(kind, []).append(value)
        return s_if, s_vq, {k: sum(v) / len(v) for k, v in by_kind.items()}

    def advantages(self, s_if: Tensor, s_vq: Tensor, *, vq_only: bool = False
                   ) -> tuple[Tensor, Tensor]:
        """Optimality ``r`` and combined advantage ``A`` ``[B, G]`` of the scores ``[B, G]``
        under ``reward.kind``, or of VQ alone with ``vq_only`` (a decoupled iteration)."""
        rw = self.cfg.reward
        lam = 0.0 if vq_only else {"both": rw.lam, "if": 1.0, "vq": 0.0}[rw.kind]
        group = self.process_group if self.world_size > 1 else None
        return optimality(s_if, s_vq, lam=lam, Z=rw.Z, std=rw.std, process_group=group)

    def update(self, step: int, groups: list[GroupRollout], r: Tensor, adv: Tensor
               ) -> UpdateStats:
        """``optim.updates_per_iteration`` updates of the current model by the rule on the
        candidates it keeps."""
        c = self.cfg
        kept = self.rule.kept(self.context, step, adv)
        flat = (adv == 0).all(dim=1)
        # kept positions in a random order before they are split into updates, so each update
        # sees positives and negatives (in kept order the first saw only the best)
        order = torch.randperm(kept.shape[1], generator=generator(c.train.seed, step, "order"))
        chunks = order.tensor_split(c.optim.updates_per_iteration)
        losses, flops, bad, kl_sum, kl_rows = [], 0.0, 0, 0.0, 0.0
        for chunk in chunks:
            batches = [self.rule.items(self.context, step, gid, group, r[b], adv[b],
                                       kept[b, chunk])
                       for b, (gid, group) in enumerate(zip(self.group_ids(), groups,
                                                            strict=True)) if not flat[b]]
            total = self._global_sum(float(sum(len(item.candidate) for item in batches)))
            if total == 0:
                continue
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for item in batches:
                value, f, kl = self._accumulate(item, total)
                loss_sum += value
                flops += f
                kl_sum += kl
            kl_rows += total
            self._all_reduce_grads()
            if self._nonfinite(loss_sum):
                bad += 1
                self.bad_streak += 1
                continue
            if c.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.optim.grad_clip)
            if not self._guarded_step():
                bad += 1
                self.bad_streak += 1
                continue
            self.bad_streak = 0
            losses.append(self._global_sum(loss_sum))
        # nothing reads the gradients before the next update zeroes them: freed now, their
        # memory serves the next rollout and rewards
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss = sum(losses) / len(losses) if losses else (None if bad else 0.0)
        kl = (self._global_sum(kl_sum) / kl_rows
              if self.ref is not None and kl_rows > 0 else None)
        return UpdateStats(loss=loss, skipped_groups=int(self._global_sum(float(flat.sum()))),
                           flops=flops, skipped_updates=bad, kl=kl)

    def update_old_model(self, step: int) -> float:
        """Move the old (rollout) model toward the current one by EMA; returns the decay."""
        decay = self.ema_decay(step)
        ema_update(self.old, self.model, decay)
        return decay

    def ema_decay(self, step: int) -> float:
        """The old model's EMA decay at iteration ``step``, over ``schedule_steps``, by the
        update rule."""
        return self.rule.ema_decay(step, self.schedule_steps)

    def _guarded_step(self) -> bool:
        """One step of every optimizer; undone (returns ``False``) when it changes the trained
        weights by a norm above ``train.max_update_ratio`` times theirs or leaves one NaN or
        inf (the norms over every rank's weights, so every rank decides alike). Keeps a copy of
        the trained weights during the step unless the guard is off (ratio 0)."""
        ratio = self.cfg.train.max_update_ratio
        params = [p for p in self.model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params] if ratio > 0 and params else None
        for opt in self.optimizers:
            opt.step()
        if before is None:
            return True

        def local(t: Tensor) -> Tensor:
            return t.to_local() if isinstance(t, DTensor) else t

        with torch.no_grad():  # fp32 norms: one that overflows is too large anyway
            change = torch.stack([torch.linalg.vector_norm(local(p) - local(b))
                                  for p, b in zip(params, before, strict=True)])
            old = torch.stack([torch.linalg.vector_norm(local(b)) for b in before])
            new = torch.stack([torch.linalg.vector_norm(local(p)) for p in params])
            # squared norms summed over ranks (a replicated weight counts once per rank in
            # both norms, which leaves their ratio unchanged)
            change2, old2, new2 = (self._global_sum(float(n.double().square().sum()))
                                   for n in (change, old, new))
        healthy = math.isfinite(change2) and math.isfinite(new2) and (
            old2 == 0 or math.sqrt(change2) <= ratio * math.sqrt(old2))
        if not healthy:
            with torch.no_grad():
                for p, b in zip(params, before, strict=True):
                    p.copy_(b)
        return healthy

    def _nonfinite(self, loss_sum: float) -> bool:
        """Whether this update's loss or any gradient is NaN or inf on any rank (every rank
        then skips it)."""
        grads = [g.to_local() if isinstance(g, DTensor) else g
                 for g in (p.grad for p in self.model.parameters()) if g is not None]
        # one fused norm (a NaN or inf in any element makes it non-finite) instead of one
        # isfinite reduction and host sync per gradient tensor
        finite = math.isfinite(loss_sum) and (
            not grads or bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))))
        return self._global_sum(0.0 if finite else 1.0) > 0

    # -- training internals ---------------------------------------------------------------------

    def _current_cache(self, group: GroupRollout, row: int, old_cache: ContextCache
                       ) -> tuple[ContextCache, float]:
        """The history cache the current model predicts over, and the FLOPs spent on it."""
        mode = self.cfg.update.context_kv
        if mode == "reuse":
            return old_cache, 0.0
        flops = self.model.history_flops(group.history.shape[1])
        with torch.set_grad_enabled(mode == "recompute_grad"):
            cache = self.model.build_cache_parallel(group.history[row:row + 1],
                                                    group.history_actions[row:row + 1],
                                                    sigma=self.model.context_sigma)
        # with gradient, the backward through the cache costs about twice its forward
        return cache, flops * (3 if mode == "recompute_grad" else 1)

    def _frozen_caches(self, group: GroupRollout, row: int, old_cache: ContextCache
                       ) -> tuple[dict[str, ContextCache], float]:
        """The frozen models' history caches of history ``row`` by role, which the rule's loss
        reads: the old model's own ``old_cache`` as ``"old"`` and, with a reference model,
        its cache (built here) as ``"ref"``; and the FLOPs spent."""
        caches = {"old": old_cache}
        if self.ref is None:
            return caches, 0.0
        with torch.no_grad():
            caches["ref"] = self.ref.build_cache_parallel(group.history[row:row + 1],
                                                          group.history_actions[row:row + 1],
                                                          sigma=self.ref.context_sigma)
        return caches, self.ref.history_flops(group.history.shape[1])

    def _accumulate(self, item: Items, total: float) -> tuple[float, float, float]:
        """Backward of the item's loss sum / ``total`` in micro-batches over shared caches;
        returns that value (the item's share of the step's mean loss), the FLOPs and the sum
        of its rows' KL to the reference model (0 without one)."""
        up = self.cfg.update
        group = item.group
        shared = len(group.caches) == 1
        rows = [0] * len(item.candidate) if shared else item.candidate
        loss_sum, flops, kl_sum = 0.0, 0.0, 0.0
        micro = up.micro_batch or (len(rows) if self.device.type == "cuda" else CPU_MICRO_BATCH)
        for row in sorted(set(rows)):
            idx = torch.tensor([i for i, o in enumerate(rows) if o == row])
            old_cache = group.caches[row]
            cache, cache_flops = self._current_cache(group, row, old_cache)
            frozen, frozen_flops = self._frozen_caches(group, row, old_cache)
            flops += cache_flops + frozen_flops
            parts = idx.split(micro)
            for j, part in enumerate(parts):
                loss, f, kl = self.rule.micro_loss(self.context, item, part,
                                                   group.clip_actions, cache, frozen,
                                                   1.0 / total)
                last = j == len(parts) - 1
                loss.backward(retain_graph=up.context_kv == "recompute_grad" and not last)
                loss_sum += loss.item()
                flops += f
                if kl is not None:
                    kl_sum += float(kl.sum())
        return loss_sum, flops, kl_sum

    def _global_sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.process_group)
        return float(t.item())

    def _all_reduce_grads(self) -> None:
        """Sum gradients over ranks (each rank's loss is already divided by the global count);
        FSDP2 has already reduce-scattered them."""
        if self.world_size == 1 or self.sharded:
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.process_group)
        for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads),
                        strict=True):
            p.grad = g

    @property
    def partial(self) -> bool:
        """Whether this run's checkpoints hold only the trained weights: a LoRA run, or one
        that trains a subset (``optim.trainable conditioning``) without FSDP2."""
        trains_a_subset = any(not p.requires_grad for p in self.model.parameters())
        return bool(self.cfg.model.lora_rank) or (trains_a_subset and not self.sharded)

    def checkpoint_weights(self) -> dict[str, dict[str, Tensor]]:
        """The current and old models' weights for a checkpoint: every weight, or for a
        :attr:`partial` run only the trained ones (the rest is :attr:`frozen_base`). A
        collective under FSDP2, where rank 0 gets the tensors."""
        keys = self.trained if self.partial else None
        return {"model": full_state_dict(self.model, keys), "old": full_state_dict(self.old, keys)}

    @functools.cached_property
    def frozen_base(self) -> checkpoint.FrozenBase | None:
        """What a :attr:`partial` run's checkpoints leave out: where the frozen weights come
        from (``model.path``, else ``train.init``) and the sha256 of every weight the run does
        not train (as loaded; hashed once). ``None`` for other runs, whose checkpoints hold
        whole models."""
        if not self.partial:
            return None
        frozen = {k: v for k, v in self.model.state_dict().items() if k not in self.trained}
        return checkpoint.FrozenBase(path=self.cfg.model.path or self.cfg.train.init,
                                     sha256=checkpoint.weights_sha256(frozen))

    def unsharded_model(self) -> WorldModel | None:
        """The current model as one plain module on rank 0 (``None`` elsewhere); a collective
        under FSDP2, where every rank must call it."""
        if not self.sharded:
            return self.model if self.rank == 0 else None
        weights = full_state_dict(self.model)
        if self.rank != 0:
            return None
        model = self.model.fresh_copy().to(self.device)
        load_full_state_dict(model, weights)
        return model

    # -- the iteration --------------------------------------------------------------------------

    def iteration(self, step: int) -> IterationStats:
        clip_index = step % self.cfg.rollout.num_clips + 1
        vq_only = decoupled(self.cfg.reward, step)
        times = {}
        t0 = time.perf_counter()
        groups = self.rollout(step, clip_index)
        times["rollout"] = self._sync_time(t0)
        t0 = time.perf_counter()
        every = self.cfg.train.reader_gap_every
        self.read_gap, self.gaps = every > 0 and step % every == 0, []
        s_if, s_vq, spread = self.rewards(groups)
        gap = None
        if self.read_gap:  # every rank measures at the same steps: the sums match
            count = self._global_sum(float(len(self.gaps)))
            total = self._global_sum(float(sum(self.gaps)))
            gap = total / count if count else None
        r, adv = self.advantages(s_if, s_vq, vq_only=vq_only)
        times["reward"] = self._sync_time(t0)
        t0 = time.perf_counter()
        upd = self.update(step, groups, r, adv)
        decay = self.update_old_model(step)
        times["train"] = self._sync_time(t0)
        generated = sum(g.candidates.shape[0] + (clip_index - 1) * g.history.shape[0]
                        for g in groups)
        return IterationStats(step=step + 1, clip_index=clip_index,
                              if_mean=self._global_mean(s_if), vq_mean=self._global_mean(s_vq),
                              r_std=float(r.float().std(dim=1).mean()), loss=upd.loss,
                              skipped_groups=upd.skipped_groups, ema_decay=decay,
                              skipped_updates=upd.skipped_updates, times=times,
                              clips_per_s=generated / max(times["rollout"], 1e-9),
                              train_flops=upd.flops, motion_spread=spread,
                              decoupled=vq_only, kl=upd.kl, reader_gap=gap)

    def _global_mean(self, t: Tensor) -> float:
        return self._global_sum(float(t.float().sum())) / self._global_sum(float(t.numel()))

    def _sync_time(self, t0: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0
