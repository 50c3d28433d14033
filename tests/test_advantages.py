"""Advantages, optimality and selection against hand-computed values (docs/design.md section 4)."""

import statistics

import pytest
import torch

from wc_fast.rl.advantages import group_advantages, optimality, select_extremes


def _expected_r(adv: float, z: float) -> float:
    return 0.5 + 0.5 * max(-1.0, min(1.0, adv / z))


def test_crafted_group_matches_hand_computation():
    s_if = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    s_vq = torch.tensor([[0.2, 0.1, 0.4, 0.3]])
    r, adv = optimality(s_if, s_vq, lam=2 / 3, Z=2.0)
    a_if = [(x - 2.5) / (statistics.stdev([1, 2, 3, 4]) + 1e-8) for x in (1, 2, 3, 4)]
    vq = [0.2, 0.1, 0.4, 0.3]
    a_vq = [(x - statistics.mean(vq)) / (statistics.stdev(vq) + 1e-8) for x in vq]
    want_a = [2 / 3 * a + 1 / 3 * b for a, b in zip(a_if, a_vq, strict=True)]
    torch.testing.assert_close(adv, torch.tensor([want_a]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(r, torch.tensor([[_expected_r(a, 2.0) for a in want_a]]))


def test_clipping_at_plus_minus_z():
    # mean 2.5, unbiased std exactly 5: advantages -0.5, -0.5, -0.5, 1.5
    s = torch.tensor([[0.0, 0.0, 0.0, 10.0]], dtype=torch.float64)
    r, adv = optimality(s, s, lam=1.0, Z=1.0)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, -0.5, -0.5, 1.5]],
                                                 dtype=torch.float64), rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(r, torch.tensor([[0.25, 0.25, 0.25, 1.0]], dtype=torch.float64),
                               rtol=0, atol=1e-8)
    r, _ = optimality(-s, -s, lam=1.0, Z=1.0)
    assert r[0, 3] == 0.0


def test_zero_variance_group_gives_zero_advantage_and_half_r():
    s_if = torch.tensor([[0.1, 0.1, 0.1], [0.3, 0.7, 0.5]])
    s_vq = torch.full((2, 3), 0.7)
    r, adv = optimality(s_if, s_vq)
    assert torch.isfinite(r).all() and torch.isfinite(adv).all()
    assert adv[0].tolist() == [0.0, 0.0, 0.0]
    assert r[0].tolist() == [0.5, 0.5, 0.5]
    assert adv[1].abs().max() > 0.5


def test_global_std_differs_from_group_std():
    s = torch.tensor([[0.0, 2.0], [10.0, 14.0]], dtype=torch.float64)
    g = statistics.stdev([0.0, 2.0, 10.0, 14.0])
    want_global = torch.tensor([[-1 / g, 1 / g], [-2 / g, 2 / g]], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(s, std="global"), want_global)
    half = 1 / (2**0.5)
    want_group = torch.tensor([[-half, half], [-half, half]], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(s, std="group"), want_group)


def test_select_extremes_top_then_bottom():
    a = torch.tensor([[0.1, 0.5, -0.2, 0.9, 0.0, -0.7], [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]])
    assert select_extremes(a, k=2).tolist() == [[3, 1, 5, 2], [0, 1, 5, 4]]
    assert select_extremes(a, k=3).tolist() == [[3, 1, 0, 5, 2, 4], [0, 1, 2, 5, 4, 3]]


def test_select_extremes_ties_are_deterministic():
    a = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert select_extremes(a, k=1).tolist() == [[0, 3]]


def test_select_extremes_breaks_ties_at_random_with_a_generator():
    """Tied candidates are picked equally often (no low-index bias); untied order holds, and
    the same generator seed gives the same pick."""
    a = torch.tensor([[1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    picks = torch.stack([select_extremes(a, k=2, generator=gen)[0] for _ in range(600)])
    top, bottom = picks[:, :2], picks[:, 2:]
    assert set(top.flatten().tolist()) == {0, 1, 2}
    assert set(bottom.flatten().tolist()) == {4, 5, 6, 7}
    counts = torch.bincount(top.flatten(), minlength=3)[:3].double()
    assert float(counts.min() / counts.max()) > 0.8, counts
    clear = torch.tensor([[0.1, 0.5, -0.2, 0.9, 0.0, -0.7]])
    assert select_extremes(clear, k=2, generator=gen).tolist() == [[3, 1, 5, 2]]
    again = [select_extremes(a, k=2, generator=torch.Generator().manual_seed(3)).tolist()
             for _ in range(2)]
    assert again[0] == again[1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_raise(bad):
    s = torch.tensor([[0.1, 0.2, bad]])
    with pytest.raises(ValueError, match="s_if must be finite"):
        optimality(s, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="s_vq must be finite"):
        optimality(torch.zeros(1, 3), s)


def test_bad_shapes_and_options_raise():
    with pytest.raises(ValueError, match="s_vq must have the shape"):
        optimality(torch.zeros(2, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        optimality(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match=r"G >= 2"):
        optimality(torch.zeros(3, 1), torch.zeros(3, 1))
    with pytest.raises(TypeError, match="floating-point"):
        optimality(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="std must be one of"):
        optimality(torch.rand(1, 3), torch.rand(1, 3), std="batch")
    with pytest.raises(ValueError, match="lam"):
        optimality(torch.rand(1, 3), torch.rand(1, 3), lam=1.5)
    with pytest.raises(ValueError, match="Z must be"):
        optimality(torch.rand(1, 3), torch.rand(1, 3), Z=0.0)
    with pytest.raises(ValueError, match="s_vq is on"):
        optimality(torch.rand(1, 3), torch.rand(1, 3, device="meta"))
    with pytest.raises(ValueError, match="2k <= G"):
        select_extremes(torch.rand(2, 5), k=3)
    with pytest.raises(ValueError, match="A must be finite"):
        select_extremes(torch.tensor([[0.0, float("nan")]]), k=1)
