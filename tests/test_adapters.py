"""The DiffusionNFT and official WorldCompass adapters against float64 transcriptions of those
codebases' training losses: values and gradients w.r.t. the trained prediction."""

import pytest
import torch

from wc_kernels import (
    _backend,
    advantages_to_optimality,
    diffusion_nft_loss,
    worldcompass_nft_loss,
)

BACKENDS = ["reference"] + (["native"] if _backend.native_built() else [])
F64 = torch.float64


def _dims(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(1, x.dim()))


def _nft_advantages_to_r(adv, adv_clip_max, adv_mode):
    """Advantage clipping, adv_mode and the mapping to r, as DiffusionNFT's training step
    writes them."""
    a = torch.clamp(adv, -adv_clip_max, adv_clip_max)
    if adv_mode == "positive_only":
        a = torch.clamp(a, 0, adv_clip_max)
    elif adv_mode == "negative_only":
        a = torch.clamp(a, -adv_clip_max, 0)
    elif adv_mode == "one_only":
        a = torch.where(a > 0, torch.ones_like(a), torch.zeros_like(a))
    elif adv_mode == "binary":
        a = torch.sign(a)
    return torch.clamp((a / adv_clip_max) / 2.0 + 0.5, 0, 1)


def diffusion_nft_transcription(forward_prediction, old_prediction, ref_prediction, xt, x0, t,
                                advantages, *, beta, adv_clip_max, adv_mode, kl_weight):
    """DiffusionNFT's loss for one timestep, float64: the policy loss with per-sample adaptive
    weights, times adv_clip_max / beta, plus kl_weight times the mean squared distance to the
    reference prediction. Transcribed from NVlabs/DiffusionNFT, scripts/train_nft_sd3.py (the
    "Policy Gradient Loss" block of the training loop)."""
    t_ = t.view(-1, *([1] * (x0.dim() - 1)))
    r = _nft_advantages_to_r(advantages, adv_clip_max, adv_mode)
    positive = beta * forward_prediction + (1 - beta) * old_prediction.detach()
    negative = (1.0 + beta) * old_prediction.detach() - beta * forward_prediction
    x0_pos = xt - t_ * positive
    x0_neg = xt - t_ * negative
    with torch.no_grad():
        w_pos = (x0_pos - x0).abs().mean(dim=_dims(x0), keepdim=True).clip(min=1e-5)
        w_neg = (x0_neg - x0).abs().mean(dim=_dims(x0), keepdim=True).clip(min=1e-5)
    loss_pos = ((x0_pos - x0) ** 2 / w_pos).mean(dim=_dims(x0))
    loss_neg = ((x0_neg - x0) ** 2 / w_neg).mean(dim=_dims(x0))
    per_sample = r * loss_pos / beta + (1.0 - r) * loss_neg / beta
    loss = (per_sample * adv_clip_max).mean()
    if kl_weight:
        kl = ((forward_prediction - ref_prediction) ** 2).mean(dim=_dims(x0))
        loss = loss + kl_weight * kl.mean()
    return loss


def worldcompass_transcription(model_pred, model_pred_old, noisy_latents, x0, sigmas,
                               advantages, *, update_latent_num, adv_clip_max):
    """The official WorldCompass loss, float64, latents [B, C, T, H, W]: each sample at its own
    scalar sigma as their batch-1 step runs it, averaged over the batch. Transcribed from
    Tencent-Hunyuan/HY-WorldPlay, worldcompass/fastvideo/training/
    world_compass_in_train_pipeline.py (_nft_forward_and_compute_loss)."""
    losses = []
    for b in range(model_pred.shape[0]):
        sigma = float(sigmas[b])
        pred, pred_old = model_pred[b:b + 1], model_pred_old[b:b + 1]
        a = torch.clamp(advantages[b:b + 1], -adv_clip_max, adv_clip_max)
        r = torch.clamp((a / adv_clip_max) / 2.0 + 0.5, 0, 1)
        negative = 2 * pred_old.detach() - pred
        target = x0[b:b + 1, :, -update_latent_num:]
        noisy = noisy_latents[b:b + 1, :, -update_latent_num:]
        pos_x0 = noisy - sigma * pred[:, :, -update_latent_num:]
        neg_x0 = noisy - sigma * negative[:, :, -update_latent_num:]
        with torch.no_grad():
            w_pos = (pos_x0 - target).abs().mean(dim=_dims(pos_x0), keepdim=True).clip(min=1e-5)
            w_neg = (neg_x0 - target).abs().mean(dim=_dims(neg_x0), keepdim=True).clip(min=1e-5)
        loss_pos = ((pos_x0 - target) ** 2 / w_pos).mean(dim=_dims(pos_x0))
        loss_neg = ((neg_x0 - target) ** 2 / w_neg).mean(dim=_dims(neg_x0))
        losses.append(r * loss_pos + (1.0 - r) * loss_neg)
    return torch.cat(losses).mean()


def _nft_case(b=5, shape=(3, 4, 6), seed=0):
    """float64 step inputs; advantages inside and beyond the clip range, of both signs."""
    g = torch.Generator().manual_seed(seed)
    x0, noise, v, v_old, v_ref = (torch.randn(b, *shape, generator=g, dtype=F64)
                                  for _ in range(5))
    t = torch.tensor([0.95, 0.6, 0.3, 0.1, 0.02], dtype=F64)[:b]
    xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
    adv = torch.tensor([7.0, -1.2, 0.0, 2.5, -6.0], dtype=F64)[:b]
    return v, v_old, v_ref, xt, x0, t, adv


def _grad(fn, v):
    v = v.clone().requires_grad_()
    loss = fn(v)
    (grad,) = torch.autograd.grad(loss, v)
    return loss.detach(), grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("adv_mode", ["all", "positive_only", "negative_only", "one_only",
                                      "binary"])
@pytest.mark.parametrize("beta, kl_weight", [(1.0, 0.0), (0.1, 0.0), (0.1, 0.3)])
def test_diffusion_nft_matches_the_transcription(backend, adv_mode, beta, kl_weight):
    v, v_old, v_ref, xt, x0, t, adv = _nft_case()
    opts = dict(beta=beta, adv_clip_max=5.0, adv_mode=adv_mode, kl_weight=kl_weight)
    want, want_grad = _grad(lambda p: diffusion_nft_transcription(
        p, v_old, v_ref, xt, x0, t, adv, **opts), v)
    got, got_grad = _grad(lambda p: diffusion_nft_loss(
        p, v_old, xt, x0, t, adv, v_ref=v_ref, backend=backend, **opts), v)
    # the native kernel uses r and t in fp32
    tol = 1e-12 if backend == "reference" else 1e-6
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(got_grad, want_grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_diffusion_nft_fp32_and_bf16_predictions(backend):
    """fp32 step inputs, and a bf16 prediction against fp32 latents (autocast), against the
    float64 transcription; scale stands for 1 / effective_grad_accum_steps."""
    v, v_old, v_ref, xt, x0, t, adv = _nft_case(seed=1)
    opts = dict(beta=0.5, adv_clip_max=2.0, adv_mode="all", kl_weight=1e-2)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-5)):
        p = v.to(dtype)  # the prediction as the model returns it
        po, pr = v_old.to(dtype), v_ref.to(dtype)
        want, want_grad = _grad(lambda q, po=po, pr=pr: diffusion_nft_transcription(
            q, po.double(), pr.double(), xt, x0, t, adv, **opts) / 4, p.double())
        got, got_grad = _grad(lambda q, po=po, pr=pr: diffusion_nft_loss(
            q, po, xt.float(), x0.float(), t.float(), adv.float(), v_ref=pr, scale=0.25,
            backend=backend, **opts), p)
        assert got.dtype == torch.float32 and got_grad.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
        # a bf16 gradient holds 8 significant bits
        grad_tol = tol if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got_grad.double(), want_grad, rtol=grad_tol, atol=grad_tol)


def test_diffusion_nft_at_t_zero_gives_no_loss_or_gradient():
    v, v_old, v_ref, xt, x0, t, adv = _nft_case()
    t = torch.zeros_like(t)
    xt = x0.clone()
    got, got_grad = _grad(lambda p: diffusion_nft_loss(p, v_old, xt, x0, t, adv), v)
    want, want_grad = _grad(lambda p: diffusion_nft_transcription(
        p, v_old, v_ref, xt, x0, t, adv, beta=1.0, adv_clip_max=5.0, adv_mode="all",
        kl_weight=0.0), v)
    assert got.item() == want.item() == 0.0
    assert not got_grad.any() and not want_grad.any()


def _wc_case(b=3, c=4, frames=7, seed=2):
    """float64 inputs in the official layout [B, C, T, H, W]."""
    g = torch.Generator().manual_seed(seed)
    x0, noise, v, v_old = (torch.randn(b, c, frames, 3, 5, generator=g, dtype=F64)
                           for _ in range(4))
    sigma = torch.tensor([0.9, 0.4, 0.12], dtype=F64)[:b]
    xt = (1 - sigma.view(-1, 1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1, 1) * noise
    adv = torch.tensor([3.0, -0.7, -2.5], dtype=F64)[:b]
    return v, v_old, xt, x0, sigma, adv


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("old", ["overwritten", "ema"])
@pytest.mark.parametrize("layout", ["BCFHW", "BFCHW"])
@pytest.mark.parametrize("num_frames", [1, 4, 7])
def test_worldcompass_matches_the_transcription(backend, old, layout, num_frames):
    v, v_old, xt, x0, sigma, adv = _wc_case()
    # the official code overwrites the old model's prediction with the current one
    want, want_grad = _grad(lambda p: worldcompass_transcription(
        p, p if old == "overwritten" else v_old, xt, x0, sigma, adv,
        update_latent_num=num_frames, adv_clip_max=2.0), v)
    # ours in [B, F, C, H, W] is the same data with frames second
    to = (lambda x: x) if layout == "BCFHW" else (lambda x: x.transpose(1, 2).contiguous())
    frame_dim = 2 if layout == "BCFHW" else 1
    got, got_grad = _grad(lambda p: worldcompass_nft_loss(
        p, to(xt), to(x0), sigma, adv, num_frames, v_old=None if old == "overwritten"
        else to(v_old), frame_dim=frame_dim, backend=backend), to(v))
    tol = 1e-12 if backend == "reference" else 1e-6
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(got_grad, to(want_grad), rtol=tol, atol=tol)
    # frames before the trailing ones get no gradient
    assert not got_grad.narrow(frame_dim, 0, 7 - num_frames).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_worldcompass_scalar_sigma_fp32_and_grad_accumulation(backend):
    """Their batch-1 step: a Python float sigma, fp32 tensors, the loss divided by
    gradient_accumulation_steps."""
    v, _, xt, x0, _, adv = _wc_case(b=1, seed=4)
    sigma = 0.6
    xt = 0.4 * x0 + 0.6 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(5),
                                       dtype=F64)
    sigmas = torch.tensor([sigma], dtype=F64)
    want, want_grad = _grad(lambda p: worldcompass_transcription(
        p, p, xt, x0, sigmas, adv, update_latent_num=4, adv_clip_max=2.0) / 2, v)
    got, got_grad = _grad(lambda p: worldcompass_nft_loss(
        p, xt.float(), x0.float(), sigma, adv.float(), 4, frame_dim=2, scale=0.5,
        backend=backend), v.float())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-5, atol=1e-7)


def test_optimality_mapping():
    adv = torch.tensor([-9.0, -2.0, -1.0, 0.0, 0.5, 2.0, 9.0])
    torch.testing.assert_close(advantages_to_optimality(adv, 2.0),
                               torch.tensor([0.0, 0.0, 0.25, 0.5, 0.625, 1.0, 1.0]))
    torch.testing.assert_close(advantages_to_optimality(adv, 2.0, adv_mode="one_only"),
                               torch.tensor([0.5, 0.5, 0.5, 0.5, 0.75, 0.75, 0.75]))


def test_bad_arguments_raise_naming_them():
    v, v_old, v_ref, xt, x0, t, adv = _nft_case()
    with pytest.raises(ValueError, match="v_ref"):
        diffusion_nft_loss(v, v_old, xt, x0, t, adv, kl_weight=0.1)
    with pytest.raises(ValueError, match="adv_mode"):
        diffusion_nft_loss(v, v_old, xt, x0, t, adv, adv_mode="positive")
    with pytest.raises(ValueError, match="advantages"):
        diffusion_nft_loss(v, v_old, xt, x0, t, adv[:2])
    with pytest.raises(ValueError, match="beta"):
        diffusion_nft_loss(v, v_old, xt, x0, t, adv, beta=0.0)
    with pytest.raises(ValueError, match="x0"):
        diffusion_nft_loss(v, v_old, xt, x0[:, :2], t, adv)
    w, _, wxt, wx0, sigma, wadv = _wc_case()
    with pytest.raises(ValueError, match="num_frames"):
        worldcompass_nft_loss(w, wxt, wx0, sigma, wadv, 8, frame_dim=2)
    with pytest.raises(ValueError, match="frame_dim"):
        worldcompass_nft_loss(w, wxt, wx0, sigma, wadv, 2, frame_dim=0)
    with pytest.raises(ValueError, match="sigma"):
        worldcompass_nft_loss(w, wxt, wx0, 1.5, wadv, 2, frame_dim=2)


@pytest.mark.parametrize("adapter", ["diffusion_nft", "worldcompass"])
def test_triton_backend_fp32(adapter):
    """The Triton kernels (the CUDA path; here under the interpreter) in fp32."""
    if adapter == "diffusion_nft":
        v, v_old, v_ref, xt, x0, t, adv = _nft_case(seed=6)
        opts = dict(beta=0.3, adv_clip_max=5.0, adv_mode="all", kl_weight=0.2)
        want, want_grad = _grad(lambda p: diffusion_nft_transcription(
            p, v_old, v_ref, xt, x0, t, adv, **opts), v)
        got, got_grad = _grad(lambda p: diffusion_nft_loss(
            p, v_old.float(), xt.float(), x0.float(), t.float(), adv.float(),
            v_ref=v_ref.float(), backend="triton", **opts), v.float())
    else:
        v, v_old, xt, x0, sigma, adv = _wc_case(seed=6)
        want, want_grad = _grad(lambda p: worldcompass_transcription(
            p, v_old, xt, x0, sigma, adv, update_latent_num=3, adv_clip_max=2.0), v)
        got, got_grad = _grad(lambda p: worldcompass_nft_loss(
            p, xt.float(), x0.float(), sigma.float(), adv.float(), 3, v_old=v_old.float(),
            frame_dim=2, backend="triton"), v.float())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-5, atol=1e-7)
