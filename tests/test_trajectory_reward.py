"""World-R1's continuous trajectory reward against hand-built poses of known error."""

import math

import pytest
import torch

from wc_fast.actions import action_id
from wc_fast.rewards import trajectory_score
from wc_fast.world.motion import (
    ROTATION_STEP_DEG,
    SPEED_RANGE,
    TRANSLATION_STEP,
    action_deltas,
    chain,
    rot_x,
)

# forward + yaw right, forward + yaw right, right + pitch down, nothing
ACTIONS = action_id(torch.tensor([1, 1, 3, 0]), torch.tensor([1, 1, 4, 0]))
MID = sum(SPEED_RANGE) / 2


def _commanded_deltas() -> torch.Tensor:
    return action_deltas(ACTIONS, translation_step=MID * TRANSLATION_STEP,
                         rotation_step_deg=MID * ROTATION_STEP_DEG)


def _poses(deltas: torch.Tensor) -> torch.Tensor:
    return chain(torch.eye(4, dtype=torch.float64), deltas)


def _perturbed(offset: float, angle_deg: float) -> torch.Tensor:
    """Commanded per-frame motions, each moved ``offset`` units along camera y and turned
    ``angle_deg`` more about camera x (an axis no command here turns about)."""
    deltas = _commanded_deltas().clone()
    deltas[:, 1, 3] += offset
    deltas[:, :3, :3] = deltas[:, :3, :3] @ rot_x(torch.full((4,), angle_deg,
                                                             dtype=torch.float64))
    return _poses(deltas)


def test_exact_middle_speed_poses_score_one():
    assert trajectory_score(_poses(_commanded_deltas()), ACTIONS).item() == pytest.approx(
        1.0, abs=1e-12)


@pytest.mark.parametrize("a, b", [(1.0, 1.0), (2.0, 0.5), (0.0, 3.0)])
@pytest.mark.parametrize("offset, angle", [(0.03, 0.0), (0.0, 1.5), (0.06, 2.0)])
def test_known_errors_give_the_exponential_of_their_weighted_sum(a, b, offset, angle):
    """Every frame off by ``offset`` units and ``angle`` degrees: e_t = offset / step and
    e_R = angle / step exactly."""
    got = trajectory_score(_perturbed(offset, angle), ACTIONS, translation_weight=a,
                           rotation_weight=b).item()
    want = math.exp(-(a * offset / TRANSLATION_STEP + b * angle / ROTATION_STEP_DEG))
    assert got == pytest.approx(want, rel=1e-9)


def test_score_falls_monotonically_with_either_error():
    offsets = [0.0, 0.01, 0.05, 0.1, 0.3]
    by_offset = [trajectory_score(_perturbed(o, 0.0), ACTIONS).item() for o in offsets]
    by_angle = [trajectory_score(_perturbed(0.0, d), ACTIONS).item() for d in offsets]
    assert all(x > y for x, y in zip(by_offset, by_offset[1:], strict=False))
    assert all(x > y for x, y in zip(by_angle, by_angle[1:], strict=False))


def test_batched_candidates_share_one_command():
    poses = torch.stack([_perturbed(0.0, 0.0), _perturbed(0.05, 0.0), _perturbed(0.0, 1.0)])
    got = trajectory_score(poses, ACTIONS)
    assert got.shape == (3,)
    torch.testing.assert_close(got, torch.stack([trajectory_score(p, ACTIONS) for p in poses]))


def test_bad_inputs_raise():
    poses = _poses(_commanded_deltas())
    with pytest.raises(ValueError, match="translation_weight"):
        trajectory_score(poses, ACTIONS, translation_weight=-1.0)
    with pytest.raises(ValueError, match="rotation_weight"):
        trajectory_score(poses, ACTIONS, rotation_weight=float("nan"))
    with pytest.raises(ValueError, match="one entry per frame"):
        trajectory_score(poses, ACTIONS[:3])
