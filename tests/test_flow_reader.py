"""The white-box reader: the flow a camera motion implies is the warp head's convention, and the
fit reads the true camera path back from the flow of true renders."""

import math

import pytest
import torch

from wc_fast.actions import split_action
from wc_fast.config import preset
from wc_fast.eval import EVAL_SEED, KINDS, EvalSettings
from wc_fast.models.tiny.dit import warp
from wc_fast.rewards.camera_fit import motion_matrix
from wc_fast.rewards.flow_reader import (
    flow_from_target_depth,
    implied_flow,
    read_path,
    rendered_flow,
    texture_weights,
)
from wc_fast.rewards.interaction import action_accuracy, relative_motion
from wc_fast.world import sample_sequences
from wc_fast.world.dataset import sequence_scenes
from wc_fast.world.render import focal_length

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = EvalSettings.from_config(preset("cpu"))


def _rotation_flow(params: list[float], size: int) -> torch.Tensor:
    """A pure rotation's backward flow ``[2, H, W]``, pixel by pixel: each output pixel's ray
    turned into the reference camera and projected there (depth plays no part)."""
    f = focal_length(size)
    rotation = motion_matrix(torch.tensor([params], dtype=torch.float64))[0, :3, :3]
    flow = torch.zeros(2, size, size, dtype=torch.float64)
    for y in range(size):
        for x in range(size):
            u, v = x + 0.5 - size / 2, y + 0.5 - size / 2
            point = rotation @ torch.tensor([u / f, v / f, 1.0], dtype=torch.float64)
            flow[0, y, x] = f * point[0] / point[2] - u
            flow[1, y, x] = f * point[1] / point[2] - v
    return flow


def test_a_rotation_implies_the_same_flow_at_any_depth_and_points_at_infinity_work():
    params = [0.0, 0.0, 4.0, -3.0]
    delta = motion_matrix(torch.tensor([params] * 2))
    depth = torch.rand(2, 8, 8, dtype=torch.float64) * 3 + 0.5
    depth[1] = torch.inf  # every point at infinity
    depth[0, 0, :4] = float("nan")
    want = _rotation_flow(params, 8)
    got, valid = implied_flow(delta, depth)
    assert valid[:, 2:6, 2:6].all()
    assert want.abs().amax() > 0.5
    # inverting the bilinearly sampled forward map costs a few thousandths of a pixel
    torch.testing.assert_close(got[0][:, valid[0]], want[:, valid[0]], atol=0.01, rtol=0)
    torch.testing.assert_close(got[1][:, valid[1]], want[:, valid[1]], atol=0.01, rtol=0)
    torch.testing.assert_close(flow_from_target_depth(delta, depth)[0], want, atol=1e-9,
                               rtol=0)


def _clips(n: int, kind: str, seed_offset: int):
    fraction, keys = KINDS[kind]
    data = sample_sequences(n, num_clips=1, seed=EVAL_SEED + seed_offset,
                            composite_fraction=fraction, composite_keys=keys)
    scenes, _ = sequence_scenes(EVAL_SEED + seed_offset, n)
    return data, scenes


def test_the_true_flow_warps_the_reference_render_onto_the_next_render():
    data, scenes = _clips(4, "basic", 0)
    flow, _ = rendered_flow(scenes, data.c2w, resolution=32)
    reference = data.frames[:, :1].expand(-1, 4, -1, -1, -1)
    target = data.frames[:, 1:]

    def error(candidate: torch.Tensor) -> float:
        inner = (warp(reference, candidate.float()) - target)[..., 4:-4, 4:-4]
        return inner.abs().mean().item()

    # the convention of the warp head: a backward map in pixels, x first
    assert error(flow) < 0.5 * error(torch.zeros_like(flow))
    assert error(flow) < 0.5 * error(-flow)
    assert error(flow) < 0.5 * error(flow.flip(2))


def test_the_reference_depth_implies_the_flow_the_target_depth_gives():
    data, scenes = _clips(4, "composite", 1)
    flow, reference_depth = rendered_flow(scenes, data.c2w, resolution=32)
    c2w = data.c2w.double()
    delta = torch.linalg.inv(c2w[:, :1]) @ c2w[:, 1:]
    implied, valid = implied_flow(delta.flatten(0, 1),
                                  reference_depth.repeat_interleave(4, 0))
    assert valid.double().mean() > 0.5  # turns of 4 frames leave a third of the view
    difference = (implied - flow.flatten(0, 1)).norm(dim=1)[valid]
    assert difference.median() < 0.01
    assert flow.abs().amax() > 2.0  # the clips do move


def test_read_path_is_the_same_batched_and_alone_and_rejects_bad_shapes():
    data, scenes = _clips(2, "composite_2key", 2)
    flow, depth = rendered_flow(scenes, data.c2w, resolution=32)
    both = read_path(flow, depth)
    alone = read_path(flow[1:], depth[1:])
    torch.testing.assert_close(both[1:], alone, atol=1e-9, rtol=0)
    assert both.shape == (2, 5, 4, 4)
    with pytest.raises(ValueError, match="flow"):
        read_path(flow[:, :, :1], depth)
    with pytest.raises(ValueError, match="depth"):
        read_path(flow, depth[:1])
    with pytest.raises(TypeError, match="flow"):
        read_path(flow.long(), depth)
    with pytest.raises(ValueError, match="weights"):
        read_path(flow, depth, torch.ones(2, 4, 32, 31))
    with pytest.raises(ValueError, match="weights"):
        read_path(flow, depth, torch.zeros(2, 4, 32, 32))


def test_texture_weights_read_the_true_path_and_ignore_what_they_weigh_zero():
    data, scenes = _clips(3, "composite", 1)
    flow, depth = rendered_flow(scenes, data.c2w, resolution=32)
    weights = texture_weights(data.frames[:, 1:])
    assert weights.shape == (3, 4, 32, 32) and bool((weights > 0).all())
    assert weights.amax() > 100 * weights.amin()
    truth = relative_motion(data.c2w.double())
    path = read_path(flow, depth, weights)
    assert (relative_motion(path) - truth).abs().amax() < 0.02
    # a flow scrambled on the left half is read right when the left half weighs nothing
    scrambled = flow.clone()
    scrambled[..., :16] = torch.randn_like(scrambled[..., :16]) * 5
    right = torch.zeros_like(weights)
    right[..., 16:] = 1.0
    assert (relative_motion(read_path(scrambled, depth, right)) - truth).abs().amax() < 0.02


@pytest.mark.parametrize("offset,kind", list(enumerate(KINDS)))
def test_the_reader_reads_the_true_path_from_true_renders(offset, kind):
    data, scenes = _clips(6, kind, offset)
    flow, depth = rendered_flow(scenes, data.c2w, resolution=32)
    path = read_path(flow, depth)
    error = (relative_motion(path) - relative_motion(data.c2w.double())).abs()
    assert error.amax() < 0.02
    trans_gt, rot_gt = split_action(data.actions)
    accuracy = action_accuracy(path, trans_gt, rot_gt,
                               trans_thresholds=SETTINGS.trans_thresholds,
                               rot_threshold_deg=SETTINGS.rot_threshold_deg)
    assert accuracy.mean() >= 0.99
    # a wrong path reads wrong: the reader does not just return the command
    still = read_path(torch.zeros_like(flow), depth)
    assert math.isclose(float(relative_motion(still)[..., :3, 3].abs().amax()), 0.0,
                        abs_tol=1e-6)
