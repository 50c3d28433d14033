"""Pose -> label rules of docs/design.md section 5, the label coding and the IF score."""

import math

import pytest
import torch

from wc_fast import actions
from wc_fast.rewards import interaction_score, poses_to_labels


def rot_y(deg: float) -> torch.Tensor:
    a = math.radians(deg)
    m = torch.eye(4, dtype=torch.float64)
    m[0, 0], m[0, 2], m[2, 0], m[2, 2] = math.cos(a), math.sin(a), -math.sin(a), math.cos(a)
    return m


def rot_x(deg: float) -> torch.Tensor:
    a = math.radians(deg)
    m = torch.eye(4, dtype=torch.float64)
    m[1, 1], m[1, 2], m[2, 1], m[2, 2] = math.cos(a), -math.sin(a), math.sin(a), math.cos(a)
    return m


def shift(x: float, y: float, z: float) -> torch.Tensor:
    m = torch.eye(4, dtype=torch.float64)
    m[:3, 3] = torch.tensor([x, y, z], dtype=torch.float64)
    return m


def labels_of(step: torch.Tensor, start: torch.Tensor | None = None, **kw):
    start = torch.eye(4, dtype=torch.float64) if start is None else start
    kw = {"trans_threshold": 0.01, "rot_threshold_deg": 1.0, **kw}
    trans, rot = poses_to_labels(torch.stack([start, start @ step]), **kw)
    return int(trans[0]), int(rot[0])


def test_design_checks():
    assert labels_of(rot_y(3.0)) == (0, 1)  # yaw right
    assert labels_of(rot_x(3.0)) == (0, 3)  # pitch up
    assert labels_of(shift(0, 0, 0.1)) == (1, 0)  # forward


@pytest.mark.parametrize("step,want", [
    (shift(0, 0, -0.1), (2, 0)), (shift(0.1, 0, 0), (3, 0)), (shift(-0.1, 0, 0), (4, 0)),
    (shift(0.1, 0, 0.1), (5, 0)), (shift(-0.1, 0, 0.1), (6, 0)),
    (shift(0.1, 0, -0.1), (7, 0)), (shift(-0.1, 0, -0.1), (8, 0)),
    (rot_y(-3.0), (0, 2)), (rot_x(-3.0), (0, 4)),
    (rot_y(3.0) @ rot_x(3.0), (0, 5)), (rot_y(3.0) @ rot_x(-3.0), (0, 6)),
    (rot_y(-3.0) @ rot_x(3.0), (0, 7)), (rot_y(-3.0) @ rot_x(-3.0), (0, 8)),
    (shift(0, 0, 0.1) @ rot_y(-3.0), (1, 2)),
    (shift(0, 0, 0.005), (0, 0)), (rot_y(0.5), (0, 0)),
])
def test_primitives_and_composites(step, want):
    assert labels_of(step) == want


def test_labels_are_relative_to_the_previous_pose():
    start = shift(1.0, 2.0, -3.0) @ rot_y(40.0) @ rot_x(-10.0)
    assert labels_of(shift(0, 0, 0.1), start=start) == (1, 0)
    assert labels_of(rot_y(3.0), start=start) == (0, 1)


def test_batched_over_candidates_and_frames():
    steps = [shift(0, 0, 0.1), rot_y(3.0), shift(-0.1, 0, 0)]
    poses = [torch.eye(4, dtype=torch.float64)]
    for step in steps:
        poses.append(poses[-1] @ step)
    c2w = torch.stack(poses).expand(5, 2, -1, -1, -1)
    trans, rot = poses_to_labels(c2w, trans_threshold=0.01, rot_threshold_deg=1.0)
    assert trans.shape == rot.shape == (5, 2, 3)
    assert trans[3, 1].tolist() == [1, 0, 4] and rot[3, 1].tolist() == [0, 1, 0]


def test_interaction_score_takes_the_best_threshold():
    poses = [torch.eye(4, dtype=torch.float64)]
    for step in (shift(0, 0, 0.08), shift(0, 0, 0.03)):  # commanded forward, then nothing
        poses.append(poses[-1] @ step)
    c2w = torch.stack(poses)
    trans_gt, rot_gt = torch.tensor([1, 0]), torch.tensor([0, 0])
    low = interaction_score(c2w, trans_gt, rot_gt, trans_thresholds=(0.01,))
    both = interaction_score(c2w, trans_gt, rot_gt, trans_thresholds=(0.01, 0.05))
    assert low.item() == pytest.approx((0.5 + 1.0) / 2)
    assert both.item() == pytest.approx(1.0)


def test_interaction_score_broadcasts_one_command_over_candidates():
    good = torch.stack([torch.eye(4, dtype=torch.float64), rot_y(3.0)])
    bad = torch.stack([torch.eye(4, dtype=torch.float64), rot_x(3.0)])
    score = interaction_score(torch.stack([good, bad]), torch.tensor([0]), torch.tensor([1]))
    assert score.tolist() == [1.0, 0.5]


def test_bad_pose_inputs_raise():
    with pytest.raises(ValueError, match=r"\[..., F\+1, 4, 4\]"):
        poses_to_labels(torch.zeros(1, 4, 4), trans_threshold=0.1, rot_threshold_deg=1)
    with pytest.raises(TypeError, match="floating-point"):
        poses_to_labels(torch.zeros(2, 4, 4, dtype=torch.long), trans_threshold=0.1,
                        rot_threshold_deg=1)
    nan = torch.eye(4).repeat(2, 1, 1)
    nan[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        poses_to_labels(nan, trans_threshold=0.1, rot_threshold_deg=1)
    with pytest.raises(ValueError, match="trans_threshold"):
        poses_to_labels(torch.eye(4).repeat(2, 1, 1), trans_threshold=-1, rot_threshold_deg=1)
    c2w = torch.eye(4).repeat(3, 1, 1)
    with pytest.raises(ValueError, match=r"F=2"):
        interaction_score(c2w, torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="0..8"):
        interaction_score(c2w, torch.tensor([0, 9]), torch.tensor([0, 0]))
    with pytest.raises(TypeError, match="integer"):
        interaction_score(c2w, torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one"):
        interaction_score(c2w, torch.zeros(2, dtype=torch.long),
                          torch.zeros(2, dtype=torch.long), trans_thresholds=())


def test_label_coding_round_trip():
    labels = torch.arange(9)
    assert actions.bits_to_label(actions.label_to_bits(labels)).tolist() == list(range(9))
    assert actions.label_to_bits(torch.tensor(5)).tolist() == [True, False, True, False]
    assert actions.label_to_bits(torch.tensor(8)).tolist() == [False, True, False, True]
    assert actions.bits_to_label(torch.tensor([True, True, False, False])).item() == -1
    ids = torch.arange(actions.NUM_ACTIONS)
    trans, rot = actions.split_action(ids)
    assert torch.equal(actions.action_id(trans, rot), ids)


def test_basic_and_composite_classes():
    assert sorted(actions.basic_actions()) == [1, 2, 3, 4, 9, 18, 27, 36]
    assert len(actions.composite_actions()) == 72
    ids = torch.tensor([0, 9, 1, 5 * 9, 9 + 1, 5, 5 * 9 + 5])
    assert actions.num_primitives(ids).tolist() == [0, 1, 1, 2, 2, 2, 4]
    assert actions.is_basic(ids).tolist() == [False, True, True, False, False, False, False]
    assert actions.is_composite(ids).tolist() == [False, False, False, True, True, True, True]
    assert actions.describe(6 * 9 + 2) == "forward+left+yaw_left"


def test_action_accuracy_gives_no_partial_credit():
    from wc_fast.rewards.interaction import action_accuracy

    # frame 1: forward only (commanded forward + yaw right); frame 2: exactly forward
    poses = [torch.eye(4, dtype=torch.float64)]
    for step in (shift(0, 0, 0.1), shift(0, 0, 0.1)):
        poses.append(poses[-1] @ step)
    c2w = torch.stack(poses)
    trans_gt, rot_gt = torch.tensor([1, 1]), torch.tensor([1, 0])
    assert action_accuracy(c2w, trans_gt, rot_gt).item() == pytest.approx(0.5)
    assert interaction_score(c2w, trans_gt, rot_gt).item() == pytest.approx((1.0 + 0.5) / 2)
