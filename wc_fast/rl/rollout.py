"""Rollouts with the old (EMA) model: clip-level (WorldCompass) and sample-level (ablation).

Clip-level: the history (world prompt + clips ``1..n-1``) is generated ONCE with the ODE
sampler, its KV cache built once, then the ``G`` candidates of clip ``n`` are sampled in one
batched forward per step that reads that single cache. Sample-level: every candidate generates
its own whole sequence ``1..n`` from its own noise, so candidates differ in their histories too
(one reward per sequence). With a ``GRPOConfig``, clip-level candidates are sampled with
Flow-GRPO's SDE and keep their recorded steps (:class:`~wc_fast.rl.sampler.SDETrajectory`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wc_fast.config import GRPOConfig
from wc_fast.models import ContextCache, WorldModel
from wc_fast.models.clips import MOVEMENT_KEYS
from wc_fast.models.motion_latent import noise_latents
from wc_fast.rl.sampler import ClipSampler, Offsets, SDETrajectory


@dataclass(slots=True)
class GroupRollout:
    """One group: G candidates of clip ``clip_index`` and the history they share.

    ``history`` ``[H, 1 + (n-1)*F, C, H, W]`` (``H = 1`` clip-level, ``G`` sample-level),
    ``history_actions`` ``[H, 1 + (n-1)*F]`` (0 for the prompt frame), ``caches`` the old
    model's cache of each history, ``candidates`` ``[G, F, C, H, W]``, ``clip_actions`` ``[F]``,
    ``latents`` ``[G, 3]`` the motion latents of each candidate's initial noise
    (:mod:`wc_fast.models.motion_latent`), ``trajectory`` the candidates' recorded SDE steps
    (GRPO rollouts only), ``prompt_seed`` the world seed of the sequence (its scene and start
    pose; set by the trainer, ``None`` when unknown).
    """

    history: Tensor
    history_actions: Tensor
    caches: list[ContextCache]
    candidates: Tensor
    clip_actions: Tensor
    clip_index: int
    latents: Tensor
    trajectory: SDETrajectory | None = None
    prompt_seed: int | None = None  # the embedded world's seed of the group's sequence

    @property
    def previous_frames(self) -> Tensor:
        """The last history frame of each candidate ``[G, 1, C, H, W]`` (IF reference frame)."""
        last = self.history[:, -1:]
        return last.expand(self.candidates.shape[0], -1, -1, -1, -1)

    def reward_frames(self) -> Tensor:
        """``[G, F+1, C, H, W]``: previous frame then the candidate clip, for the rewards, in
        the model's frames (a latent model's are decoded by the trainer's codec first)."""
        return torch.cat([self.previous_frames, self.candidates], dim=1)


def _extend(model: WorldModel, cache: ContextCache, frames: Tensor, actions: Tensor
            ) -> ContextCache:
    return model.extend_cache(cache, frames, actions, sigma=model.context_sigma)


def prompt_cache(model: WorldModel, prompt: Tensor) -> ContextCache:
    """The cache of a world prompt ``[1, 1, C, H, W]`` alone (its action 0), what the first
    clip of a sequence is sampled against."""
    return _extend(model, model.empty_cache(), prompt,
                   torch.zeros(1, 1, dtype=torch.long, device=prompt.device))


def generate_history(model: WorldModel, sampler: ClipSampler, prompt: Tensor,
                     actions: Tensor, clips: int, gen: torch.Generator
                     ) -> tuple[Tensor, Tensor, ContextCache]:
    """ODE-generate ``clips`` clips after ``prompt`` ``[1, 1, C, H, W]``; build the cache once."""
    f = model.clip_frames
    device = prompt.device
    frame_actions = torch.cat([torch.zeros(1, dtype=torch.long, device=device),
                               actions[:clips * f]])[None]
    cache = prompt_cache(model, prompt)
    frames = [prompt]
    for c in range(clips):
        clip_actions = actions[c * f:(c + 1) * f]
        clip = model.bound_frames(sampler.sample(cache, clip_actions, num=1,
                                                  generator=gen).clips)
        cache = _extend(model, cache, clip, clip_actions[None])
        frames.append(clip)
    return torch.cat(frames, dim=1), frame_actions, cache


@dataclass(frozen=True, slots=True)
class MotionExploration:
    """How the candidates of a group explore camera motion, each under its own random motion
    drawn independently of the command (docs/design.md section 4.3).

    ``action``: standard deviation of a per-candidate offset to each movement key's intensity
    (the model's ``velocity(..., action_offset=)``), held over the clip: any world model that
    embeds its keys takes it. ``warp``: standard deviation, in pixels per frame, of a shift and
    zoom added to the embedded model's warp head (``affine_offset``). The update trains on the
    commanded conditioning alone, so it distils the motions that followed the command.
    """

    action: float = 0.0
    warp: float = 0.0

    def offsets(self, num: int, size: int, gen: torch.Generator) -> Offsets:
        """The velocity keywords of ``num`` candidates of ``size`` x ``size`` frames, drawn from
        ``gen`` (the warp offsets first, so a warp-only exploration draws what it always drew)."""
        offsets = {}
        warp = warp_exploration_offsets(num, self.warp, size, gen)
        if warp is not None:
            offsets["affine_offset"] = warp
        if self.action > 0:
            offsets["action_offset"] = self.action * torch.randn(
                num, MOVEMENT_KEYS, generator=gen, device=gen.device)
        return offsets


NO_EXPLORATION = MotionExploration()


def warp_exploration_offsets(num: int, strength: float, size: int, gen: torch.Generator
                             ) -> Tensor | None:
    """Random camera motions ``[num, 6]`` as affine-flow parameters
    (:func:`wc_fast.models.tiny.dit.affine_flow`): a shift in x and in y and a zoom, each a
    normal of standard deviation ``strength`` pixels per frame (the zoom's at the image edge,
    ``size / 2`` pixels from the centre). ``None`` for ``strength = 0``."""
    if strength == 0:
        return None
    z = torch.randn(num, 3, generator=gen, device=gen.device) * strength
    offset = torch.zeros(num, 6, device=gen.device)
    offset[:, 0], offset[:, 3] = z[:, 0], z[:, 1]
    offset[:, 1] = offset[:, 5] = z[:, 2] / (size / 2)
    return offset


@torch.no_grad()
def rollout_clip_level(model: WorldModel, sampler: ClipSampler, prompt: Tensor,
                       actions: Tensor, clip_index: int, group_size: int, gen: torch.Generator,
                       *, grpo: GRPOConfig | None = None,
                       explore: MotionExploration = NO_EXPLORATION) -> GroupRollout:
    """History once, then ``group_size`` candidates of clip ``clip_index`` in one batch; with
    ``grpo``, sampled by :meth:`ClipSampler.sample_sde` with its ``same_noise`` and ``window``;
    with ``explore``, each candidate under its own random camera motion (the history is
    generated without; a GRPO trajectory's log-probabilities are then the offset policy's)."""
    f = model.clip_frames
    history, history_actions, cache = generate_history(model, sampler, prompt, actions,
                                                       clip_index - 1, gen)
    clip_actions = actions[(clip_index - 1) * f:clip_index * f]
    if grpo is None:
        sampled = sampler.sample(cache, clip_actions, num=group_size, generator=gen,
                                 offsets=explore.offsets(group_size, prompt.shape[-1], gen))
    else:
        sampled = sampler.sample_sde(cache, clip_actions, num=group_size, generator=gen,
                                     same_noise=grpo.same_noise, window=grpo.window,
                                     offsets=explore.offsets(group_size, prompt.shape[-1], gen))
    latents = noise_latents(sampled.noise).expand(group_size, -1)
    return GroupRollout(history, history_actions, [cache], model.bound_frames(sampled.clips),
                        clip_actions, clip_index, latents, sampled.trajectory)


@torch.no_grad()
def rollout_sample_level(model: WorldModel, sampler: ClipSampler, prompt: Tensor,
                         actions: Tensor, clip_index: int, group_size: int, gen: torch.Generator,
                         *, explore: MotionExploration = NO_EXPLORATION) -> GroupRollout:
    """Each candidate generates its whole sequence ``1..clip_index`` (its own history); with
    ``explore``, its last clip under its own random camera motion."""
    f = model.clip_frames
    clip_actions = actions[(clip_index - 1) * f:clip_index * f]
    histories, caches, candidates, latents = [], [], [], []
    for _ in range(group_size):
        history, history_actions, cache = generate_history(model, sampler, prompt, actions,
                                                           clip_index - 1, gen)
        sampled = sampler.sample(cache, clip_actions, num=1, generator=gen,
                                 offsets=explore.offsets(1, prompt.shape[-1], gen))
        histories.append(history)
        caches.append(cache)
        candidates.append(model.bound_frames(sampled.clips))
        latents.append(noise_latents(sampled.noise))
    return GroupRollout(torch.cat(histories), history_actions.expand(group_size, -1), caches,
                        torch.cat(candidates), clip_actions, clip_index, torch.cat(latents))
