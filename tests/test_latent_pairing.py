"""``nft.latent_pairing``: which motion latents the update trains each kept candidate with."""

import pytest
import torch

from wc_fast.config import preset
from wc_fast.models import TinyWorldDiT
from wc_fast.models.motion_latent import noise_latents
from wc_fast.rl.trainer import Trainer
from wc_fast.rl.updates import NFTItems


def _items(pairing: str) -> tuple[NFTItems, torch.Tensor, torch.Tensor]:
    cfg = preset("smoke")
    cfg.model.motion_latent = True
    cfg.nft.latent_pairing = pairing
    torch.manual_seed(0)
    trainer = Trainer(cfg, TinyWorldDiT(cfg.model), torch.device("cpu"))
    (group, *_) = trainer.rollout(0, 1)
    chosen = torch.tensor([4, 0, 2])
    r = torch.rand(group.candidates.shape[0])
    item = trainer.rule.noised(trainer.device, 0, 0, group, r, chosen, 2)
    return item, group.latents[chosen].repeat_interleave(2, dim=0), chosen


def _noise(item: NFTItems) -> torch.Tensor:
    """The training noise behind ``x_t``: ``(x_t - (1 - s) x0) / s`` is ``v* + x0``, so
    ``eps = v* + x0`` with ``x0 = x_t - s v*``."""
    s = item.sigma.view(-1, *[1] * (item.x_t.dim() - 1))
    return item.v_target + item.x_t - s * item.v_target


def test_own_pairing_trains_each_candidate_with_the_latents_it_was_generated_from():
    item, own, _ = _items("own")
    torch.testing.assert_close(item.motion, own)
    torch.testing.assert_close(noise_latents(_noise(item)), own, rtol=1e-5, atol=1e-5)


def test_fresh_pairing_trains_with_the_latents_of_the_fresh_training_noise():
    item, own, _ = _items("fresh")
    torch.testing.assert_close(item.motion, noise_latents(_noise(item)), rtol=1e-5,
                               atol=1e-5)
    assert not torch.allclose(item.motion, own)


def test_unknown_pairing_is_refused():
    cfg = preset("smoke")
    cfg.nft.latent_pairing = "swap"
    from wc_fast.config import validate

    with pytest.raises(ValueError, match="nft.latent_pairing"):
        validate(cfg)
