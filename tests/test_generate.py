"""``python -m wc_fast.generate``: keys as typed, the video of a base model and of a training
checkpoint, GIF and MP4, and bad input."""

import sys

import numpy as np
import pytest
import torch
from PIL import Image
from video_check import assert_generates

from wc_fast.actions import action_id, split_action
from wc_fast.generate import annotate, key_text, main, parse_keys
from wc_fast.infra import checkpoint
from wc_fast.train import main as train


def test_keys_are_parsed_per_clip_with_aliases_and_combinations():
    ids = parse_keys("forward+left, yaw_right\nW+D+pitch_up, none")
    labels = [tuple(int(v) for v in split_action(torch.tensor(i))) for i in ids]
    # translation pairs: 6 = forward + left, 5 = forward + right; rotation 1 = yaw right,
    # 3 = pitch up
    assert labels == [(6, 0), (0, 1), (5, 3), (0, 0)]
    assert [key_text(i) for i in ids] == ["forward+left", "yaw_right",
                                         "forward+right+pitch_up", "none"]
    assert parse_keys(", ".join(key_text(i) for i in ids)) == ids
    assert key_text(int(action_id(torch.tensor(0), torch.tensor(0)))) == "none"


@pytest.mark.parametrize(("text", "match"), [
    ("forward+backward", "cannot go together"),
    ("yaw_left+yaw_right", "cannot go together"),
    ("jump", "unknown key 'jump'"),
    (" , ", "at least one clip"),
])
def test_bad_keys_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        parse_keys(text)


def test_frames_are_scaled_and_labelled():
    frames = torch.zeros(3, 3, 16, 24)
    images = annotate(frames, parse_keys("w, a"), clip_frames=1, size=64)
    assert [im.size for im in images] == [(96, 64)] * 3
    # the label, white on a black box, top left; elsewhere the frame's grey (0 in [-1, 1])
    corner = np.asarray(images[1])[:20, :30]
    assert corner.min() == 0 and corner.max() > 200
    assert images[1].getpixel((60, 50)) == (128, 128, 128)


def test_the_shipped_base_model_plays_as_a_gif(tmp_path):
    out = tmp_path / "clip.gif"
    assert main(["--keys", "forward, yaw_left", "--out", str(out), "--sampler-steps", "2",
                 "--size", "64"]) == 0
    gif = Image.open(out)
    assert gif.n_frames == 1 + 2 * 4 and min(gif.size) >= 64


def test_a_training_checkpoint_plays_as_an_mp4(tmp_path):
    assert train(["--preset", "smoke", "--steps", "1", "--out", str(tmp_path / "run"),
                  "--train.reader_gap_every", "0"]) == 0
    assert_generates(checkpoint.latest(tmp_path / "run"), tmp_path / "clip.mp4", 4)


@pytest.mark.parametrize(("args", "message"), [
    (["--keys", "w", "--out", "clip.avi"], "--out must end in one of"),
    (["--keys", "w+s", "--out", "clip.gif"], "cannot go together"),
    (["--keys", "w", "--out", "clip.gif", "--fps", "0"], "--fps must be >= 1"),
    (["--out", "clip.gif"], "one of the arguments --keys --keys-file is required"),
])
def test_bad_arguments_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_mp4_without_its_extra_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ModuleNotFoundError, match=r"wc_fast\[video\]"):
        main(["--keys", "w", "--out", str(tmp_path / "clip.mp4"), "--sampler-steps", "1"])
