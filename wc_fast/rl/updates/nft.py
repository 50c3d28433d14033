"""The negative-aware flow-matching update of DiffusionNFT / WorldCompass (docs/design.md
section 4, steps 5-7): each group's best and worst candidates, noised at several schedule
sigmas, trained with the fused ``nft_loss`` against the old model's velocity."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from wc_fast.config import Config
from wc_fast.infra.runtime import generator
from wc_fast.models import ContextCache
from wc_fast.models.motion_latent import noise_latents, with_latents
from wc_fast.rl.advantages import select_extremes
from wc_fast.rl.rollout import GroupRollout, rollout_clip_level, rollout_sample_level
from wc_fast.rl.sampler import sigma_schedule
from wc_fast.rl.updates.base import MicroLoss, Update, UpdateContext
from wc_kernels import flow_noise, nft_loss


@dataclass(slots=True)
class NFTItems:
    """One group's kept candidates, noised at several sigmas each: what an NFT update trains on.

    ``N`` = kept candidates x sigmas per candidate; row ``i`` is candidate ``candidate[i]``
    (an index into the group) at ``sigma[i]``.
    """

    group: GroupRollout
    x_t: Tensor  # [N, F, C, H, W] noisy clips
    v_target: Tensor  # [N, F, C, H, W] eps - x0
    sigma: Tensor  # [N]
    r: Tensor  # [N] optimality of the row's candidate
    candidate: list[int]  # [N] which candidate of the group each row noises
    motion: Tensor | None  # [N, 3] motion latents the model is given (motion-latent models)


class NFTUpdate(Update):
    """``train.update nft``: ``nft.keep`` best and worst candidates per group, each at
    ``ceil(nft.timestep_fraction T)`` of the ``T`` schedule sigmas; the old model's velocity
    (or the current one's, detached) as ``v_old``; the EMA schedule for the old model."""

    loss_title = "NFT loss"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        ro = cfg.rollout
        # the sampler's schedule without its final 0: the sigmas a candidate is noised at
        self.sigmas = sigma_schedule(ro.steps, ro.shift)[:-1]

    @property
    def kl_beta(self) -> float:
        return self.cfg.nft.kl_beta

    def rollout_fn(self) -> Callable[..., GroupRollout]:
        return rollout_sample_level if self.cfg.rollout.mode == "sample" else rollout_clip_level

    def kept(self, ctx: UpdateContext, step: int, adv: Tensor) -> Tensor:
        """``nft.keep`` best then worst of each group (ties at the cut broken at random per
        global group, so any rank layout draws the same)."""
        keep, seed = self.cfg.nft.keep, self.cfg.train.seed
        return torch.cat([select_extremes(adv[b:b + 1], keep,
                                          generator=generator(seed, step, gid, "select"))
                          for b, gid in enumerate(ctx.group_ids)])

    def items(self, ctx: UpdateContext, step: int, gid: int, group: GroupRollout, r: Tensor,
              adv: Tensor, chosen: Tensor) -> NFTItems:
        k_sig = math.ceil(self.cfg.nft.timestep_fraction * len(self.sigmas))
        return self.noised(ctx.device, step, gid, group, r, chosen, k_sig)

    def noised(self, device: torch.device, step: int, gid: int, group: GroupRollout,
               r: Tensor, chosen: Tensor, k_sig: int) -> NFTItems:
        """Noisy clips of the chosen candidates at ``k_sig`` distinct schedule sigmas each."""
        cfg = self.cfg
        gen = generator(cfg.train.seed, step, gid, "noise", *chosen.tolist(), device=device)
        picks = torch.stack([torch.randperm(len(self.sigmas), generator=gen,
                                            device=device)[:k_sig]
                             for _ in range(len(chosen))])
        sigmas = self.sigmas.to(device)[picks]
        x0 = group.candidates[chosen.to(device)]
        noise = torch.randn((len(chosen) * k_sig, *x0.shape[1:]), generator=gen, device=device)
        motion = None
        if cfg.model.motion_latent and cfg.nft.latent_pairing == "fresh":
            motion = noise_latents(noise)
        elif cfg.model.motion_latent:  # each candidate moved as its noise's latents said
            motion = group.latents[chosen.to(group.latents.device)].to(device)
            motion = motion.repeat_interleave(k_sig, dim=0)
            noise = with_latents(noise, motion)
        x_t, v_target = flow_noise(x0, sigmas, noise, check_values=False)
        return NFTItems(group=group, x_t=x_t, v_target=v_target, sigma=sigmas.flatten(),
                        r=r[chosen].repeat_interleave(k_sig).to(device),
                        candidate=chosen.repeat_interleave(k_sig).tolist(), motion=motion)

    def micro_loss(self, ctx: UpdateContext, item: NFTItems, part: Tensor, actions: Tensor,
                   cache: ContextCache, frozen: dict[str, ContextCache], scale: float
                   ) -> MicroLoss:
        """``nft_loss`` summed over rows ``part`` times ``scale``, plus with ``nft.kl_beta``
        the rows' KL to the initial model (``kl_beta * scale`` times their sum).
        ``frozen["old"]`` is the old model's cache, which its ``v_old`` forward reads,
        ``frozen["ref"]`` the initial model's."""
        nf = self.cfg.nft
        x_t, sigma = item.x_t[part], item.sigma[part]
        motion = None if item.motion is None else item.motion[part]
        v_theta = ctx.velocity(x_t, sigma, actions, cache, motion=motion)
        batch_flops = ctx.velocity_flops(len(part), cache.num_tokens)
        if nf.old_prediction == "detached_current":
            v_old, flops = v_theta.detach(), 3 * batch_flops
        else:
            with torch.no_grad():
                v_old = ctx.old_velocity(x_t, sigma, actions, frozen["old"], motion=motion)
            flops = 4 * batch_flops
        loss = nft_loss(v_theta, v_old, item.v_target[part].to(v_theta.dtype),
                        item.r[part], beta=nf.beta, sigma=sigma, space=nf.loss_space,
                        reduction="sum", scale=scale, check_values=False)
        if "ref" not in frozen:
            return MicroLoss(loss, flops)
        with torch.no_grad():
            v_ref = ctx.ref_velocity(x_t, sigma, actions, frozen["ref"], motion=motion)
        kl = velocity_kl(v_theta, v_ref)
        return MicroLoss(loss + (nf.kl_beta * scale) * kl.sum(), flops + batch_flops,
                         kl.detach())


def velocity_kl(v_theta: Tensor, v_ref: Tensor) -> Tensor:
    """Per-row KL ``[N]`` of the model's flow to the reference's at the same noisy clips
    ``[N, F, C, H, W]``: the mean squared velocity difference, in fp32. One Gaussian step of
    the flow-matching SDE has a KL proportional to it at every sigma, so a KL weight absorbs
    the sigma factor, as DiffusionNFT-style trainers' velocity-space KL does."""
    diff = v_theta.float() - v_ref.detach().float()
    return diff.square().flatten(1).mean(dim=1)
