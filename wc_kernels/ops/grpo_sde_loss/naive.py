"""Plain-PyTorch references of ``grpo_sde_loss`` and ``sde_log_prob``, with the SDE step's
std and mean they share: the spec every fast backend is tested against.

Written for clarity, not speed: they materialize every intermediate and let autograd derive
the gradients. Inputs are validated by the public ops in :mod:`wc_kernels.grpo_sde_loss`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_kernels._dtypes import compute_dtype


def sde_std(sigma: Tensor, noise_level: float, sigma_max: float | None) -> Tensor:
    """Flow-GRPO's SDE noise scale ``noise_level * sqrt(sigma / (1 - s))`` ``[B]``, with
    ``s = sigma_max`` where ``sigma == 1`` (so the first step stays finite), else ``sigma``."""
    s = sigma if sigma_max is None else torch.where(sigma == 1.0, sigma_max, sigma)
    return noise_level * torch.sqrt(sigma / (1.0 - s))


def sde_step_mean(model_output: Tensor, sample: Tensor, sigma: Tensor, sigma_next: Tensor,
                  std: Tensor) -> Tensor:
    """Mean of the SDE step from ``sample`` ``[B, ...]`` (velocity ``model_output``) in the
    compute dtype; ``sigma, sigma_next, std`` ``[B]``."""
    acc = compute_dtype(model_output.dtype)
    view = (-1,) + (1,) * (model_output.dim() - 1)
    sig, dt = sigma.to(acc).view(view), (sigma_next.to(acc) - sigma.to(acc)).view(view)
    var = std.to(acc).view(view) ** 2
    return (sample.to(acc) * (1.0 + var / (2.0 * sig) * dt)
            + model_output.to(acc) * (1.0 + var * (1.0 - sig) / (2.0 * sig)) * dt)


def sde_log_prob(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                 sigma_next: Tensor, *, noise_level: float, sigma_max: float | None = None
                 ) -> Tensor:
    """Per-sample Gaussian log-probability ``[B]`` (mean over elements) of ``prev_sample``
    under the flow-matching SDE step (Flow-GRPO / DanceGRPO). ``[B, ...]`` tensors,
    ``sigma, sigma_next`` ``[B]`` with ``sigma_next < sigma``. fp32 (fp64 for fp64 inputs)."""
    acc = compute_dtype(model_output.dtype)
    b = model_output.shape[0]
    std = sde_std(sigma.to(acc), noise_level, sigma_max)
    neg_dt = sigma.to(acc) - sigma_next.to(acc)
    mean = sde_step_mean(model_output, sample.detach(), sigma, sigma_next, std)
    view = (-1,) + (1,) * (model_output.dim() - 1)
    var = (std**2 * neg_dt).view(view)
    log_p = (-(prev_sample.detach().to(acc) - mean) ** 2 / (2.0 * var)
             - torch.log(std * torch.sqrt(neg_dt)).view(view)
             - math.log(math.sqrt(2.0 * math.pi)))
    return log_p.reshape(b, -1).mean(dim=1)


def grpo_sde_loss(model_output: Tensor, sample: Tensor, prev_sample: Tensor, sigma: Tensor,
                  sigma_next: Tensor, old_log_prob: Tensor, advantage: Tensor, *,
                  noise_level: float, clip_range: float, adv_clip_max: float,
                  sigma_max: float | None = None, ref_output: Tensor | None = None,
                  kl_beta: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """GRPO's PPO-clipped SDE loss: ``(loss, log_prob [B], kl [B])``.

    ``loss = mean_b(max(-A r, -A clamp(r, 1-clip, 1+clip))) + kl_beta * mean_b(kl)`` with
    ``r = exp(log_prob - old_log_prob)``, ``A = clamp(advantage, +-adv_clip_max)`` and
    ``kl = mean((mean - mean_ref)^2) / (2 std^2)`` (zeros without ``ref_output``). Only
    ``model_output`` receives a gradient.
    """
    acc = compute_dtype(model_output.dtype)
    b = model_output.shape[0]
    log_prob = sde_log_prob(model_output, sample, prev_sample, sigma, sigma_next,
                            noise_level=noise_level, sigma_max=sigma_max)
    ratio = torch.exp(log_prob - old_log_prob.detach().to(acc))
    adv = advantage.detach().to(acc).clamp(-adv_clip_max, adv_clip_max)
    per_sample = torch.maximum(-adv * ratio,
                               -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range))
    kl = torch.zeros_like(log_prob)
    if ref_output is not None:
        std = sde_std(sigma.to(acc), noise_level, sigma_max)
        mean = sde_step_mean(model_output, sample.detach(), sigma, sigma_next, std)
        mean_ref = sde_step_mean(ref_output.detach(), sample.detach(), sigma, sigma_next, std)
        kl = ((mean - mean_ref) ** 2).reshape(b, -1).mean(dim=1) / (2.0 * std**2)
    loss = per_sample.mean() + kl_beta * kl.mean()
    return loss, log_prob, kl
