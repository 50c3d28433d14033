"""``model.history_window``: each chunk attends to the last ``W`` history frames before it.

The conformance suite (``tests/test_conformance.py``) checks the windowed backbones' cached,
parallel and teacher-forced paths against each other; here: the mask itself, that the window
changes what a clip sees (and nothing when it covers the history), that the cache stops
growing, and the config's checks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wc_fast.config import ModelConfig, apply_base, preset, validate_model
from wc_fast.models.clips import history_mask, teacher_forced_layout
from wc_fast.models.pretrained import load_base_model, new_world_model

TINY = ModelConfig(resolution=16, patch=8, dim=32, depth=2, heads=2, clip_frames=2)


def test_history_mask_sees_the_chunk_and_the_window_before_it():
    # prompt, then clips of 2: chunks {0} {1,2} {3,4} {5,6}
    mask = history_mask(7, 2, torch.device("cpu"), window=2)
    sees = {q: [k for k in range(7) if mask[q, k]] for q in range(7)}
    assert sees == {0: [0], 1: [0, 1, 2], 2: [0, 1, 2], 3: [1, 2, 3, 4], 4: [1, 2, 3, 4],
                    5: [3, 4, 5, 6], 6: [3, 4, 5, 6]}
    whole = history_mask(7, 2, torch.device("cpu"))
    assert torch.equal(history_mask(7, 2, torch.device("cpu"), window=6), whole)
    assert whole[6].all() and not whole[0, 1:].any()


def test_teacher_forced_noisy_clips_see_the_window_of_their_clean_clip():
    total, f = 7, 2
    positions, mask = teacher_forced_layout(total, f, torch.device("cpu"), window=2)
    assert positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    clean = history_mask(total, f, torch.device("cpu"), window=2)
    assert torch.equal(mask[:total, :total], clean) and not mask[:total, total:].any()
    # noisy clip 3 (rows of frames 5, 6): clean frames 3, 4 and its own noisy frames
    for row in (total + 4, total + 5):
        assert [k for k in range(2 * total - 1) if mask[row, k]] == [3, 4, total + 4, total + 5]


def _model(window: int):
    cfg = dataclasses.replace(TINY, backbone="wan", patch=4, reference_frame=True,
                              history_window=window)
    torch.manual_seed(0)
    model = new_world_model(cfg, seed=0)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


@torch.no_grad()
def test_the_window_cuts_what_a_late_clip_sees_and_bounds_the_cache():
    frames = torch.randn(1, 7, 3, 16, 16, generator=torch.Generator().manual_seed(1)).clamp(-1, 1)
    actions = torch.randint(0, 81, (1, 7), generator=torch.Generator().manual_seed(2))
    x_t = torch.randn(1, 2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    sigma, clip_actions = torch.tensor([0.6]), torch.tensor([3, 3])
    out = {}
    for window in (0, 2, 7):
        model = _model(window)
        cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.0)
        assert cache.num_frames == 7
        assert cache.num_tokens == min(window or 7, 7) * model.tokens_per_frame
        out[window] = model.velocity(x_t, sigma, clip_actions, cache)
    # a window over the whole history is the whole history; a shorter one changes the clip
    torch.testing.assert_close(out[7], out[0], rtol=0, atol=0)
    assert (out[2] - out[0]).abs().max() > 1e-3


@pytest.mark.parametrize("window", [-1, 1.5, True])
def test_bad_windows_are_refused(window):
    with pytest.raises(ValueError, match="history_window"):
        validate_model(dataclasses.replace(TINY, history_window=window))


def test_worldplay_refuses_a_window():
    with pytest.raises(ValueError, match="model.history_window"):
        validate_model(dataclasses.replace(TINY, backbone="worldplay", path="x",
                                           history_window=3))


def test_the_wan_base_attends_to_its_pretraining_history():
    cfg = preset("cpu")
    assert cfg.model.history_window == 0  # the tiny base: its whole history
    apply_base(cfg, "wan")
    assert cfg.model.history_window == 1 + cfg.model.clip_frames
    model = load_base_model("wan")
    assert model.history_window == cfg.model.history_window
