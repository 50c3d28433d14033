"""Exploration in camera motion (``rollout.warp_exploration``): each candidate of a group is
generated under its own random affine flow; the history and the evaluation are not."""

import dataclasses
import shutil

import pytest
import torch
from gloo_ranks import spawn_ranks
from test_train import SMOKE, _assert_same, _final_weights, _rank
from test_trainer_options import _config

from wc_fast.config import ModelConfig
from wc_fast.infra import checkpoint
from wc_fast.models import TinyWorldDiT
from wc_fast.models.tiny.dit import accumulate_over_clips, affine_flow, warp
from wc_fast.rl.rollout import (
    MotionExploration,
    rollout_clip_level,
    rollout_sample_level,
    warp_exploration_offsets,
)
from wc_fast.rl.sampler import ClipSampler
from wc_fast.train import main

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = ModelConfig(resolution=16, channels=3, clip_frames=2, patch=4, dim=48, depth=2, heads=3,
                  prediction="warp", reference_frame=True)
EXPLORE = ["--rollout.warp_exploration", "0.7", "--model.prediction", "warp"]


def _randomised(seed: int = 0) -> TinyWorldDiT:
    torch.manual_seed(seed)
    model = TinyWorldDiT(CFG)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.05)
    return model.eval()


def test_offsets_are_shifts_and_a_zoom_of_the_given_spread():
    gen = torch.Generator().manual_seed(0)
    offset = warp_exploration_offsets(20000, 0.5, 32, gen)
    assert offset.shape == (20000, 6)
    assert not offset[:, [2, 4]].any()  # no shear or rotation
    torch.testing.assert_close(offset[:, 1], offset[:, 5])
    spread = torch.stack([offset[:, 0], offset[:, 3], offset[:, 1] * 16]).std(dim=1)
    torch.testing.assert_close(spread, torch.full((3,), 0.5), rtol=0.03, atol=0)
    assert warp_exploration_offsets(4, 0.0, 32, gen) is None


def test_an_offset_moves_the_clean_clip_by_its_affine_flow():
    """With the head at zero the clean-clip estimate is the reference frame warped by the
    offset's flow, accumulated over the clip's frames."""
    torch.manual_seed(0)
    model = TinyWorldDiT(CFG).double()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randn(1, 1, 3, 16, 16, generator=g, dtype=torch.float64)
    cache = model.extend_cache(model.empty_cache(), prompt, torch.zeros(1, 1, dtype=torch.long),
                               sigma=0.014)
    offset = torch.tensor([[1.0, 0.02, 0, -0.5, 0, 0.02], [0.0, 0, 0, 0, 0, 0]],
                          dtype=torch.float64)
    x_t = torch.randn(2, 2, 3, 16, 16, generator=g, dtype=torch.float64)
    sigma = torch.full((2,), 0.5, dtype=torch.float64)
    with torch.no_grad():
        v = model.velocity(x_t, sigma, torch.tensor([5, 5]), cache, affine_offset=offset)
    x0 = x_t - 0.5 * v
    flow = accumulate_over_clips(affine_flow(offset[:, None].expand(2, 2, 6), 16), 2)
    want = warp(prompt.expand(2, 2, -1, -1, -1), flow)
    torch.testing.assert_close(x0, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(x0[1], prompt[0].expand(2, -1, -1, -1), rtol=1e-9, atol=1e-9)


def test_bad_offsets_raise_clear_errors():
    model = _randomised()
    cache = model.extend_cache(model.empty_cache(), torch.zeros(1, 1, 3, 16, 16),
                               torch.zeros(1, 1, dtype=torch.long), sigma=0.014)
    x_t, sigma, actions = torch.zeros(2, 2, 3, 16, 16), torch.ones(2), torch.tensor([1, 1])
    with pytest.raises(ValueError, match=r"affine_offset must be a \[2, 6\] tensor"):
        model.velocity(x_t, sigma, actions, cache, affine_offset=torch.zeros(2, 4))
    velocity_model = TinyWorldDiT(dataclasses.replace(CFG, prediction="velocity"))
    cache = velocity_model.extend_cache(velocity_model.empty_cache(), torch.zeros(1, 1, 3, 16, 16),
                                        torch.zeros(1, 1, dtype=torch.long), sigma=0.014)
    with pytest.raises(ValueError, match="prediction='warp'"):
        velocity_model.velocity(x_t, sigma, actions, cache, affine_offset=torch.zeros(2, 6))


@pytest.mark.parametrize("overrides,match", [
    ({"rollout__warp_exploration": "-0.1", "model__prediction": "warp"}, "rollout.warp_expl"),
    ({"rollout__warp_exploration": "0.5"}, "model.prediction"),
    ({"rollout__warp_exploration": "0.5", "model__prediction": "warp",
      "train__update": "flow_grpo"}, "train.update"),
])
def test_the_config_rejects_what_exploration_cannot_do(overrides, match):
    with pytest.raises(ValueError, match=match):
        _config(**overrides)


def test_candidates_explore_but_share_the_unexplored_history():
    """The history is the one generated without exploration; a zero-strength rollout is the
    plain one; with exploration the candidates' clips differ from it."""
    model = _randomised()
    sampler = ClipSampler(model, steps=3, shift=1.0, capture="eager")
    prompt = torch.randn(1, 1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    actions = torch.tensor([1, 1, 10, 10, 12, 12])

    def run(strength: float, level=rollout_clip_level):
        gen = torch.Generator().manual_seed(3)
        return level(model, sampler, prompt, actions, 2, 4, gen,
                     explore=MotionExploration(warp=strength))

    plain, zero, explored = run(0.0), run(0.0), run(1.0)
    torch.testing.assert_close(zero.candidates, plain.candidates, rtol=0, atol=0)
    torch.testing.assert_close(explored.history, plain.history, rtol=0, atol=0)
    assert (explored.candidates - plain.candidates).abs().amax(dim=(1, 2, 3, 4)).min() > 1e-3
    sample_plain, sample_explored = run(0.0, rollout_sample_level), run(1.0, rollout_sample_level)
    assert not torch.allclose(sample_plain.candidates, sample_explored.candidates)


def test_smoke_run_with_exploration_resumes_exactly(tmp_path):
    args = [*SMOKE, *EXPLORE, "--steps", "3", "--out", str(tmp_path), "--train.keep_last", "3"]
    assert main(args) == 0
    uninterrupted = _final_weights(tmp_path)
    shutil.rmtree(checkpoint.latest(tmp_path))
    assert main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))


@pytest.mark.slow
def test_two_gloo_ranks_explore_as_one_process(tmp_path):
    common = [*SMOKE, *EXPLORE, "--steps", "2", "--reward.std", "global"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*common, "--out", str(one), "--rollout.groups_per_rank", "2"]) == 0
    spawn_ranks(_rank, ([*common, "--out", str(two), "--rollout.groups_per_rank", "1"],),
                tmp_path)
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)
