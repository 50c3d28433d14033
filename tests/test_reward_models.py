"""Shipped reward models, reward functions, degradations, adapters and the rollout picture."""

import sys
import types

import pytest
import torch

from wc_fast import world
from wc_fast.actions import split_action
from wc_fast.config import preset
from wc_fast.rewards import (
    CameraEstimator,
    VisualQualityScorer,
    if_scores,
    load_critic,
    load_estimator,
    vq_scores,
)
from wc_fast.rewards import weights as weights_lib
from wc_fast.rewards.adapters import DepthAnything3Estimator, HPSv3Scorer
from wc_fast.rewards.degrade import KINDS, STRENGTHS, degraded_pairs, gaussian_blur
from wc_fast.rewards.estimators import (
    decode_pose,
    delta_to_params,
    params_to_delta,
    pose_loss,
    step_probabilities,
)
from wc_fast.rewards.scoring import stride_frames
from wc_fast.world.motion import ROTATION_STEP_DEG, TRANSLATION_STEP, action_deltas

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def clips():
    return world.sample_clips(8, seed=77)


@pytest.fixture(scope="module")
def thresholds():
    reward = preset("cpu").reward
    return {"trans_thresholds": reward.trans_thresholds,
            "rot_threshold_deg": reward.rot_threshold_deg}


@pytest.mark.parametrize("which", ["reward", "eval"])
def test_estimators_load_from_the_package_and_run(which, clips, thresholds):
    est = load_estimator(which)
    assert isinstance(est, CameraEstimator)
    with torch.no_grad():
        c2w = est(clips.frames)
    assert c2w.shape == (8, 5, 4, 4) and c2w.dtype == torch.float32
    assert torch.equal(c2w[:, 0], torch.eye(4).expand(8, 4, 4))
    assert torch.isfinite(c2w).all()
    # Loose sanity only; the acceptance numbers come from evaluate_reward_models.
    assert float(if_scores(est, clips.frames, clips.actions, **thresholds).mean()) > 0.8


def test_estimators_resize_other_resolutions(clips):
    small = torch.nn.functional.interpolate(clips.frames.flatten(0, 1), size=(16, 16),
                                            mode="area").unflatten(0, (8, 5))
    with torch.no_grad():
        assert load_estimator("reward")(small).shape == (8, 5, 4, 4)


def test_critic_loads_and_scores_per_frame(clips):
    critic = load_critic()
    assert isinstance(critic, VisualQualityScorer)
    with torch.no_grad():
        scores = critic(clips.frames, prompt="a room")
    assert scores.shape == (8, 5) and torch.isfinite(scores).all()
    gen = torch.Generator().manual_seed(0)
    clean, blurred = degraded_pairs(world.sample_clips(8, seed=78, segment_frames=1).frames,
                                    "blur", gen)
    with torch.no_grad():
        s = critic(torch.stack([clean, blurred], 1))
    assert float((s[:, 0] > s[:, 1]).float().mean()) >= 0.75


def test_unknown_estimator_name_raises():
    with pytest.raises(ValueError, match="reward"):
        load_estimator("best")


def test_missing_weights_name_the_path_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(weights_lib, "ASSETS", tmp_path)
    with pytest.raises(FileNotFoundError, match="--which reward") as err:
        load_estimator("reward")
    assert str(tmp_path / "camera_reward.safetensors") in str(err.value)
    with pytest.raises(FileNotFoundError, match="--which critic"):
        load_critic()


class _GroundTruth:
    """A perfect estimator for known clips: their poses relative to the first frame."""

    def __init__(self, c2w):
        self.c2w = c2w

    def __call__(self, frames):
        return torch.linalg.inv(self.c2w[:, :1]) @ self.c2w


class _IndexCritic:
    """Scores frame t of clip i as ``10*i + t`` (checks which frames VQ picks)."""

    def __call__(self, frames, prompt=None):
        n, t = frames.shape[:2]
        return (10.0 * torch.arange(n)[:, None] + frames[:, :, 0, 0, 0]).float()


def test_if_scores_of_ground_truth_poses_are_one(clips, thresholds):
    est = _GroundTruth(clips.c2w)
    assert torch.equal(if_scores(est, clips.frames, clips.actions, **thresholds),
                       torch.ones(8))
    # id = 9 * translation + rotation: +1 makes every rotation label wrong and keeps the
    # translation right, except after rotation 8, which carries into a wrong translation
    wrong = (clips.actions + 1) % 81
    _, rot = split_action(clips.actions)
    want = (rot < 8).double().mean(-1) / 2
    torch.testing.assert_close(if_scores(est, clips.frames, wrong, **thresholds).double(), want)
    one = _GroundTruth(clips.c2w[:1].expand(3, -1, -1, -1))
    shared = if_scores(one, clips.frames[:1].expand(3, -1, -1, -1, -1), clips.actions[0],
                       **thresholds)
    assert shared.shape == (3,) and torch.equal(shared, torch.ones(3))


def test_vq_stride_and_drift_pick_the_documented_frames():
    frames = torch.arange(9.0)[None, :, None, None, None].expand(2, 9, 3, 4, 4)  # F = 8
    critic = _IndexCritic()
    assert stride_frames(8, 4) == [4, 8] and stride_frames(4, 4) == [4]
    assert stride_frames(4, 1) == [1, 2, 3, 4] and stride_frames(3, 4) == [3]
    assert vq_scores(critic, frames, stride=4).tolist() == [6.0, 16.0]
    assert vq_scores(critic, frames, stride=4, mode="drift").tolist() == [6.0, 6.0]
    assert vq_scores(critic, frames, stride=1).tolist() == [4.5, 14.5]
    with pytest.raises(ValueError, match="mode"):
        vq_scores(critic, frames, stride=4, mode="best")


def test_reward_functions_check_shapes(clips, thresholds):
    est = _GroundTruth(clips.c2w)
    with pytest.raises(ValueError, match=r"\[n, F\+1, C, H, W\]"):
        if_scores(est, clips.frames[:, 0], clips.actions, **thresholds)
    with pytest.raises(ValueError, match="F=4"):
        if_scores(est, clips.frames, clips.actions[:, :3], **thresholds)


@pytest.mark.parametrize("speed", [1.0, 0.55])
def test_pose_decoding_round_trips_actions(speed):
    """delta_to_params inverts params_to_delta; logits set to the two-hot targets of a
    fractional step decode to that step, and the loss then reaches its minimum (the targets'
    entropy)."""
    actions = torch.arange(81)
    delta = action_deltas(actions, translation_step=TRANSLATION_STEP * speed,
                          rotation_step_deg=ROTATION_STEP_DEG * speed)
    target = delta_to_params(delta).float()
    assert torch.allclose(target[:, [0, 2, 3, 4]].abs().max(), torch.tensor(speed))
    assert torch.allclose(params_to_delta(target.double()), delta, atol=1e-6)
    probs = step_probabilities(target[:, [0, 2, 3, 4]])
    raw = torch.zeros(81, 14)
    raw[:, :12] = probs.clamp_min(1e-12).log().flatten(1)
    assert torch.allclose(decode_pose(raw), target, atol=1e-6)
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()
    assert float(pose_loss(raw, target)) == pytest.approx(float(entropy), abs=1e-5)


def test_pose_loss_is_lowest_at_the_true_fraction():
    target = torch.tensor([[0.6, 0.0, -0.3, 0.8, 0.0, 0.0]])
    best = torch.zeros(1, 14)
    best[:, :12] = step_probabilities(target[:, [0, 2, 3, 4]]).clamp_min(1e-12).log().flatten(1)
    whole = torch.zeros(1, 14)  # confident in whole steps
    whole[:, :12] = 30.0 * step_probabilities(target[:, [0, 2, 3, 4]].sign()).flatten(1)
    assert float(pose_loss(best, target)) < float(pose_loss(whole, target))


def test_degradations_have_the_stated_effect():
    frames = world.sample_clips(10, seed=5, segment_frames=1).frames
    gen = torch.Generator().manual_seed(1)
    for kind in KINDS:
        clean, bad = degraded_pairs(frames, kind, gen)
        assert clean.shape == bad.shape == (10, 3, 32, 32)
        assert float(bad.min()) >= -1 and float(bad.max()) <= 1
        assert float((clean - bad).abs().mean()) > 0.005, kind
    flat = torch.full((2, 3, 8, 8), 0.3)
    assert torch.allclose(gaussian_blur(flat, torch.tensor([0.7, 1.4])), flat, atol=1e-6)
    assert set(STRENGTHS) == set(KINDS)


def _fake_module(monkeypatch, name, **attrs):
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_adapters_without_their_packages_name_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "depth_anything_3", None)
    monkeypatch.setitem(sys.modules, "depth_anything_3.api", None)
    monkeypatch.setitem(sys.modules, "hpsv3", None)
    with pytest.raises(ImportError, match="pip install depth-anything-3"):
        DepthAnything3Estimator(tmp_path)
    with pytest.raises(ImportError, match="pip install hpsv3"):
        HPSv3Scorer(tmp_path)


def test_adapters_without_their_checkpoints_name_the_path(monkeypatch, tmp_path):
    _fake_module(monkeypatch, "depth_anything_3")
    _fake_module(monkeypatch, "depth_anything_3.api", DepthAnything3=object)
    _fake_module(monkeypatch, "hpsv3", HPSv3RewardInferencer=object)
    missing = tmp_path / "nothing_here"
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        DepthAnything3Estimator(missing)
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        HPSv3Scorer(missing / "HPSv3_7B.pth")


def test_rollout_grid_writes_a_png(tmp_path, clips):
    from wc_fast.infra.viz import save_rollout_grid

    est = _GroundTruth(clips.c2w)(clips.frames)
    out = save_rollout_grid(tmp_path / "grid.png", clips.frames[:3], clips.c2w[:3], est[:3],
                            titles=["a", "b", "c"])
    assert out.stat().st_size > 1000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
