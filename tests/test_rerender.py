"""The re-render reader (studies.rerender): its grid, its tracking, anchoring, the scene check
and the study's rows on saved frames."""

import pytest
import torch

from studies.rerender import check_scenes, parse_factors, study
from wc_fast.eval import FINAL_EVAL_SEED, KINDS, EvalSettings
from wc_fast.measures.frames_io import save_set
from wc_fast.rewards import load_estimator
from wc_fast.rewards.camera_fit import fit_path
from wc_fast.rewards.render_reader import anchored, motion_grid, press_track, render_track
from wc_fast.world import render, sample_sequences, sequence_scenes
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, action_deltas, chain

SETTINGS = EvalSettings(trans_thresholds=(0.08, 0.12), rot_threshold_deg=2.0)


def test_motion_grid_holds_every_action_once_per_size():
    one = motion_grid([1.0])
    assert one.shape == (81, 4, 4)
    assert torch.allclose(one, action_deltas(torch.arange(81)))
    # the no-op once, each other translation or rotation at both sizes
    assert len(motion_grid([0.5, 1.0])) == 17 * 17
    half = action_deltas(torch.arange(81), translation_step=0.5 * TRANSLATION_STEP,
                         rotation_step_deg=ROTATION_STEP_DEG)
    grid = motion_grid([0.5, 1.0])
    assert all((grid - m).abs().amax((1, 2)).min() < 1e-12 for m in half)


@pytest.mark.parametrize("factors", [[], [0.0], [1.0, -0.5]])
def test_motion_grid_refuses_bad_factors(factors):
    with pytest.raises(ValueError, match="factors"):
        motion_grid(factors)


def test_parse_factors():
    assert parse_factors("0.25, 0.5,1") == [0.25, 0.5, 1.0]
    for text in ("", "a,1", "0,1", "-1"):
        with pytest.raises(ValueError, match="--factors"):
            parse_factors(text)


def test_render_track_recovers_a_path_on_its_grid():
    scenes, start = sequence_scenes(11, 2)
    actions = torch.tensor([[10, 10, 37, 37], [3, 50, 50, 80]])
    path = chain(start, action_deltas(actions, translation_step=0.5 * TRANSLATION_STEP))
    frames = render(scenes, path, resolution=32)
    tracked = render_track(scenes, start, frames, motion_grid([0.5, 1.0]))
    assert tracked.shape == (2, 5, 4, 4)
    assert torch.allclose(tracked, path, atol=1e-5)
    assert torch.allclose(press_track(scenes, start, frames, factors=(0.5, 1.0)), path,
                          atol=1e-5)


def test_anchored_keeps_relative_motion_and_moves_the_start():
    _, start = sequence_scenes(3, 2)
    window = chain(torch.eye(4, dtype=torch.float64).expand(2, 4, 4) * 1.0,
                   action_deltas(torch.tensor([[1, 2], [9, 18]])))
    shifted = window.clone()
    shifted[..., :3, 3] += 5.0  # a window whose first pose is not the identity
    out = anchored(shifted, start)
    assert torch.allclose(out[:, 0], start.double())
    rel = torch.linalg.inv(out[:, :-1]) @ out[:, 1:]
    assert torch.allclose(rel, torch.linalg.inv(window[:, :-1]) @ window[:, 1:], atol=1e-10)


def _saved(tmp_path, n=2, seed=FINAL_EVAL_SEED, generated=None):
    kind = "composite_2key"
    fraction, keys = KINDS[kind]
    data = sample_sequences(n, num_clips=2, seed=seed + list(KINDS).index(kind),
                            composite_fraction=fraction, composite_keys=keys, clip_frames=4,
                            resolution=32)
    frames = data.frames if generated is None else generated(data)
    save_set(tmp_path, kind, generated=frames, ground_truth=data.frames, actions=data.actions,
             c2w_true=data.c2w, c2w_fit=fit_path(frames))
    return data


def test_check_scenes_refuses_other_seeds(tmp_path):
    data = _saved(tmp_path)
    scenes, _ = sequence_scenes(FINAL_EVAL_SEED + 2, 2)
    check_scenes(scenes, data.c2w, data.frames)
    other, _ = sequence_scenes(FINAL_EVAL_SEED + 1, 2)
    with pytest.raises(ValueError, match="--seed"):
        check_scenes(other, data.c2w, data.frames)


@pytest.fixture(scope="module")
def estimators():
    return {"est": load_estimator("eval"), "rew": load_estimator("reward")}


@pytest.fixture(scope="module")
def rows(tmp_path_factory, estimators):
    """The study of two saved sets of one seed: the true renders as "generated" frames, and
    frames that stay still whatever the command."""
    root = tmp_path_factory.mktemp("rerender")
    _saved(root / "truth")
    _saved(root / "still", generated=lambda d: d.frames[:, :1].expand_as(d.frames).clone())
    return study([root / "truth", root / "still"], kind="composite_2key", settings=SETTINGS,
                 clip_frames=4, factors=[0.5, 0.75, 1.0], estimators=estimators), root


def test_study_reads_true_renders_as_the_truth(rows):
    out, root = rows
    assert list(out) == [str(root / "truth"), str(root / "still"), "true renders"]
    row = out["true renders"]
    assert row["true acc"] == 1.0 and row["true psnr"] == 100.0
    assert row["render acc"] >= 0.9 and row["render agree"] == 1.0
    assert row["press acc"] >= 0.9
    # the grid explains the true frames better than the commanded path at one mid speed
    assert row["render psnr"] > row["commanded psnr"]
    truth, row = dict(out[str(root / "truth")]), dict(row)
    assert truth.pop("per_sequence") == row.pop("per_sequence")
    assert truth == pytest.approx(row, nan_ok=True)


def test_study_follows_frames_that_disobey(rows):
    # frames that stay still: the render reader reads no motion, which explains them exactly
    row = rows[0][str(rows[1] / "still")]
    assert row["render acc"] == row["press acc"] == 0.0
    assert row["render psnr"] == row["press psnr"] == 100.0
    assert row["true acc"] == 1.0 and row["true psnr"] < row["render psnr"]
    assert row["true agree"] == 0.0
    # the change from the first directory, paired over its two sequences
    truth = rows[0][str(rows[1] / "truth")]
    assert "change" not in truth and set(row["change"]) == {"est", "rew", "fit", "render", "press"}
    for reader, change in row["change"].items():
        assert change["change"] == pytest.approx(row[f"{reader} acc"] - truth[f"{reader} acc"])
        assert change["low"] <= change["change"] <= change["high"]
        assert len(row["per_sequence"][reader]) == 2


def test_study_refuses_mismatched_or_missing_sets(tmp_path, estimators):
    a, b = tmp_path / "a", tmp_path / "b"
    _saved(a)
    _saved(b, seed=FINAL_EVAL_SEED + 50)
    kwargs = dict(kind="composite_2key", settings=SETTINGS, clip_frames=4, factors=[1.0],
                  estimators=estimators)
    with pytest.raises(ValueError, match="other commands"):
        study([a, b], **kwargs)
    with pytest.raises(ValueError, match="--seed"):
        study([b], **kwargs)
    with pytest.raises(ValueError, match="no .*basic.npz"):
        study([a], **{**kwargs, "kind": "basic"})
    with pytest.raises(ValueError, match="kind"):
        study([a], **{**kwargs, "kind": "nope"})
    with pytest.raises(ValueError, match="directories"):
        study([], **kwargs)
