"""motion_spread: the within-group spread of candidate camera motion, in estimator-error units."""

import math

import pytest
import torch

from wc_fast import world
from wc_fast.rewards import load_estimator
from wc_fast.rewards.motion_spread import (
    camera_motion,
    commanded_directions,
    estimator_motion_error,
    motion_spread,
    soft_interaction_score,
)
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, action_deltas, chain

pytestmark = pytest.mark.usefixtures("one_thread")


def test_camera_motion_reads_steps_in_units_of_the_largest_step():
    ids = torch.tensor([[9, 1, 36, 4]])  # forward, yaw right, left, pitch down
    delta = action_deltas(ids, translation_step=0.5 * TRANSLATION_STEP,
                          rotation_step_deg=0.75 * ROTATION_STEP_DEG)
    motion = camera_motion(chain(torch.eye(4, dtype=torch.float64)[None], delta))
    want = torch.tensor([[[0, 0.5, 0, 0], [0, 0, 0.75, 0], [-0.5, 0, 0, 0], [0, 0, 0, -0.75]]],
                        dtype=torch.float64)
    torch.testing.assert_close(motion, want, atol=1e-9, rtol=0)


def test_motion_spread_is_the_candidate_std_over_the_error_along_commanded_directions():
    error = torch.tensor([0.1, 0.1, 0.2, 0.05])
    yaw = commanded_directions(torch.tensor([1, 1]))  # yaw right
    assert yaw.tolist() == [False, False, True, False]
    assert commanded_directions(torch.tensor([9 + 1])).tolist() == [False, True, True, False]
    same = torch.ones(6, 4, 4)
    assert motion_spread(same, error, yaw) == 0.0
    two = torch.zeros(2, 4, 4)
    two[1, :, 2] = 0.2  # yaw differs; std over 2 candidates: 0.2 / sqrt(2)
    two[1, :, 0] = 5.0  # x translation differs too, but the command does not move it
    assert motion_spread(two, error, yaw) == pytest.approx(0.2 / 2**0.5 / 0.2)
    assert math.isnan(motion_spread(two, error, commanded_directions(torch.tensor([0]))))
    with pytest.raises(ValueError, match="G >= 2"):
        motion_spread(torch.zeros(1, 4, 4), error, yaw)
    with pytest.raises(ValueError, match="error"):
        motion_spread(two, torch.zeros(4), yaw)


def test_estimator_error_is_zero_for_exact_poses_and_small_for_the_shipped_one():
    class Exact:
        """Returns the ground-truth poses of the clips it was built for."""

        def __init__(self, clips):
            self.clips = clips

        def __call__(self, frames):
            assert torch.equal(frames, self.clips.frames)
            return self.clips.c2w

    data = world.sample_clips(8, seed=world.batch_seed(9100, 0), segment_frames=1)
    assert estimator_motion_error(Exact(data), clips=8).abs().max() < 1e-5
    error = estimator_motion_error(load_estimator("reward"), clips=16)
    assert error.shape == (4,) and bool(((error > 0) & (error < 0.2)).all())


def test_soft_if_ranks_near_misses_above_clear_misses_and_agrees_with_labels():
    ids = torch.tensor([[10, 10, 10, 10]])  # forward + yaw right
    start = torch.eye(4, dtype=torch.float64)[None]

    def soft(ids_cmd, speed, moved_ids=ids):
        delta = action_deltas(moved_ids, translation_step=TRANSLATION_STEP * speed,
                              rotation_step_deg=ROTATION_STEP_DEG * speed)
        return float(soft_interaction_score(chain(start, delta), ids_cmd, trans_threshold=0.08,
                                            rot_threshold_deg=2.0)[0])

    full, half, near, none = soft(ids, 1.0), soft(ids, 0.5), soft(ids, 0.2), soft(ids, 0.0)
    assert full > 0.95 and full > half > near > none
    assert none == pytest.approx(0.5)  # two commanded directions missed, two kept still
    wrong = soft(ids, 1.0, moved_ids=torch.tensor([[29, 29, 29, 29]]))  # right + yaw left
    assert wrong < 0.3  # only pitch (neither commanded nor moved) is right
    with pytest.raises(ValueError):
        motion_spread(torch.zeros(2, 4, 4), torch.ones(3), torch.ones(4, dtype=torch.bool))
