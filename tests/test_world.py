"""The embedded world: determinism, exact action poses, label round trip, camera bounds."""

import math

import pytest
import torch

from wc_fast import world
from wc_fast.actions import NUM_ACTIONS, is_basic, is_composite, num_primitives, split_action
from wc_fast.config import preset
from wc_fast.rewards import poses_to_labels, relative_motion
from wc_fast.rewards.interaction import rotation_angles
from wc_fast.world import ROTATION_STEP_DEG, TRANSLATION_STEP
from wc_fast.world.motion import (
    ONSET_RANGE,
    SPEED_RANGE,
    action_components,
    action_deltas,
    chain,
    rot_x,
    rot_y,
)
from wc_fast.world.scene import is_free

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def clips():
    return world.sample_clips(6, seed=123, segment_frames=1, noop_fraction=0.1)


def test_sample_clips_shapes_and_range(clips):
    default = world.sample_clips(3, seed=0)
    assert default.frames.shape == (3, 5, 3, 32, 32) and default.frames.dtype == torch.float32
    assert default.actions.shape == (3, 4) and default.actions.dtype == torch.long
    assert default.c2w.shape == (3, 5, 4, 4)
    assert float(default.frames.min()) >= -1.0 and float(default.frames.max()) <= 1.0
    assert int(clips.actions.min()) >= 0 and int(clips.actions.max()) < NUM_ACTIONS
    # One action per clip by default (as WorldPlay).
    assert (default.actions == default.actions[:, :1]).all()


def test_deterministic_by_seed():
    a = world.sample_clips(4, seed=5, composite_fraction=0.3)
    b = world.sample_clips(4, seed=5, composite_fraction=0.3)
    c = world.sample_clips(4, seed=6, composite_fraction=0.3)
    assert torch.equal(a.frames, b.frames) and torch.equal(a.actions, b.actions)
    assert torch.equal(a.c2w, b.c2w)
    assert not torch.equal(a.frames, c.frames)


def test_action_deltas_have_the_stated_steps():
    ids = torch.tensor([9, 18, 27, 36, 1, 2, 3, 4])  # W, S, D, A, yaw R/L, pitch U/D
    delta = action_deltas(ids)
    s = TRANSLATION_STEP
    expected_t = [[0, 0, s], [0, 0, -s], [s, 0, 0], [-s, 0, 0]] + [[0, 0, 0]] * 4
    assert torch.allclose(delta[:, :3, 3], torch.tensor(expected_t, dtype=torch.float64))
    r = torch.tensor(ROTATION_STEP_DEG, dtype=torch.float64)
    assert torch.allclose(delta[4, :3, :3], rot_y(r)) and torch.allclose(delta[5, :3, :3],
                                                                         rot_y(-r))
    assert torch.allclose(delta[6, :3, :3], rot_x(r)) and torch.allclose(delta[7, :3, :3],
                                                                         rot_x(-r))
    # Yaw right turns the view toward +x; pitch up toward -y (up in OpenCV).
    assert delta[4, 0, 2] > 0 and delta[6, 1, 2] < 0


def test_known_action_gives_the_exact_relative_pose():
    start = torch.eye(4, dtype=torch.float64)
    start[:3, :3] = rot_y(torch.tensor(37.0, dtype=torch.float64)) @ rot_x(
        torch.tensor(-12.0, dtype=torch.float64))
    start[:3, 3] = torch.tensor([1.5, 0.2, -2.0], dtype=torch.float64)
    ids = torch.arange(NUM_ACTIONS)
    poses = chain(start.expand(NUM_ACTIONS, 4, 4), action_deltas(ids)[:, None])
    rel = relative_motion(poses)[:, 0]
    assert torch.allclose(rel, action_deltas(ids), atol=1e-12, rtol=0)


def test_fixed_speed_world_moves_by_exactly_the_actions():
    fixed = world.sample_clips(6, seed=123, segment_frames=1, noop_fraction=0.1,
                               speed_range=(1.0, 1.0), onset_range=(1.0, 1.0))
    rel = relative_motion(fixed.c2w.double())
    assert torch.allclose(rel, action_deltas(fixed.actions), atol=1e-5, rtol=0)


def test_dataset_poses_follow_the_actions_at_a_drawn_speed(clips):
    """Each frame moves along the commanded keys, by a speed in SPEED_RANGE (times the onset
    on a key press's first frame) of the largest step: the translation and the yaw/pitch of a
    frame are the action's directions scaled by one factor each."""
    rel = relative_motion(clips.c2w.double())
    t_dir, angle_dir = action_components(clips.actions, translation_step=1.0,
                                         rotation_step_deg=1.0)
    t = rel[..., :3, 3]
    pitch, yaw = rotation_angles(rel)
    moving_t = t_dir.norm(dim=-1) > 0
    speed = t.norm(dim=-1)[moving_t] / (TRANSLATION_STEP * t_dir.norm(dim=-1)[moving_t])
    assert torch.allclose(t[moving_t] / t[moving_t].norm(dim=-1, keepdim=True),
                          t_dir[moving_t] / t_dir[moving_t].norm(dim=-1, keepdim=True),
                          atol=1e-4)
    assert torch.allclose(t[~moving_t], torch.zeros(1, dtype=torch.float64), atol=1e-5)
    lo = SPEED_RANGE[0] * ONSET_RANGE[0] - 1e-4
    assert float(speed.min()) >= lo and float(speed.max()) <= 1.0 + 1e-4
    angles = torch.stack([yaw, pitch], dim=-1)
    turning = angle_dir.abs() > 0
    turn = angles[turning] / (ROTATION_STEP_DEG * angle_dir[turning])
    assert float(turn.min()) >= lo - 1e-3 and float(turn.max()) <= 1.0 + 1e-3
    assert float(speed.std()) > 0.05 and float(turn.std()) > 0.05  # speeds really vary


def test_speed_is_constant_within_a_key_press_after_its_onset():
    seq = world.sample_sequences(8, num_clips=3, seed=7, composite_fraction=0.0)
    rel = relative_motion(seq.c2w.double())
    pitch, yaw = rotation_angles(rel)
    size = rel[..., :3, 3].norm(dim=-1) + pitch.abs() + yaw.abs()
    per_clip = size.unflatten(1, (3, 4))
    assert torch.allclose(per_clip[..., 2:], per_clip[..., 1:2].expand(-1, -1, 2), atol=1e-6)
    onset = per_clip[..., 0] / per_clip[..., 1]
    assert float(onset.min()) >= ONSET_RANGE[0] - 1e-6 and float(onset.max()) <= 1 + 1e-6
    assert float(onset.std()) > 0.02


def test_composite_keys_limits_the_composites():
    two = world.sample_sequences(16, num_clips=2, seed=4, composite_fraction=1.0,
                                 composite_keys=(2,))
    keys = num_primitives(two.actions)[~two.forced_noop.repeat_interleave(4, 1)]
    assert (keys == 2).all()
    with pytest.raises(ValueError, match="composite_keys"):
        world.sample_clips(1, seed=0, composite_keys=(1,))
    with pytest.raises(ValueError, match="speed_range"):
        world.sample_clips(1, seed=0, speed_range=(0.0, 1.0))


@pytest.mark.parametrize("name", ["cpu", "smoke"])
@pytest.mark.parametrize("speed", [1.0, SPEED_RANGE[0] * ONSET_RANGE[0]])
def test_label_round_trip_for_every_action_id(name, speed):
    """At the largest and the smallest motion of the world, the labels are the command's."""
    reward = preset(name).reward
    ids = torch.arange(NUM_ACTIONS)
    start = torch.eye(4, dtype=torch.float64).expand(NUM_ACTIONS, 4, 4)
    deltas = action_deltas(ids, translation_step=TRANSLATION_STEP * speed,
                           rotation_step_deg=ROTATION_STEP_DEG * speed)
    poses = chain(start, deltas[:, None].expand(-1, 3, -1, -1))
    want_t, want_r = split_action(ids)
    for tau in reward.trans_thresholds:
        trans, rot = poses_to_labels(poses, trans_threshold=tau,
                                     rot_threshold_deg=reward.rot_threshold_deg)
        assert torch.equal(trans, want_t[:, None].expand(-1, 3))
        assert torch.equal(rot, want_r[:, None].expand(-1, 3))


def test_label_round_trip_on_rendered_clips(clips):
    reward = preset("cpu").reward
    for tau in reward.trans_thresholds:
        trans, rot = poses_to_labels(clips.c2w, trans_threshold=tau,
                                     rot_threshold_deg=reward.rot_threshold_deg)
        want_t, want_r = split_action(clips.actions)
        assert torch.equal(trans, want_t) and torch.equal(rot, want_r)


def test_sequences_stay_in_free_space_with_bounded_tilt():
    seq = world.sample_sequences(12, num_clips=8, seed=2)
    assert seq.frames.shape == (12, 33, 3, 32, 32) and seq.actions.shape == (12, 32)
    assert seq.c2w.shape == (12, 33, 4, 4)
    # One action per clip; the world prompt is seen from a level camera.
    assert (seq.actions.view(12, 8, 4) == seq.actions.view(12, 8, 4)[..., :1]).all()
    assert torch.allclose(seq.c2w[:, 0, 1, 1], torch.ones(12))
    tilt = torch.rad2deg(torch.acos(seq.c2w[..., 1, 1].clamp(-1, 1)))
    assert float(tilt.max()) <= 30.0 + 1e-3
    gen = torch.Generator().manual_seed(2)
    scenes = world.sample_scenes(12, gen)
    assert is_free(scenes, seq.c2w[..., :3, 3].double()).all()


def test_composite_fraction_controls_the_mix():
    basic = world.sample_sequences(16, num_clips=3, seed=4, composite_fraction=0.0)
    assert is_basic(basic.actions).all()
    comp = world.sample_sequences(16, num_clips=3, seed=4, composite_fraction=1.0)
    forced = comp.forced_noop.repeat_interleave(4, 1)
    assert (is_composite(comp.actions) | forced).all()
    assert float(is_composite(comp.actions).float().mean()) > 0.9


def test_every_primitive_is_visible():
    """Each basic action changes the rendered frame clearly (mean |diff| > 2% of the range)."""
    gen = torch.Generator().manual_seed(9)
    scenes = world.sample_scenes(8, gen)
    start = world.start_poses(scenes, gen)
    for a in (9, 18, 27, 36, 1, 2, 3, 4):
        c2w = chain(start, action_deltas(torch.full((8, 1), a)))
        frames = world.render(scenes, c2w)
        diff = (frames[:, 1] - frames[:, 0]).abs().mean((1, 2, 3))
        assert float(diff.median()) > 0.04, (a, diff)


def test_render_is_deterministic_and_pose_dependent():
    gen = torch.Generator().manual_seed(1)
    scenes = world.sample_scenes(3, gen)
    c2w = world.start_poses(scenes, gen)[:, None]
    a = world.render(scenes, c2w)
    assert torch.equal(a, world.render(scenes, c2w))
    moved = c2w.clone()
    moved[..., 0, 3] += 0.3
    assert not torch.equal(a, world.render(scenes, moved))
    assert world.render(scenes, c2w, resolution=16).shape == (3, 1, 3, 16, 16)


def test_supersampled_render_is_close_to_the_plain_one():
    gen = torch.Generator().manual_seed(3)
    scenes = world.sample_scenes(4, gen)
    c2w = world.start_poses(scenes, gen)[:, None]
    plain, smooth = world.render(scenes, c2w), world.render(scenes, c2w, supersample=2)
    assert float((plain - smooth).abs().mean()) < 0.1


def test_clip_stream_and_dataset():
    stream = list(world.iter_clips(2, seed=3, num_batches=2))
    assert len(stream) == 2 and not torch.equal(stream[0].frames, stream[1].frames)
    assert torch.equal(stream[1].frames,
                       world.sample_clips(2, seed=world.batch_seed(3, 1)).frames)
    frames, actions, c2w = next(iter(world.ClipDataset(seed=3, render_batch=2)))
    assert frames.shape == (5, 3, 32, 32) and actions.shape == (4,) and c2w.shape == (5, 4, 4)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="composite_fraction"):
        world.sample_clips(2, seed=0, composite_fraction=1.5)
    with pytest.raises(ValueError, match="segment_frames"):
        world.sample_clips(2, seed=0, segment_frames=3)
    with pytest.raises(ValueError, match="num_clips"):
        world.sample_sequences(2, num_clips=0, seed=0)


def test_pitch_composition_matches_the_label_rule():
    """A composite rotation reads back as exactly the commanded yaw and pitch."""
    from wc_fast.rewards.interaction import rotation_angles

    ids = torch.tensor([5, 6, 7, 8])  # yaw R+up, yaw R+down, yaw L+up, yaw L+down
    pitch, yaw = rotation_angles(action_deltas(ids))
    s = ROTATION_STEP_DEG
    assert torch.allclose(yaw, torch.tensor([s, s, -s, -s], dtype=torch.float64))
    assert torch.allclose(pitch, torch.tensor([s, -s, s, -s], dtype=torch.float64))
    assert math.isclose(float(action_deltas(torch.tensor(0)).trace()), 4.0)


def test_depth_is_the_camera_z_of_the_floor_and_ceiling_of_an_empty_room():
    from wc_fast.rewards.camera_fit import prior_depth
    from wc_fast.world.render import depth
    from wc_fast.world.scene import sample_scenes

    scenes = sample_scenes(2, torch.Generator().manual_seed(5))
    for name in ("box_lo", "box_hi", "pillar"):  # every box and pillar outside the walls
        setattr(scenes, name, torch.full_like(getattr(scenes, name), 1000.0))
    pitch = torch.tensor([15.0, -10.0], dtype=torch.float64)
    c2w = torch.eye(4, dtype=torch.float64).repeat(2, 1, 1, 1)
    c2w[:, 0, :3, :3] = rot_x(pitch)  # at the room's centre, height 0, pitched
    got = depth(scenes, c2w, resolution=32)
    assert got.shape == (2, 1, 32, 32) and bool(torch.isfinite(got).all())
    # the canonical room's floor and ceiling are this world's; its walls are not (only the
    # pixels that see the floor or the ceiling, nearer than any wall, are compared)
    prior = prior_depth(32, pitch, torch.zeros(2))
    near = prior < 2.5
    assert near.sum() > 200
    torch.testing.assert_close(got[:, 0][near].double(), prior[near], rtol=1e-5, atol=1e-5)
    # pitched up, the camera looks at the ceiling head on and at the floor obliquely
    assert bool((got[0, 0, -1] > got[0, 0, 0]).all())


def test_depth_rejects_poses_that_do_not_match_the_scenes():
    from wc_fast.world.render import depth
    from wc_fast.world.scene import sample_scenes

    scenes = sample_scenes(2, torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="c2w"):
        depth(scenes, torch.eye(4).repeat(3, 1, 1, 1))
    with pytest.raises(ValueError, match="c2w"):
        depth(scenes, torch.eye(4).repeat(2, 1, 1))
