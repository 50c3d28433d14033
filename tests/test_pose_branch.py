"""The camera-pose branch: pressed keys -> a frame's affine flow, linear in the keys, zero at
init, the same on the cached and teacher-forced paths."""

import copy
import dataclasses

import pytest
import torch

from wc_fast.actions import action_id
from wc_fast.config import ModelConfig, preset
from wc_fast.models import TinyWorldDiT
from wc_fast.models.pretrained import export_world_model, load_world_model
from wc_fast.models.tiny.dit import POSE_GAIN, accumulate_over_clips, affine_flow, warp
from wc_fast.train import initial_model

CFG = ModelConfig(resolution=16, channels=3, clip_frames=2, patch=4, dim=48, depth=2, heads=3,
                  prediction="warp", reference_frame=True)


def _randomised(cfg: ModelConfig, seed: int = 0) -> TinyWorldDiT:
    torch.manual_seed(seed)
    model = TinyWorldDiT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.1)
    return model


def _inputs(clips: int = 2, b: int = 2, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    f = CFG.clip_frames
    frames = torch.randn(b, 1 + clips * f, 3, 16, 16, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 81, (b, clips * f), generator=g)
    x_t = torch.randn(b, clips * f, 3, 16, 16, generator=g, dtype=torch.float64)
    sigma = torch.rand(b, clips, generator=g, dtype=torch.float64)
    return frames, actions, x_t, sigma


def test_a_zero_branch_added_to_a_model_leaves_every_output_unchanged():
    base = _randomised(CFG)
    posed = copy.deepcopy(base)
    posed.add_pose_branch()
    assert posed.cfg.pose_branch and not posed.pose_flow.weight.any()
    frames, actions, x_t, sigma = _inputs()
    with torch.no_grad():
        want = base.teacher_forced_velocity(frames, actions, x_t, sigma, context_sigma=0.02)
        got = posed.teacher_forced_velocity(frames, actions, x_t, sigma, context_sigma=0.02)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_teacher_forced_path_equals_the_cached_path_with_a_trained_branch():
    model = _randomised(dataclasses.replace(CFG, pose_branch=True))
    assert model.pose_flow.weight.any()
    frames, actions, x_t, sigma = _inputs()
    f = CFG.clip_frames
    with torch.no_grad():
        tf = model.teacher_forced_velocity(frames, actions, x_t, sigma, context_sigma=0.02)
        for row in range(2):
            hist = torch.cat([torch.zeros(1, 1, dtype=torch.long), actions[row:row + 1]], dim=1)
            for j in range(2):
                cache = model.extend_cache(model.empty_cache(), frames[row:row + 1, :1 + f * j],
                                           hist[:, :1 + f * j], sigma=0.02)
                clip = slice(f * j, f * (j + 1))
                want = model.velocity(x_t[row:row + 1, clip], sigma[row:row + 1, j],
                                      actions[row:row + 1, clip], cache)
                torch.testing.assert_close(tf[row:row + 1, clip], want, rtol=1e-9, atol=1e-9)


def test_a_key_combination_moves_the_view_by_the_sum_of_its_keys_motions():
    """With the transformer's head at zero, the clean-clip estimate is the reference frame
    warped by the branch's affine flow alone: a yaw key that shifts by 1 px per frame and a
    forward key that zooms give, pressed together, the warp of the summed affine flow."""
    torch.manual_seed(0)
    model = TinyWorldDiT(dataclasses.replace(CFG, pose_branch=True)).double()
    keys = model.keys_of_action
    forward, yaw_right = action_id(torch.tensor(1), torch.tensor(0)), action_id(
        torch.tensor(0), torch.tensor(1))
    both = action_id(torch.tensor(1), torch.tensor(1))
    col_f, col_y = int(keys[forward].argmax()), int(keys[yaw_right].argmax())
    assert keys[both, :8].tolist() == (keys[forward] + keys[yaw_right])[:8].tolist()
    with torch.no_grad():
        model.pose_flow.weight[0, col_y] = 1.0 / POSE_GAIN       # shift x by 1 px per frame
        model.pose_flow.weight[1, col_f] = 0.5 / POSE_GAIN       # zoom: 0.5 px at the edge
        model.pose_flow.weight[5, col_f] = 0.5 / POSE_GAIN
    frames, _, _, _ = _inputs(clips=1, b=1)
    prompt = frames[:, :1]
    cache = model.extend_cache(model.empty_cache(), prompt, torch.zeros(1, 1, dtype=torch.long),
                               sigma=0.014)
    x_t = torch.randn(1, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.tensor([0.5], dtype=torch.float64)

    def clean(action: int) -> torch.Tensor:
        with torch.no_grad():
            v = model.velocity(x_t, sigma, torch.tensor([action, action]), cache)
        return x_t - 0.5 * v

    params = torch.zeros(1, 2, 6, dtype=torch.float64)
    params[..., 0] = 1.0
    params[..., 1] = params[..., 5] = 0.5 / 8
    flow = accumulate_over_clips(affine_flow(params, 16), 2)
    want = warp(prompt.expand(1, 2, -1, -1, -1), flow)
    torch.testing.assert_close(clean(both), want, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(clean(forward), want)
    assert not torch.allclose(clean(yaw_right), want)


def test_the_branch_is_trained_with_the_conditioning_and_not_by_muon():
    model = TinyWorldDiT(dataclasses.replace(CFG, pose_branch=True))
    assert any(p is model.pose_flow.weight for p in model.conditioning_parameters())
    assert all(p is not model.pose_flow.weight for p in model.hidden_matrices())


def test_bad_uses_of_the_branch_raise_clear_errors():
    with pytest.raises(ValueError, match="model.pose_branch.*prediction='warp'"):
        TinyWorldDiT(dataclasses.replace(CFG, prediction="velocity", pose_branch=True))
    with pytest.raises(ValueError, match="prediction='warp'"):
        TinyWorldDiT(dataclasses.replace(CFG, prediction="x0")).add_pose_branch()
    with pytest.raises(ValueError, match="already has a pose branch"):
        TinyWorldDiT(dataclasses.replace(CFG, pose_branch=True)).add_pose_branch()


def test_the_shipped_base_gains_a_zero_branch_and_exports_it(tmp_path):
    cfg = preset("cpu")
    cfg.model.pose_branch = True
    model = initial_model(cfg, torch.device("cpu"))
    assert model.cfg.pose_branch and not model.pose_flow.weight.any()
    with torch.no_grad():
        model.pose_flow.weight.normal_()
    path = export_world_model(model, tmp_path / "posed.safetensors", {"command": "test"})
    loaded = load_world_model(path)
    assert loaded.cfg.pose_branch
    torch.testing.assert_close(loaded.pose_flow.weight, model.pose_flow.weight, rtol=0, atol=0)


def test_a_wan_backbone_rejects_the_branch():
    from wc_fast import config as config_lib

    cfg = config_lib.preset("cpu")
    for key, value in (("model.backbone", "wan"), ("model.path", "/some/wan"),
                       ("train.eval_at_end", "false"), ("model.motion_latent", "false"),
                       ("model.pose_branch", "true")):
        config_lib.apply_override(cfg, key, value)
    with pytest.raises(ValueError, match="model.pose_branch"):
        config_lib.validate(cfg)
