"""studies.reader_gap: both readers on saved frames, against the evaluation's own numbers."""

from __future__ import annotations

import pytest
import torch

from studies import reader_gap
from wc_fast.actions import split_action
from wc_fast.config import preset
from wc_fast.eval import EvalSettings
from wc_fast.measures import fit_path, save_set
from wc_fast.rewards.interaction import action_accuracy
from wc_fast.world import sample_sequences

SETTINGS = EvalSettings.from_config(preset("cpu"))


def _random_windows(w: int, f: int, seed: int) -> torch.Tensor:
    """Camera windows ``[w, f+1, 4, 4]``: random small steps and turns chained."""
    g = torch.Generator().manual_seed(seed)
    poses = [torch.eye(4, dtype=torch.float64).expand(w, 4, 4)]
    for _ in range(f):
        yaw = torch.deg2rad(torch.randn(w, generator=g, dtype=torch.float64) * 3)
        step = torch.eye(4, dtype=torch.float64).repeat(w, 1, 1)
        step[:, 0, 0], step[:, 0, 2] = torch.cos(yaw), torch.sin(yaw)
        step[:, 2, 0], step[:, 2, 2] = -torch.sin(yaw), torch.cos(yaw)
        step[:, [0, 2], 3] = torch.randn(w, 2, generator=g, dtype=torch.float64) * 0.1
        poses.append(poses[-1] @ step)
    return torch.stack(poses, 1)


def test_read_labels_give_the_evaluations_accuracy():
    c2w = _random_windows(40, 4, seed=0)
    g = torch.Generator().manual_seed(1)
    trans_gt, rot_gt = split_action(torch.randint(0, 81, (40, 4), generator=g))
    trans, rot = reader_gap.read_labels(c2w, trans_gt, rot_gt, trans_thresholds=(0.05, 0.1),
                                        rot_threshold_deg=2.0)
    expected = action_accuracy(c2w, trans_gt, rot_gt, trans_thresholds=(0.05, 0.1),
                               rot_threshold_deg=2.0)
    ours = ((trans == trans_gt) & (rot == rot_gt)).double().mean(-1)
    torch.testing.assert_close(ours, expected)


def test_identical_readers_agree_everywhere():
    windows = _random_windows(6, 4, seed=2).reshape(3, 2, 5, 4, 4)
    actions = torch.randint(0, 81, (3, 8), generator=torch.Generator().manual_seed(3))
    row = reader_gap.compare_readers({"est": windows, "fit": windows.clone()}, actions,
                                     clips=slice(0, 2), settings=SETTINGS)
    assert row["agree"] == 1.0 and row["est only"] == 0.0 and row["fit only"] == 0.0
    assert row["est acc"] == row["fit acc"]


def test_sharpness_is_zero_on_flat_frames_and_falls_with_blur():
    flat = torch.zeros(1, 3, 3, 16, 16)
    assert reader_gap.sharpness(flat) == 0.0
    frames = torch.rand(1, 3, 3, 16, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1
    assert reader_gap.sharpness(reader_gap.blur_frames(frames, 1.0)) < reader_gap.sharpness(
        frames)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two frames directories of one composite set: the true renders saved as a model's
    generations, and the same with one sequence's frames reversed."""
    data = sample_sequences(3, num_clips=2, seed=11, composite_fraction=1.0,
                            composite_keys=(2,), clip_frames=4, resolution=32)
    root = tmp_path_factory.mktemp("frames")
    for name, frames in (("truth", data.frames), ("flipped", data.frames.flip(-1))):
        save_set(root / name, "composite_2key", generated=frames, ground_truth=data.frames,
                 actions=data.actions, c2w_true=data.c2w, c2w_fit=fit_path(frames))
    return root, data


def test_study_reads_saved_true_renders_as_the_truth_row(saved):
    root, _ = saved
    rows = reader_gap.study([root / "truth", root / "flipped"], kind="composite_2key",
                            blur=(1.0,), noise=(0.05,), clip_frames=4, settings=SETTINGS)
    assert list(rows) == [str(root / "truth"), str(root / "flipped"), "true renders",
                          "true renders, blur 1", "true renders, noise 0.05"]
    assert rows[str(root / "truth")] == rows["true renders"]
    flipped = rows[str(root / "flipped")]["all"]
    assert flipped != rows["true renders"]["all"]
    truth = rows["true renders"]["all"]
    assert 0.0 <= truth["agree est/rew"] <= 1.0 and truth["agree"] >= truth["est only"]
    for row in rows.values():
        assert set(row["kinds"]) <= {"TR", "RR", "TT"}
        assert sum(k["clips"] for k in row["kinds"].values()) == 3


def test_study_refuses_other_commands_and_missing_sets(saved, tmp_path):
    root, data = saved
    other = data.actions.roll(1, 0)
    save_set(tmp_path / "other", "composite_2key", generated=data.frames,
             ground_truth=data.frames, actions=other, c2w_true=data.c2w,
             c2w_fit=fit_path(data.frames))
    with pytest.raises(ValueError, match="other commands"):
        reader_gap.study([root / "truth", tmp_path / "other"], kind="composite_2key", blur=(),
                         clip_frames=4, settings=SETTINGS)
    with pytest.raises(ValueError, match="basic.npz"):
        reader_gap.study([root / "truth"], kind="basic", blur=(), clip_frames=4,
                         settings=SETTINGS)
    with pytest.raises(ValueError, match="at least one"):
        reader_gap.study([], kind="basic", blur=(), clip_frames=4, settings=SETTINGS)


@pytest.mark.parametrize("flag", ["--blur", "--noise"])
@pytest.mark.parametrize("value", ["0", "x"])
def test_cli_refuses_bad_levels(saved, flag, value, capsys):
    root, _ = saved
    with pytest.raises(SystemExit):
        reader_gap.main([str(root / "truth"), flag, value])
    assert flag in capsys.readouterr().err


def test_noise_leaves_the_prompt_and_stays_in_range():
    frames = torch.rand(2, 5, 3, 8, 8, generator=torch.Generator().manual_seed(5)) * 2 - 1
    noisy = reader_gap.noisy_frames(frames, 0.5)
    assert torch.equal(noisy[:, 0], frames[:, 0]) and not torch.equal(noisy[:, 1:], frames[:, 1:])
    assert noisy.abs().max() <= 1.0
