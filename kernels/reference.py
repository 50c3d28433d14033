"""Plain-PyTorch references of the drop-in ops. These functions ARE the spec.

Every fast backend (Triton, native C++) is tested against them. They are written for clarity,
not speed: they materialize every intermediate and let autograd derive the gradients.
Inputs are validated by the public entry points in ``kernels/``, not here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["nft_loss", "flow_noise", "prefix_attention", "sde_log_prob", "grpo_sde_loss",
           "compute_dtype"]

X0_WEIGHT_FLOOR = 1e-5


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    v_target: Tensor,
    r: Tensor,
    *,
    beta: float = 1.0,
    sigma: Tensor | None = None,
    space: str = "velocity",
) -> Tensor:
    """Per-sample negative-aware flow-matching loss ``[B]`` (docs/design.md section 7).

    ``v_theta``, ``v_old``, ``v_target``: ``[B, ...]``; ``r``, ``sigma``: ``[B]``.
    ``v+ = (1-beta) v_old + beta v_theta`` is pulled toward ``v_target`` with weight ``r`` and
    ``v- = (1+beta) v_old - beta v_theta`` with weight ``1 - r``. In ``x0`` space each term is
    the squared x0 error ``e = -sigma (v -+ v*)`` divided by its own detached mean absolute error.
    Only ``v_theta`` receives a gradient.
    """
    acc = compute_dtype(v_theta.dtype)
    b = v_theta.shape[0]
    vt = v_theta.reshape(b, -1).to(acc)
    vo = v_old.detach().reshape(b, -1).to(acc)
    vs = v_target.detach().reshape(b, -1).to(acc)
    rr = r.detach().to(acc)
    v_pos = (1.0 - beta) * vo + beta * vt
    v_neg = (1.0 + beta) * vo - beta * vt
    if space == "velocity":
        l_pos = ((v_pos - vs) ** 2).mean(dim=1)
        l_neg = ((v_neg - vs) ** 2).mean(dim=1)
    elif space == "x0":
        s = sigma.detach().to(acc).reshape(b, 1)
        e_pos = -s * (v_pos - vs)
        e_neg = -s * (v_neg - vs)
        w_pos = e_pos.abs().mean(dim=1).clamp_min(X0_WEIGHT_FLOOR).detach()
        w_neg = e_neg.abs().mean(dim=1).clamp_min(X0_WEIGHT_FLOOR).detach()
        l_pos = (e_pos**2).mean(dim=1) / w_pos
        l_neg = (e_neg**2).mean(dim=1) / w_neg
    else:
        raise ValueError(f"space must be 'velocity' or 'x0', got {space!r}")
    return rr * l_pos + (1.0 - rr) * l_neg


def flow_noise(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """Noisy samples and velocity targets for K sigmas per clean sample.

    ``x0`` ``[S, ...]``, ``sigmas`` ``[S, K]``, ``noise`` ``[S*K, ...]`` ->
    ``x_t, v_target`` ``[S*K, ...]`` where row ``s*K + j`` is
    ``x_t = (1 - sigmas[s, j]) * x0[s] + sigmas[s, j] * noise[s*K + j]`` and
    ``v_target = noise[s*K + j] - x0[s]``. Outputs have ``x0``'s dtype.
    """
    acc = compute_dtype(x0.dtype)
    s, k = sigmas.shape
    x = x0.to(acc).repeat_interleave(k, dim=0)
    eps = noise.to(acc)
    sig = sigmas.to(acc).reshape(s * k, *([1] * (x0.dim() - 1)))
    x_t = (1.0 - sig) * x + sig * eps
    v_target = eps - x
    return x_t.to(x0.dtype), v_target.to(x0.dtype)


def prefix_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """Softmax attention of each batch row over ``cat(prefix, own keys)``, no mask.

    ``q, k, v`` ``[B, H, L, D]``; ``prefix_k, prefix_v`` ``[1, H, P, D]`` shared by all rows
    (``P`` may be 0). The prefix is replicated per row here, which is exactly what the fast
    backends avoid. Scores and softmax in fp32 (fp64 for fp64 inputs); output in ``q``'s dtype.
    """
    acc = compute_dtype(q.dtype)
    b = q.shape[0]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    keys = torch.cat([prefix_k.expand(b, -1, -1, -1), k], dim=2).to(acc)
    values = torch.cat([prefix_v.expand(b, -1, -1, -1), v], dim=2).to(acc)
    scores = torch.einsum("bhld,bhmd->bhlm", q.to(acc), keys) * scale
    out = torch.einsum("bhlm,bhmd->bhld", scores.softmax(dim=-1), values)
    return out.to(q.dtype)


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
