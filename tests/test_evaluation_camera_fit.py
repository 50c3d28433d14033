"""The classical camera fit on renders of known motion, its pose errors, and the saved paths."""

import pytest
import torch

from wc_fast.actions import split_action
from wc_fast.measures import commanded_path, fit_path, pose_errors
from wc_fast.measures.report import fit_accuracy
from wc_fast.rewards.camera_fit import luminance, motion_matrix
from wc_fast.rewards.interaction import poses_to_labels, relative_motion, rotation_angles
from wc_fast.world import render, sample_scenes, sample_sequences, start_poses
from wc_fast.world.motion import action_deltas

CPU_THRESHOLDS = {"trans_thresholds": (0.08, 0.12), "rot_threshold_deg": 2.0}


def _pair(action: int, speed: float, scenes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Renders ``[n, 2, 3, 32, 32]`` of one action at ``speed`` of the largest step, from
    level start poses of random scenes, and that action's relative motion ``[4, 4]``."""
    gen = torch.Generator().manual_seed(5)
    world = sample_scenes(scenes, gen)
    start = start_poses(world, gen)
    delta = action_deltas(torch.tensor(action), translation_step=0.3 * speed,
                          rotation_step_deg=6.0 * speed)
    return render(world, torch.stack([start, start @ delta], 1)), delta


@pytest.mark.parametrize("action,name,scenes_read", [
    (1, "yaw right", 4), (3, "pitch up", 4), (9, "forward", 4), (27, "right", 4),
    (37, "left + yaw right", 3)])
def test_fit_reads_a_known_motion_of_renders(action, name, scenes_read):
    """Speed 0.7 of the largest step: 4.2 degrees or 0.21 units, one frame pair in each of 4
    scenes. Read right: rotation within 1.2 degrees, translation within 0.1 units, and the
    action's labels. The fourth scene faces a wall about one unit away (the room prior says
    four) and a single pair there splits a sideways step plus a yaw between the two."""
    frames, delta = _pair(action, 0.7)
    fitted = fit_path(frames)
    assert torch.equal(fitted[:, 0], torch.eye(4, dtype=torch.float64).expand(4, 4, 4))
    rel = relative_motion(fitted)[:, 0]
    pitch, yaw = rotation_angles(rel)
    want_pitch, want_yaw = rotation_angles(delta)
    trans, rot = poses_to_labels(fitted, trans_threshold=0.08, rot_threshold_deg=2.0)
    want_trans, want_rot = split_action(torch.tensor([[action]] * 4))
    read = ((yaw - want_yaw).abs() < 1.2) & ((pitch - want_pitch).abs() < 1.2) \
        & ((rel[:, :3, 3] - delta[:3, 3]).norm(dim=-1) < 0.1) \
        & (trans == want_trans)[:, 0] & (rot == want_rot)[:, 0]
    assert int(read.sum()) >= scenes_read, (name, read)


def test_fit_of_a_still_camera_is_near_identity():
    frames, _ = _pair(0, 1.0)
    rel = relative_motion(fit_path(frames))[:, 0]
    assert (rel - torch.eye(4, dtype=torch.float64)).abs().max() < 1e-3


def test_fit_accuracy_of_true_renders_is_high():
    """Validation on the basic set's distribution (3 sequences x 2 clips)."""
    data = sample_sequences(3, num_clips=2, seed=424242, composite_fraction=0.0)
    acc = fit_accuracy(fit_path(data.frames), data.actions, clip_frames=4, **CPU_THRESHOLDS)
    assert acc.shape == (3, 2)
    assert acc.mean() >= 0.9


def test_pose_errors_of_a_known_rotation_and_shift():
    """A path yawing 3 degrees a frame against a still one: rotation error 3, translation 0;
    a path stepping 0.1 along x: translation error 0.1."""
    yaw = motion_matrix(torch.tensor([[0.0, 0.0, 3.0, 0.0]]))[0]
    step = motion_matrix(torch.tensor([[0.1, 0.0, 0.0, 0.0]]))[0]
    eye = torch.eye(4, dtype=torch.float64)
    still = eye.expand(1, 3, 4, 4)
    turning = torch.stack([eye, yaw, yaw @ yaw])[None]
    moving = torch.stack([eye, step, step @ step])[None]
    rot, trans = pose_errors(turning, still)
    assert rot == pytest.approx(torch.full((1, 2), 3.0, dtype=torch.float64))
    assert trans == pytest.approx(torch.zeros(1, 2, dtype=torch.float64), abs=1e-12)
    rot, trans = pose_errors(moving, still)
    assert trans == pytest.approx(torch.full((1, 2), 0.1, dtype=torch.float64))
    with pytest.raises(ValueError, match="same shape"):
        pose_errors(moving, still[:, :2])


def test_commanded_path_is_the_true_path_at_the_middle_speed():
    """A world whose every key press moves at 0.8 of the largest step from its first frame
    renders exactly the commanded path."""
    data = sample_sequences(2, num_clips=2, seed=7, speed_range=(0.8, 0.8),
                            onset_range=(1.0, 1.0))
    path = commanded_path(data.c2w[:, 0], data.actions)
    assert path.shape == data.c2w.shape
    assert path.float() == pytest.approx(data.c2w, abs=1e-5)


def test_fit_rejects_a_single_frame():
    with pytest.raises(ValueError, match="T >= 2"):
        fit_path(torch.zeros(1, 1, 3, 32, 32))
    with pytest.raises(ValueError, match="3, H, W"):
        luminance(torch.zeros(1, 2, 32, 32))


def test_floor_renders_reproduce_the_world_with_its_own_speeds():
    """The world's own motion factors give its frames back; fresh ones the same prompt frame
    and a different future."""
    from wc_fast.measures.floor import draw_motion_factors, render_sequences

    data = sample_sequences(2, num_clips=2, seed=11, composite_fraction=0.5)
    same = render_sequences(11, data.actions, data.motion_factors, segment_frames=4,
                            resolution=32)
    assert (same - data.frames).abs().mean() < 1e-3
    other = render_sequences(11, data.actions, draw_motion_factors(2, 2, seed=5),
                             segment_frames=4, resolution=32)
    assert torch.equal(other[:, 0], data.frames[:, 0])
    assert (other[:, 1:] - data.frames[:, 1:]).abs().mean() > 1e-3
