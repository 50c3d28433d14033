"""Other codebases' NFT training losses, computed through the fused :func:`nft_loss`.

- :func:`diffusion_nft_loss`: the policy loss (and optional KL term) of DiffusionNFT's training
  step (``NVlabs/DiffusionNFT``, ``scripts/train_nft_sd3.py``).
- :func:`worldcompass_nft_loss`: the loss of the official WorldCompass training step
  (``Tencent-Hunyuan/HY-WorldPlay``, ``worldcompass/fastvideo/training/
  world_compass_in_train_pipeline.py``), on the last latent frames of full latents.

Both take what those training steps hold (noisy and clean latents, the noise level, raw
advantages, the predictions) and return the scalar loss to call ``backward()`` on. Their x0
error ``x_t - t v - x0`` is ``nft_loss``'s ``space="x0"`` error ``-t (v - v*)`` with the
velocity target ``v* = (x_t - x0) / t``, which the adapters form once; the loss and its
gradient then come from one fused op.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wc_kernels import _checks
from wc_kernels._dtypes import compute_dtype
from wc_kernels.ops.nft_loss import nft_loss

__all__ = ["advantages_to_optimality", "diffusion_nft_loss", "worldcompass_nft_loss"]

ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite float, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


def advantages_to_optimality(advantages: Tensor, adv_clip_max: float, *,
                             adv_mode: str = "all") -> Tensor:
    """Optimality ``r`` ``[B]`` in [0, 1] from raw advantages ``[B]``, as DiffusionNFT and the
    official WorldCompass code map them: ``A`` clipped to ``[-adv_clip_max, adv_clip_max]``,
    then ``r = clip(A / adv_clip_max / 2 + 1/2, 0, 1)``.

    ``adv_mode`` is DiffusionNFT's ``config.train.adv_mode``, applied after the clip:
    ``"all"`` keeps ``A``; ``"positive_only"`` / ``"negative_only"`` zero the negative /
    positive part; ``"one_only"`` maps ``A > 0`` to 1 and the rest to 0; ``"binary"`` takes
    ``sign(A)``.
    """
    _checks.check_tensor("advantages", advantages)
    if advantages.dim() != 1:
        raise ValueError(f"advantages must have shape [B], got {tuple(advantages.shape)}")
    _checks.check_finite("advantages", advantages)
    clip = _check_positive("adv_clip_max", adv_clip_max)
    _checks.check_choice("adv_mode", adv_mode, ADV_MODES)
    a = advantages.detach().clamp(-clip, clip)
    if adv_mode == "positive_only":
        a = a.clamp_min(0.0)
    elif adv_mode == "negative_only":
        a = a.clamp_max(0.0)
    elif adv_mode == "one_only":
        a = (a > 0).to(a.dtype)
    elif adv_mode == "binary":
        a = a.sign()
    return (a / clip / 2.0 + 0.5).clamp(0.0, 1.0)


def _velocity_target(x_t: Tensor, x0: Tensor, t: Tensor, dtype: torch.dtype) -> Tensor:
    """``v* = (x_t - x0) / t`` ``[B, ...]`` in ``dtype``, so that ``-t (v - v*)`` is the x0
    error ``x_t - t v - x0``; rows with ``t == 0`` (where ``x_t == x0``) get ``v* = 0``, their
    error being 0 for any ``v``. Computed in ``t``'s dtype (fp32 or fp64), rounded once."""
    view = (-1,) + (1,) * (x_t.dim() - 1)
    safe_t = torch.where(t > 0, t, torch.ones_like(t)).view(view)
    return ((x_t.detach().to(t.dtype) - x0.detach().to(t.dtype)) / safe_t).to(dtype)


def _common(v_theta: Tensor, tensors: dict[str, Tensor]) -> torch.dtype:
    """Check ``tensors`` against ``v_theta`` (shape, device) and return the dtype the loss
    expression promotes them to (fp32 for a bf16 prediction against fp32 latents)."""
    _checks.check_tensor("v_theta", v_theta, min_dim=2)
    dtype = v_theta.dtype
    for name, t in tensors.items():
        _checks.check_tensor(name, t)
        if t.shape != v_theta.shape:
            raise ValueError(f"{name} must have the shape of v_theta {tuple(v_theta.shape)}, "
                             f"got {tuple(t.shape)}")
        _checks.check_device(name, t, "v_theta", v_theta)
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _check_advantages(advantages: Tensor, v_theta: Tensor) -> None:
    _checks.check_tensor("advantages", advantages)
    _checks.check_shape("advantages", advantages, (v_theta.shape[0],), "one advantage per sample")
    _checks.check_device("advantages", advantages, "v_theta", v_theta)


def _per_sample(name: str, value: Tensor | float, v_theta: Tensor, dtype: torch.dtype) -> Tensor:
    """``value`` as a ``[B]`` tensor in the accumulation dtype of ``dtype`` (fp32, or fp64 for
    fp64); a float is broadcast to every sample."""
    b = v_theta.shape[0]
    dtype = compute_dtype(dtype)
    if not isinstance(value, Tensor):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float or a [B] tensor, got {value!r}")
        return torch.full((b,), float(value), dtype=dtype, device=v_theta.device)
    _checks.check_tensor(name, value)
    _checks.check_shape(name, value, (b,), "one value per sample")
    _checks.check_device(name, value, "v_theta", v_theta)
    return value.detach().to(dtype)


def diffusion_nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    x_t: Tensor,
    x0: Tensor,
    t: Tensor | float,
    advantages: Tensor,
    *,
    beta: float = 1.0,
    adv_clip_max: float = 5.0,
    adv_mode: str = "all",
    v_ref: Tensor | None = None,
    kl_weight: float = 0.0,
    scale: float = 1.0,
    backend: str = "auto",
) -> Tensor:
    """DiffusionNFT's training loss ``[]`` for one timestep of a micro-batch.

    Names in ``scripts/train_nft_sd3.py`` of NVlabs/DiffusionNFT:

    - ``v_theta`` ``[B, ...]``: ``forward_prediction`` (the trained model, gets the gradient);
    - ``v_old`` ``[B, ...]``: ``old_prediction`` (the "old" adapter, no gradient);
    - ``x_t`` ``[B, ...]``: ``xt = (1 - t) x0 + t noise``; ``x0`` ``[B, ...]``: ``x0``
      (``latents_clean``);
    - ``t`` ``[B]`` in [0, 1] (or one float): ``t = timesteps[:, j_idx] / 1000``;
    - ``advantages`` ``[B]``: ``train_sample_batch["advantages"][:, j_idx]`` (not clipped);
    - ``beta``: ``config.beta``; ``adv_clip_max``: ``config.train.adv_clip_max``;
      ``adv_mode``: ``config.train.adv_mode`` (see :func:`advantages_to_optimality`);
    - ``v_ref`` ``[B, ...]``: ``ref_forward_prediction``; ``kl_weight``: ``config.train.beta``
      (the KL term ``kl_weight * mean((v_theta - v_ref)^2)`` is added when non-zero);
    - ``scale``: ``1 / effective_grad_accum_steps`` to return their ``scaled_loss``.

    Returns ``scale * (mean_b(L_b * adv_clip_max / beta) + kl_weight * KL)`` with ``L_b`` the
    x0-space NFT loss of docs/design.md section 7 (adaptive weights ``mean|x0 error|``, no
    gradient through them). Tensors are promoted to a common dtype as the original expression
    promotes them; only ``v_theta`` receives a gradient.
    """
    if isinstance(kl_weight, bool) or not isinstance(kl_weight, (int, float)) \
            or not math.isfinite(kl_weight):
        raise TypeError(f"kl_weight must be a finite float, got {kl_weight!r}")
    tensors = {"v_old": v_old, "x_t": x_t, "x0": x0}
    if kl_weight != 0:
        if v_ref is None:
            raise ValueError("kl_weight != 0 needs v_ref (the reference model's prediction)")
        tensors["v_ref"] = v_ref
    dtype = _common(v_theta, tensors)
    beta = _check_positive("beta", beta)
    clip = _check_positive("adv_clip_max", adv_clip_max)
    sigma = _per_sample("t", t, v_theta, dtype)
    _check_advantages(advantages, v_theta)
    r = advantages_to_optimality(advantages, clip, adv_mode=adv_mode)
    v = v_theta.to(dtype)
    v_target = _velocity_target(x_t, x0, sigma, dtype)
    # their per-sample loss is r L+ / beta + (1 - r) L- / beta, averaged over the batch after
    # multiplying by adv_clip_max: both constants become nft_loss's scale
    loss = nft_loss(v, v_old.detach().to(dtype), v_target, r, beta=beta, sigma=sigma,
                    space="x0", reduction="mean", scale=scale * clip / beta, backend=backend)
    if kl_weight != 0:
        ref = v_ref.detach().to(dtype)
        # with beta = 1 and r = 1 the velocity-space NFT loss is mean((v_theta - v_target)^2)
        # (v+ = v_theta; the v- term has weight 1 - r = 0): the KL term, with target v_ref
        loss = loss + nft_loss(v, ref, ref, torch.ones_like(sigma), beta=1.0,
                               space="velocity", reduction="mean", scale=scale * kl_weight,
                               backend=backend, check_values=False)
    return loss


def worldcompass_nft_loss(
    v_theta: Tensor,
    x_t: Tensor,
    x0: Tensor,
    sigma: Tensor | float,
    advantages: Tensor,
    num_frames: int,
    *,
    v_old: Tensor | None = None,
    adv_clip_max: float = 2.0,
    frame_dim: int = 1,
    scale: float = 1.0,
    backend: str = "auto",
) -> Tensor:
    """The official WorldCompass training loss ``[]``, on the last ``num_frames`` latent frames.

    Names in ``_nft_forward_and_compute_loss`` of ``worldcompass/fastvideo/training/
    world_compass_in_train_pipeline.py`` (Tencent-Hunyuan/HY-WorldPlay):

    - ``v_theta`` ``[B, F, C, H, W]``: ``model_pred`` over all ``F`` latent frames (gets the
      gradient);
    - ``x_t``: ``noisy_latents``; ``x0``: ``pred_latents`` (their ``x0`` before slicing);
    - ``sigma`` (float or ``[B]``): ``sigma``, drawn from the shifted schedule;
    - ``advantages`` ``[B]``: ``total_advantages`` before the clamp (the reward-weighted sum
      of the per-reward advantages);
    - ``num_frames``: ``update_latent_num`` (``training_args.single_chunk_size``, 4 in their
      script): the trailing frames that enter the loss;
    - ``v_old``: ``model_pred_old``. Their code overwrites the EMA model's prediction with the
      current model's, so the default ``None`` uses ``v_theta`` detached; pass the old model's
      prediction for the loss the paper describes;
    - ``adv_clip_max``: ``training_args.adv_clip_max`` (2.0 in their script);
    - ``frame_dim``: 1 for ``[B, F, C, H, W]``; 2 for their ``[B, C, F, H, W]`` latents;
    - ``scale``: ``1 / gradient_accumulation_steps`` to return their ``final_loss``.

    Returns ``scale * mean_b(r_b L+_b + (1 - r_b) L-_b)``: the x0-space NFT loss with
    ``beta = 1`` (``v+ = v_theta``, ``v- = 2 v_old - v_theta``) over the trailing frames only,
    with ``r`` from :func:`advantages_to_optimality`. Their batch size is 1, where the batch
    mean is their loss. Only ``v_theta`` receives a gradient, zero on the frames before the
    trailing ones.
    """
    tensors = {"x_t": x_t, "x0": x0} if v_old is None else {"v_old": v_old, "x_t": x_t, "x0": x0}
    dtype = _common(v_theta, tensors)
    if not -v_theta.dim() <= frame_dim < v_theta.dim() or frame_dim % v_theta.dim() == 0:
        raise ValueError(f"frame_dim must name a non-batch dimension of v_theta "
                         f"{tuple(v_theta.shape)}, got {frame_dim}")
    frames = v_theta.shape[frame_dim]
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) \
            or not 1 <= num_frames <= frames:
        raise ValueError(f"num_frames must be an int in [1, {frames}] (the latent frames along "
                         f"dimension {frame_dim}), got {num_frames!r}")
    sigma = _per_sample("sigma", sigma, v_theta, dtype)
    _check_advantages(advantages, v_theta)
    r = advantages_to_optimality(advantages, adv_clip_max)

    def trailing(x: Tensor) -> Tensor:
        return x.narrow(frame_dim, frames - num_frames, num_frames)

    v = trailing(v_theta).to(dtype)
    old = v.detach() if v_old is None else trailing(v_old.detach()).to(dtype)
    v_target = _velocity_target(trailing(x_t), trailing(x0), sigma, dtype)
    return nft_loss(v, old, v_target, r, beta=1.0, sigma=sigma, space="x0", reduction="mean",
                    scale=scale, backend=backend)
