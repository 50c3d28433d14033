"""The GRPO SDE loss reference against a literal float64 transcription of the published
formula (scalar loops over samples and elements), over every clipping branch and the
``sigma == 1`` guard."""

import math

import pytest
import torch

from wc_kernels import reference

NOISE_LEVEL, CLIP, ADV_MAX, SIGMA_MAX = 0.7, 0.2, 5.0, 0.98


def _literal(m, x, prev, sigma, sigma_next, old_lp, adv, ref, kl_beta, sigma_max):
    """Loss, log_prob and kl from Python floats, one sample and one element at a time."""
    losses, log_probs, kls = [], [], []
    for b in range(m.shape[0]):
        sig, sig_next = float(sigma[b]), float(sigma_next[b])
        dt = sig_next - sig
        s = sigma_max if sig == 1.0 else sig
        std = NOISE_LEVEL * math.sqrt(sig / (1 - s))
        elems = m[b].flatten().tolist(), x[b].flatten().tolist(), prev[b].flatten().tolist()
        refs = ref[b].flatten().tolist() if ref is not None else None
        lp_sum = kl_sum = 0.0
        for i, (mo, sa, pr) in enumerate(zip(*elems, strict=True)):
            mean = (sa * (1 + std**2 / (2 * sig) * dt)
                    + mo * (1 + std**2 * (1 - sig) / (2 * sig)) * dt)
            lp_sum += (-(pr - mean) ** 2 / (2 * std**2 * (-dt)) - math.log(std * math.sqrt(-dt))
                       - math.log(math.sqrt(2 * math.pi)))
            if refs is not None:
                mean_ref = (sa * (1 + std**2 / (2 * sig) * dt)
                            + refs[i] * (1 + std**2 * (1 - sig) / (2 * sig)) * dt)
                kl_sum += (mean - mean_ref) ** 2
        n = len(elems[0])
        log_prob = lp_sum / n
        ratio = math.exp(log_prob - float(old_lp[b]))
        a = min(max(float(adv[b]), -ADV_MAX), ADV_MAX)
        losses.append(max(-a * ratio, -a * min(max(ratio, 1 - CLIP), 1 + CLIP)))
        log_probs.append(log_prob)
        kls.append(kl_sum / n / (2 * std**2))
    loss = sum(losses) / len(losses) + kl_beta * sum(kls) / len(kls)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64)
    return loss, as_tensor(log_probs), as_tensor(kls)


def _case(with_ref):
    """Six samples: sigma == 1 in the first; ratios below, inside and above the clip range
    with advantages of both signs and beyond adv_clip_max."""
    g = torch.Generator().manual_seed(3)
    b, shape = 6, (3, 5)
    m, x, ref = (torch.randn(b, *shape, generator=g, dtype=torch.float64) for _ in range(3))
    sigma = torch.tensor([1.0, 0.9, 0.7, 0.5, 0.3, 0.1], dtype=torch.float64)
    sigma_next = sigma - torch.tensor([0.02, 0.05, 0.1, 0.03, 0.2, 0.1], dtype=torch.float64)
    std = reference.sde_std(sigma, NOISE_LEVEL, SIGMA_MAX)
    mean = reference.sde_step_mean(m, x, sigma, sigma_next, std)
    noise = torch.randn(b, *shape, generator=g, dtype=torch.float64)
    prev = mean + (std * (sigma - sigma_next).sqrt()).view(-1, 1, 1) * noise
    lp = reference.sde_log_prob(m, x, prev, sigma, sigma_next, noise_level=NOISE_LEVEL,
                                sigma_max=SIGMA_MAX)
    # log ratios: far below, just below, inside, inside, just above, far above the clip range
    log_ratio = torch.tensor([-1.0, -0.25, -0.1, 0.1, 0.2, 1.0], dtype=torch.float64)
    adv = torch.tensor([1.5, -2.0, 7.0, -0.5, 3.0, -9.0], dtype=torch.float64)
    return m, x, prev, sigma, sigma_next, lp - log_ratio, adv, ref if with_ref else None


@pytest.mark.parametrize("with_ref, kl_beta", [(False, 0.0), (True, 0.0), (True, 0.3)])
@pytest.mark.parametrize("advantage_sign", [1.0, -1.0])
def test_reference_matches_the_literal_formula(with_ref, kl_beta, advantage_sign):
    m, x, prev, sigma, sigma_next, old_lp, adv, ref = _case(with_ref)
    adv = adv * advantage_sign
    loss, log_prob, kl = reference.grpo_sde_loss(
        m, x, prev, sigma, sigma_next, old_lp, adv, noise_level=NOISE_LEVEL, clip_range=CLIP,
        adv_clip_max=ADV_MAX, sigma_max=SIGMA_MAX, ref_output=ref, kl_beta=kl_beta)
    want_loss, want_lp, want_kl = _literal(m, x, prev, sigma, sigma_next, old_lp, adv, ref,
                                           kl_beta, SIGMA_MAX)
    torch.testing.assert_close(log_prob, want_lp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kl, want_kl, rtol=1e-12, atol=1e-12)
    assert loss.item() == pytest.approx(want_loss, rel=1e-12, abs=1e-12)


def test_case_covers_every_clipping_branch():
    """The fixture's ratios fall below, inside and above the clip range, and some advantages
    beyond adv_clip_max, so each branch of max/clamp decides at least one sample."""
    m, x, prev, sigma, sigma_next, old_lp, adv, _ = _case(False)
    lp = reference.sde_log_prob(m, x, prev, sigma, sigma_next, noise_level=NOISE_LEVEL,
                                sigma_max=SIGMA_MAX)
    ratio = (lp - old_lp).exp()
    assert (ratio < 1 - CLIP).any() and (ratio > 1 + CLIP).any()
    assert ((ratio > 1 - CLIP) & (ratio < 1 + CLIP)).any()
    assert (adv.abs() > ADV_MAX).any() and (adv > 0).any() and (adv < 0).any()


def test_sigma_one_uses_sigma_max():
    sigma = torch.tensor([1.0, 0.5], dtype=torch.float64)
    std = reference.sde_std(sigma, NOISE_LEVEL, SIGMA_MAX)
    assert std[0].item() == pytest.approx(NOISE_LEVEL * math.sqrt(1 / (1 - SIGMA_MAX)))
    assert std[1].item() == pytest.approx(NOISE_LEVEL * math.sqrt(0.5 / 0.5))
