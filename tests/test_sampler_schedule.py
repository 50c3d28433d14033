"""The sampler schedule equals diffusers' FlowMatchEulerDiscreteScheduler (docs/design.md
section 3)."""

import numpy as np
import pytest
import torch

from wc_fast.rl.sampler import sigma_schedule


@pytest.mark.parametrize("steps,shift", [(40, 5.0), (10, 5.0), (7, 3.0), (1, 1.0)])
def test_matches_diffusers(steps, shift):
    diffusers = pytest.importorskip("diffusers")
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
    ours = sigma_schedule(steps, shift)
    assert ours.shape == (steps + 1,)
    torch.testing.assert_close(ours, sched.sigmas.to(torch.float32), rtol=1e-6, atol=1e-6)


def test_endpoints_and_monotone():
    s = sigma_schedule(40, 5.0)
    assert s[0].item() == 1.0 and s[-1].item() == 0.0
    assert bool((s[1:] < s[:-1]).all())
    assert s[20].item() == pytest.approx(5 * 0.5 / (1 + 4 * 0.5))


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        sigma_schedule(0)
    with pytest.raises(ValueError, match="shift"):
        sigma_schedule(10, 0.0)
