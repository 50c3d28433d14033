"""Our actions and commanded camera path -> WorldPlay's action ids, view matrices and
intrinsics (wc_fast.models.worldplay.camera), on hand-worked cases and against a transcription
of the labelling in HY-WorldPlay's hyvideo/generate.py (pose_to_input)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from scipy.spatial.transform import Rotation

from wc_fast.models.worldplay.camera import (
    action_keys,
    camera_path,
    history_cameras,
    intrinsics,
    rebase,
    view_matrices,
)

# (forward, backward, right, left) and (yaw right, yaw left, pitch up, pitch down) one-hots ->
# label, generate.py's `mapping`
LABELS = {(0, 0, 0, 0): 0, (1, 0, 0, 0): 1, (0, 1, 0, 0): 2, (0, 0, 1, 0): 3, (0, 0, 0, 1): 4,
          (1, 0, 1, 0): 5, (1, 0, 0, 1): 6, (0, 1, 1, 0): 7, (0, 1, 0, 1): 8}


def official_label(prev_c2w: np.ndarray, c2w: np.ndarray) -> int:
    """pose_to_input's action label of a frame from the previous frame's pose (first-person)."""
    rel = np.linalg.inv(prev_c2w) @ c2w
    trans, rot = [0] * 4, [0] * 4
    move = rel[:3, 3]
    norm = np.linalg.norm(move)
    if norm > 0.0001:
        angles = np.degrees(np.arccos((move / norm).clip(-1.0, 1.0)))
        if angles[2] < 60:
            trans[0] = 1
        elif angles[2] > 120:
            trans[1] = 1
        if angles[0] < 60:
            trans[2] = 1
        elif angles[0] > 120:
            trans[3] = 1
    euler = Rotation.from_matrix(rel[:3, :3]).as_euler("xyz", degrees=True)
    if euler[1] > 5e-2:
        rot[0] = 1
    elif euler[1] < -5e-2:
        rot[1] = 1
    if euler[0] > 5e-2:
        rot[2] = 1
    elif euler[0] < -5e-2:
        rot[3] = 1
    return LABELS[tuple(trans)] * 9 + LABELS[tuple(rot)]


def test_every_action_id_is_recovered_by_the_official_labelling():
    ids = torch.arange(81)
    actions = torch.stack([torch.zeros_like(ids), ids], dim=1)  # prompt frame, then the action
    poses = history_cameras(actions).numpy()
    assert [official_label(p[0], p[1]) for p in poses] == ids.tolist()


def test_forward_moves_along_the_camera_axis_by_the_pipeline_speed():
    c2w = camera_path(action_keys(torch.tensor([[9, 9]])).double())[0]  # forward, twice
    expected = torch.eye(4, dtype=torch.float64)
    expected[2, 3] = 0.16
    torch.testing.assert_close(c2w[1], expected)


def test_yaw_right_then_forward_turns_the_camera_and_moves_along_its_new_axis():
    # id 1: yaw right alone; id 9: forward alone
    c2w = camera_path(action_keys(torch.tensor([[1, 9]])).double())[0]
    a = math.radians(3.0)
    rot_y = torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0,
                                                                       math.cos(a)]],
                         dtype=torch.float64)
    torch.testing.assert_close(c2w[0, :3, :3], rot_y)
    torch.testing.assert_close(c2w[1, :3, 3], 0.08 * rot_y[:, 2])


def test_soft_keys_move_by_their_share():
    keys = torch.zeros(1, 1, 8, dtype=torch.float64)
    keys[..., 0] = 0.25
    assert float(camera_path(keys)[0, 0, 2, 3]) == 0.25 * 0.08


def test_view_matrices_invert_the_poses_and_rebase_puts_a_frame_at_the_origin():
    c2w = history_cameras(torch.tensor([[0, 37, 80, 5, 64]]))
    w2c = view_matrices(c2w)
    eye = torch.eye(4, dtype=torch.float64).expand_as(c2w)
    torch.testing.assert_close(w2c @ c2w, eye)
    torch.testing.assert_close(rebase(c2w, c2w[:, -1])[:, -1], eye[:, 0])


def test_intrinsics_normalise_the_default_k_as_pose_to_input_does():
    k = intrinsics(2)
    assert k.shape == (2, 3, 3)
    torch.testing.assert_close(k[0], torch.tensor([[969.6969696969696 / 1920, 0, 0.5],
                                                   [0, 969.6969696969696 / 1080, 0.5],
                                                   [0, 0, 1.0]], dtype=torch.float64))


def test_matches_the_official_pose_to_input_on_every_key():
    """The golden fixture holds what HY-WorldPlay's own pose_to_input makes of a pose string
    that presses every key (studies/make_worldplay_fixture.py)."""
    fixture = Path(__file__).parent / "fixtures" / "worldplay_tiny"
    card = json.loads(fixture.with_suffix(".json").read_text())
    tensors = load_file(fixture.with_suffix(".safetensors"))
    labels = tensors["fixture.pose_actions"]
    # w, yaw right, d, pitch up, s, yaw left, a, pitch down: our ids, one per latent frame
    ours = {"w": 9, "right": 1, "d": 27, "up": 3, "s": 18, "left": 2, "a": 36, "down": 4}
    expected = [0] + [ours[key] for cmd in card["pose_string"].split(",")
                      for key, n in [cmd.strip().split("-")] for _ in range(int(n))]
    assert labels.tolist() == expected
    torch.testing.assert_close(view_matrices(history_cameras(labels[None]))[0],
                               tensors["fixture.pose_w2c"], rtol=0, atol=1e-12)
    torch.testing.assert_close(intrinsics(len(labels)), tensors["fixture.pose_intrinsics"],
                               rtol=0, atol=1e-12)
