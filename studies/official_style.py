"""An RL iteration done the way the official WorldCompass code does it, on our model and config.

The baseline of ``studies/rl_iteration.py``. Same algorithm and numbers of candidates, sigmas and
updates as :class:`wc_fast.rl.trainer.Trainer`, but with the official execution strategy:
- one live model; the EMA (old) weights live in fp32 on the CPU and are swapped into the live
  model around every old-model use (the rollout and each old-model forward);
- the G candidates are generated one after another at batch size 1;
- rewards per candidate, labels from poses by a per-frame Python loop;
- one forward/backward per (candidate, sigma) item at batch 1, each recomputing the history
  context; the old model's prediction is computed and then replaced by the current model's
  detached prediction; eager reference loss; an optimizer step every
  ``2 * keep / updates_per_iteration`` candidates (every 2 with the official constants).
"""

from __future__ import annotations

import math
import time

import torch

from wc_fast.actions import split_action
from wc_fast.config import Config
from wc_fast.infra.runtime import generator
from wc_fast.models import TinyWorldDiT
from wc_fast.models.motion_latent import noise_latents, with_latents
from wc_fast.rewards import load_critic, load_estimator, poses_to_labels
from wc_fast.rl.advantages import optimality, select_extremes
from wc_fast.rl.ema import ema_decay
from wc_fast.rl.optim import build_optimizers
from wc_fast.rl.rollout import generate_history
from wc_fast.rl.sampler import ClipSampler, sigma_schedule
from wc_fast.rl.trainer import group_prompt
from wc_kernels import reference


class OfficialStyleIteration:
    """One iteration in the official style; ``run(step)`` returns seconds per phase."""

    def __init__(self, cfg: Config, model: TinyWorldDiT, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.model = model.to(device).train()
        self.ema_cpu = {k: v.detach().float().cpu().clone()
                        for k, v in self.model.state_dict().items()}
        self.optimizers = build_optimizers(self.model, cfg.optim, grouped=False)
        ro = cfg.rollout
        self.sampler = ClipSampler(self.model, steps=ro.steps, shift=ro.shift, capture="eager")
        self.sigmas = sigma_schedule(ro.steps, ro.shift)[:-1]
        self.estimator = load_estimator("reward", device=device)
        self.critic = load_critic(device=device)

    def group_ids(self) -> list[int]:
        return list(range(self.cfg.rollout.groups_per_rank))

    def _swap(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Load ``weights`` (CPU) into the live model; return the live weights (copied to CPU)."""
        live = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict({k: v.to(self.device) for k, v in weights.items()})
        return live

    def _labels_loop(self, c2w: torch.Tensor) -> tuple[list[int], list[int]]:
        rw = self.cfg.reward
        trans, rot = [], []
        for i in range(1, c2w.shape[0]):
            t, r = poses_to_labels(c2w[i - 1:i + 1], trans_threshold=rw.trans_thresholds[0],
                                   rot_threshold_deg=rw.rot_threshold_deg)
            trans.append(int(t[0]))
            rot.append(int(r[0]))
        return trans, rot

    def run(self, step: int) -> dict[str, float]:
        cfg, times = self.cfg, {}
        clip_index = step % cfg.rollout.num_clips + 1
        f = self.model.clip_frames
        t0 = time.perf_counter()
        live = self._swap(self.ema_cpu)
        groups = []
        with torch.no_grad():
            for g in self.group_ids():
                prompt, actions = group_prompt(cfg, step, g, self.device)
                gen = generator(cfg.train.seed, step, g, "rollout", device=self.device)
                history, history_actions, cache = generate_history(
                    self.model, self.sampler, prompt, actions, clip_index - 1, gen)
                clip_actions = actions[(clip_index - 1) * f:clip_index * f]
                sampled = [self.sampler.sample(cache, clip_actions, num=1, generator=gen)
                           for _ in range(cfg.rollout.group_size)]
                candidates = torch.cat([s.clips for s in sampled]).clamp(-1, 1)
                latents = torch.cat([noise_latents(s.noise) for s in sampled])
                groups.append((history, history_actions, candidates, clip_actions, latents))
        self._swap(live)
        times["rollout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        s_if, s_vq = [], []
        for history, _, candidates, clip_actions, _ in groups:
            trans_gt, rot_gt = split_action(clip_actions)
            row_if, row_vq = [], []
            for c in range(candidates.shape[0]):
                frames = torch.cat([history[:, -1:], candidates[c:c + 1]], dim=1)
                with torch.no_grad():
                    c2w = self.estimator(frames)[0].double()
                    vq = self.critic(frames[:, 1::cfg.reward.vq_stride]).mean()
                trans, rot = self._labels_loop(c2w)
                acc_t = sum(int(a == b) for a, b in zip(trans, trans_gt.tolist(), strict=True))
                acc_r = sum(int(a == b) for a, b in zip(rot, rot_gt.tolist(), strict=True))
                row_if.append((acc_t + acc_r) / (2 * len(trans)))
                row_vq.append(float(vq))
            s_if.append(row_if)
            s_vq.append(row_vq)
        r, adv = optimality(torch.tensor(s_if), torch.tensor(s_vq), lam=cfg.reward.lam,
                            Z=cfg.reward.Z, std=cfg.reward.std)
        times["reward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self._train(step, groups, r, adv)
        times["train"] = time.perf_counter() - t0
        return times

    def _train(self, step: int, groups, r: torch.Tensor, adv: torch.Tensor) -> None:
        cfg, nf = self.cfg, self.cfg.nft
        kept = select_extremes(adv, nf.keep)
        k_sig = math.ceil(nf.timestep_fraction * len(self.sigmas))
        ctx = self.model.cfg.context_sigma
        per_update = math.ceil(kept.shape[1] / cfg.optim.updates_per_iteration)
        for b, (history, history_actions, candidates, clip_actions, latents) in enumerate(groups):
            motion = latents if self.model.cfg.motion_latent else None
            gen = generator(cfg.train.seed, step, b, "official-noise")
            for n_done, c in enumerate(kept[b].tolist(), start=1):
                for j in torch.randperm(len(self.sigmas), generator=gen)[:k_sig].tolist():
                    s = float(self.sigmas[j])
                    x0 = candidates[c:c + 1]
                    eps = torch.randn(x0.shape, generator=gen).to(self.device)
                    one = None if motion is None else motion[c:c + 1]
                    if one is not None:
                        eps = with_latents(eps, one)
                    x_t, v_target = (1 - s) * x0 + s * eps, eps - x0
                    sigma = torch.full((1,), s, device=self.device)
                    live = self._swap(self.ema_cpu)
                    with torch.no_grad():
                        cache = self.model.extend_cache(self.model.empty_cache(), history,
                                                        history_actions, sigma=ctx)
                        self.model.velocity(x_t, sigma, clip_actions, cache, motion=one)
                    self._swap(live)
                    cache = self.model.extend_cache(self.model.empty_cache(), history,
                                                    history_actions, sigma=ctx)
                    v_theta = self.model.velocity(x_t, sigma, clip_actions, cache, motion=one)
                    loss = reference.nft_loss(v_theta, v_theta.detach(), v_target,
                                              r[b, c:c + 1].float().to(self.device),
                                              beta=nf.beta, sigma=sigma,
                                              space=nf.loss_space)
                    (loss / (2 * k_sig)).backward()
                if n_done % per_update == 0 or n_done == len(kept[b]):
                    for opt in self.optimizers:
                        opt.step()
                        opt.zero_grad(set_to_none=True)
        decay = ema_decay(step, cfg.train.steps, start=cfg.ema.start, end=cfg.ema.end,
                          schedule=cfg.ema.schedule)
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                self.ema_cpu[k].lerp_(v.detach().float().cpu(), 1 - decay)
