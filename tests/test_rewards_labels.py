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


def heading(deg: float, length: float = 0.1) -> torch.Tensor:
    """A translation in the x-z plane at ``deg`` degrees from forward (+z) towards right (+x)."""
    a = math.radians(deg)
    return shift(length * math.sin(a), 0.0, length * math.cos(a))


# angle from forward -> (angle to +z, angle to +x) -> label: forward/backward within 60 degrees
# of +z/-z, right/left within 60 degrees of +x/-x (DESIGN section 5)
@pytest.mark.parametrize("deg,want", [
    (25, 1), (35, 5), (55, 5), (65, 3),  # z 25/35/55/65, x 65/55/35/25
    (115, 3), (125, 7), (145, 7), (155, 2),  # z 115/125/145/155, x 25/35/55/65
    (-25, 1), (-35, 6), (-55, 6), (-65, 4),  # x 115/125/145/155
    (-115, 4), (-125, 8), (-145, 8), (-155, 2),  # x 155/145/125/115
])
def test_translation_direction_cones_at_their_edges(deg, want):
    """Five degrees inside and outside each 60 / 120 degree cone edge."""
    assert labels_of(heading(deg)) == (want, 0)


def test_translation_exactly_at_the_threshold_does_not_move():
    step = shift(0.0, 0.0, 0.5)  # |t| = 0.5 exactly (inverse of the identity start is exact)
    assert labels_of(step, trans_threshold=0.5) == (0, 0)
    assert labels_of(step, trans_threshold=0.5 - 1e-9) == (1, 0)


@pytest.mark.parametrize("rot,axis", [(rot_y, 0), (rot_x, 1)], ids=["yaw", "pitch"])
@pytest.mark.parametrize("sign,label", [(1.0, (1, 3)), (-1.0, (2, 4))], ids=["pos", "neg"])
def test_rotation_exactly_at_the_threshold_does_not_turn(rot, axis, sign, label):
    """yaw / pitch must exceed the threshold: equal is no rotation, in either direction."""
    from wc_fast.rewards.interaction import rotation_angles

    step = rot(sign * 3.0)
    angle = abs(float(rotation_angles(step)[1 - axis]))  # (pitch, yaw): yaw for rot_y
    assert angle == pytest.approx(3.0)
    assert labels_of(step, rot_threshold_deg=angle) == (0, 0)
    assert labels_of(step, rot_threshold_deg=math.nextafter(angle, 0.0)) == (0, label[axis])


def test_no_motion_at_zero_thresholds_has_no_label():
    still = torch.eye(4, dtype=torch.float64)
    assert labels_of(still, trans_threshold=0.0, rot_threshold_deg=0.0) == (0, 0)


def test_interaction_score_at_each_translation_threshold():
    """A step of exactly 0.5: moving under 0.25, still under 0.5; the score takes the best."""
    c2w = torch.stack([torch.eye(4, dtype=torch.float64), shift(0.0, 0.0, 0.5)])
    forward, still, no_turn = torch.tensor([1]), torch.tensor([0]), torch.tensor([0])
    for gt, thresholds, want in [(forward, (0.25,), 1.0), (forward, (0.5,), 0.5),
                                 (still, (0.5,), 1.0), (still, (0.25,), 0.5),
                                 (forward, (0.5, 0.25), 1.0), (still, (0.25, 0.5), 1.0)]:
        score = interaction_score(c2w, gt, no_turn, trans_thresholds=thresholds)
        assert score.item() == want, (gt, thresholds)
