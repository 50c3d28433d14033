"""EMA decay schedules and the in-place update."""

import copy

import pytest
import torch
from torch import nn

from wc_fast.rl.ema import ema_decay, ema_update


def test_linear_schedule_ends_and_middle():
    assert ema_decay(0, 11) == pytest.approx(0.4)
    assert ema_decay(5, 11) == pytest.approx(0.6)
    assert ema_decay(10, 11) == pytest.approx(0.8)
    assert ema_decay(50, 11) == pytest.approx(0.8)
    assert ema_decay(0, 1) == pytest.approx(0.4)
    assert ema_decay(2, 5, start=0.0, end=1.0) == pytest.approx(0.5)


def test_official_schedule():
    assert ema_decay(0, 100, schedule="official") == pytest.approx(0.2)
    assert ema_decay(30, 100, schedule="official") == pytest.approx(0.5)
    assert ema_decay(70, 100, schedule="official") == pytest.approx(0.9)
    assert ema_decay(500, 100, schedule="official") == pytest.approx(0.9)


def test_constant_schedule():
    assert ema_decay(7, 10, start=0.3, schedule="constant") == pytest.approx(0.3)


@pytest.mark.parametrize("kwargs,match", [
    ({"step": -1, "total_steps": 3}, "step"),
    ({"step": 0, "total_steps": 0}, "total_steps"),
    ({"step": 0, "total_steps": 3, "schedule": "cosine"}, "schedule"),
    ({"step": 0, "total_steps": 3, "start": 1.5}, "start"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ema_decay(**kwargs)


def test_update_is_the_lerp_formula():
    torch.manual_seed(0)
    current = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.BatchNorm1d(4))
    old = copy.deepcopy(current)
    with torch.no_grad():
        for p in current.parameters():
            p.add_(torch.randn_like(p))
    current[2].running_mean.fill_(3.0)
    before = [p.clone() for p in old.parameters()]
    ema_update(old, current, 0.7)
    for p_old, p_before, p_new in zip(old.parameters(), before, current.parameters(),
                                      strict=True):
        torch.testing.assert_close(p_old, 0.7 * p_before + 0.3 * p_new)
    assert torch.equal(old[2].running_mean, current[2].running_mean)


def test_update_rejects_mismatched_models():
    with pytest.raises(ValueError, match="mismatch"):
        ema_update(nn.Linear(3, 4), nn.Linear(4, 3), 0.5)
    with pytest.raises(ValueError, match="decay"):
        ema_update(nn.Linear(3, 4), nn.Linear(3, 4), 1.5)
