"""The clipped-ratio update of Flow-GRPO / DanceGRPO (docs/design.md section 4.1): every
candidate at some of the SDE steps its rollout recorded, trained with the PPO-clipped
``grpo_sde_loss`` on its group advantage, optionally with a KL to the frozen initial model."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from wc_fast.infra.runtime import generator
from wc_fast.models import ContextCache
from wc_fast.rl.rollout import GroupRollout, rollout_clip_level
from wc_fast.rl.updates.base import CPU_MICRO_BATCH, MicroLoss, Update, UpdateContext
from wc_kernels import grpo_sde_loss, sde_log_prob


@dataclass(slots=True)
class GRPOItems:
    """One group's candidates at some of their recorded SDE steps: what a GRPO update trains on.

    Row ``i`` is candidate ``candidate[i]`` (an index into the group) at one stochastic step
    of its rollout, which moved it from ``sample[i]`` to ``prev_sample[i]``.
    """

    group: GroupRollout
    sample: Tensor  # [N, F, C, H, W] the latent before the step
    prev_sample: Tensor  # [N, F, C, H, W] the latent after it
    sigma: Tensor  # [N]
    sigma_next: Tensor  # [N]
    old_log_prob: Tensor  # [N] the old model's log-probability of the step, from the rollout
    advantage: Tensor  # [N] the row's candidate's group advantage
    candidate: list[int]  # [N]
    motion: Tensor | None  # [N, 3] the candidate's own motion latents (motion-latent models)


class GRPOUpdate(Update):
    """``train.update flow_grpo``: SDE rollouts with recorded log-probabilities (clip-level,
    validation keeps it so), every candidate kept, ``grpo.*`` for the loss; the old model is
    the current one after each update with ``grpo.on_policy``."""

    loss_title = "Flow-GRPO loss"

    @property
    def kl_beta(self) -> float:
        return self.cfg.grpo.kl_beta

    def rollout_fn(self) -> Callable[..., GroupRollout]:
        return functools.partial(rollout_clip_level, grpo=self.cfg.grpo)

    def kept(self, ctx: UpdateContext, step: int, adv: Tensor) -> Tensor:
        """All ``G`` candidates of every group."""
        return torch.arange(adv.shape[1]).expand(adv.shape[0], -1)

    def items(self, ctx: UpdateContext, step: int, gid: int, group: GroupRollout, r: Tensor,
              adv: Tensor, chosen: Tensor) -> GRPOItems:
        """The chosen candidates at ``ceil(grpo.timestep_fraction K)`` distinct ones of their
        ``K`` recorded SDE steps each (all ``K`` with a ``grpo.window``), drawn per candidate;
        with exploration, the old log-probabilities rescored under the commanded keys."""
        cfg, device = self.cfg, ctx.device
        gr, traj = cfg.grpo, group.trajectory
        total = len(traj.index)
        k = total if gr.window else math.ceil(gr.timestep_fraction * total)
        gen = generator(cfg.train.seed, step, gid, "grpo_steps", *chosen.tolist())
        steps = torch.stack([torch.randperm(total, generator=gen)[:k]
                             for _ in range(len(chosen))]).flatten().to(device)
        rows = chosen.repeat_interleave(k).to(device)
        motion = None
        if cfg.model.motion_latent:  # the latents the candidate was generated with
            motion = group.latents[rows.to(group.latents.device)].to(device)
        sample, prev_sample = traj.sample[steps, rows], traj.prev_sample[steps, rows]
        sigma, sigma_next = traj.sigma[steps], traj.sigma_next[steps]
        old_log_prob = traj.log_prob[steps, rows]
        if ctx.exploring:
            old_log_prob = self._commanded_log_prob(ctx, group, sample, prev_sample, sigma,
                                                    sigma_next, motion)
        return GRPOItems(group=group, sample=sample, prev_sample=prev_sample, sigma=sigma,
                         sigma_next=sigma_next, old_log_prob=old_log_prob,
                         advantage=adv.to(device)[rows], candidate=rows.tolist(),
                         motion=motion)

    @torch.no_grad()
    def _commanded_log_prob(self, ctx: UpdateContext, group: GroupRollout, sample: Tensor,
                            prev_sample: Tensor, sigma: Tensor, sigma_next: Tensor,
                            motion: Tensor | None) -> Tensor:
        """The sampling model's log-probability ``[N]`` of recorded SDE steps under the
        commanded keys: a rollout that explored sampled them under offset keys, and the update
        moves the commanded policy, so its ratio starts at 1 as an on-policy one does."""
        out = []
        for part in torch.arange(len(sample), device=sample.device).split(CPU_MICRO_BATCH):
            extra = {} if motion is None else {"motion": motion[part]}
            v = ctx.old_velocity(sample[part], sigma[part], group.clip_actions,
                                 group.caches[0], **extra)
            out.append(sde_log_prob(v, sample[part], prev_sample[part], sigma[part],
                                    sigma_next[part], noise_level=self.cfg.rollout.sde_noise,
                                    sigma_max=ctx.sigma_max))
        return torch.cat(out)

    def micro_loss(self, ctx: UpdateContext, item: GRPOItems, part: Tensor, actions: Tensor,
                   cache: ContextCache, frozen: dict[str, ContextCache], scale: float
                   ) -> MicroLoss:
        """GRPO's loss on rows ``part``, weighted ``len(part) * scale`` (``grpo_sde_loss``
        averages its rows, the step averages over all of its rows), its FLOPs and with a KL
        (whose reference model's cache is ``frozen["ref"]``) each row's KL."""
        gr = self.cfg.grpo
        sample, sigma = item.sample[part], item.sigma[part]
        motion = None if item.motion is None else item.motion[part]
        v_theta = ctx.velocity(sample, sigma, actions, cache, motion=motion)
        batch_flops = ctx.velocity_flops(len(part), cache.num_tokens)
        ref_output, flops = None, 3 * batch_flops
        if "ref" in frozen:
            with torch.no_grad():
                ref_output = ctx.ref_velocity(sample, sigma, actions, frozen["ref"],
                                              motion=motion)
            flops += batch_flops
        loss, _, kl = grpo_sde_loss(v_theta, sample, item.prev_sample[part], sigma,
                                    item.sigma_next[part], item.old_log_prob[part],
                                    item.advantage[part], noise_level=self.cfg.rollout.sde_noise,
                                    clip_range=gr.clip_range, adv_clip_max=gr.adv_clip_max,
                                    sigma_max=ctx.sigma_max, ref_output=ref_output,
                                    kl_beta=gr.kl_beta, return_stats=True,
                                    # the sampler's schedule: valid sigmas, no host read
                                    check_values=False)
        return MicroLoss(loss * (len(part) * scale), flops,
                         None if ref_output is None else kl)

    def ema_decay(self, step: int, schedule_steps: int) -> float:
        """0 with ``grpo.on_policy`` (the old model becomes the current one), else the EMA
        schedule."""
        if self.cfg.grpo.on_policy:
            return 0.0
        return super().ema_decay(step, schedule_steps)
