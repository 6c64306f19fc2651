# Copyright 2026 The lingbot_map_ros Authors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Pose decoding, quaternions, intrinsics mapping and depth unprojection.

Golden: ../shared/golden/pose_decode.* (official decode of 20 encodings at 294x518), found
through ``test/conftest.py``.
Run: ``python -m pytest test/engine/test_geometry.py``
"""

from __future__ import annotations

import json
import math

from lingbot_map_ros.engine.image.geometry import (intrinsics_for_original,
                                                   pose_encoding_to_extrinsics,
                                                   pose_encoding_to_intrinsics,
                                                   quaternion_to_rotation, rotation_to_quaternion,
                                                   to_c2w_4x4, unproject_depth)
from lingbot_map_ros.engine.image.preprocess import preprocess_array
import numpy as np
import pytest
from safetensors.torch import load_file
import torch


def _random_quaternions(n: int, seed: int) -> np.ndarray:
    """Non-unit xyzw quaternions, including w ~ 0 (180-degree) and identity-like cases."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, size=(n, 4))
    q[0] = [0.0, 0.0, 0.0, 2.0]
    q[1] = [1.0, 0.0, 0.0, 0.0]  # 180 degrees about x
    q[2] = [0.0, 0.6, 0.8, 1e-9]  # almost 180 degrees
    q[3] = [0.3, -0.2, 0.1, -5.0]
    return q


def test_pose_decode_matches_golden(shared_file) -> None:
    meta = json.loads(shared_file('golden', 'pose_decode.json').read_text())
    ref = load_file(shared_file('golden', 'pose_decode.safetensors'))
    image_size_hw = tuple(meta['image_size_hw'])
    ext = pose_encoding_to_extrinsics(ref['pose_enc'])
    intr = pose_encoding_to_intrinsics(ref['pose_enc'], image_size_hw)
    assert ext.dtype == torch.float64 and ext.shape == (20, 3, 4)
    assert (ext - ref['extrinsics']).abs().max() <= meta['tolerance']['extrinsics_atol']
    expected = ref['intrinsics'].double()
    nonzero = expected != 0
    assert torch.equal(intr != 0, nonzero)
    rel = ((intr - expected).abs()[nonzero] / expected[nonzero]).max()
    assert rel <= meta['tolerance']['intrinsics_rtol']
    # numpy in, numpy out, same numbers.
    ext_np = pose_encoding_to_extrinsics(ref['pose_enc'].numpy())
    assert isinstance(ext_np, np.ndarray)
    # Exact: the numpy path wraps the same buffer and runs the same torch operations.
    np.testing.assert_array_equal(ext_np, ext.numpy())


def test_rotation_formula_and_orthonormality() -> None:
    q = _random_quaternions(64, seed=1)
    rot = quaternion_to_rotation(q)
    # Independent reference: normalise, then the unit-quaternion matrix (scalar-last).
    x, y, z, w = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    expected = np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2)
    np.testing.assert_allclose(rot, expected, atol=1e-12)
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rot.shape),
                               atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-12)
    # 30 degrees about z maps x to (cos 30, sin 30, 0).
    half = math.radians(15)
    rz = quaternion_to_rotation(torch.tensor([0.0, 0.0, math.sin(half), math.cos(half)],
                                             dtype=torch.float64))
    torch.testing.assert_close(rz[:, 0], torch.tensor([math.cos(2 * half), math.sin(2 * half),
                                                       0.0], dtype=torch.float64))


def test_quaternion_round_trip() -> None:
    q = _random_quaternions(256, seed=2)
    q_unit = q / np.linalg.norm(q, axis=1, keepdims=True)
    q_unit = np.where(q_unit[:, 3:] < 0, -q_unit, q_unit)
    back = rotation_to_quaternion(quaternion_to_rotation(q))
    assert isinstance(back, np.ndarray)
    np.testing.assert_allclose(np.linalg.norm(back, axis=1), 1.0, atol=1e-12)
    assert (back[:, 3] >= 0).all()
    # Same rotation: q and -q are equivalent; w ~ 0 cases may flip the sign.
    err = np.minimum(np.abs(back - q_unit).max(1), np.abs(back + q_unit).max(1))
    assert err.max() < 1e-8
    np.testing.assert_allclose(quaternion_to_rotation(back), quaternion_to_rotation(q),
                               atol=1e-12)


def test_to_c2w_4x4_inverts_to_world_to_camera() -> None:
    pose = np.concatenate([np.random.default_rng(3).uniform(-2, 2, (8, 3)),
                           _random_quaternions(8, seed=3), np.ones((8, 2))], axis=1)
    ext = pose_encoding_to_extrinsics(torch.from_numpy(pose))
    c2w = to_c2w_4x4(ext)
    assert c2w.shape == (8, 4, 4)
    torch.testing.assert_close(c2w[:, 3], torch.tensor([0, 0, 0, 1.0],
                                                       dtype=torch.float64).expand(8, 4))
    # c2w maps the camera origin to t, the camera centre in the world.
    origin = torch.tensor([0, 0, 0, 1.0], dtype=torch.float64)
    torch.testing.assert_close((c2w @ origin)[:, :3], torch.from_numpy(pose[:, :3]))


def test_intrinsics_clamp_fov_and_reject_bad_input() -> None:
    pose = torch.zeros(3, 9, dtype=torch.float64)
    pose[:, 6] = 1.0
    pose[:, 7:] = torch.tensor([[0.0, 0.0], [1.0, 1.2], [4.0, -1.0]], dtype=torch.float64)
    k = pose_encoding_to_intrinsics(pose, (294, 518), min_fov_rad=1e-3)
    assert torch.isfinite(k).all() and (k[:, 0, 0] > 0).all() and (k[:, 1, 1] > 0).all()
    assert k[0, 1, 1] == pytest.approx(147 / math.tan(5e-4))
    assert k[1, 0, 0] == pytest.approx(259 / math.tan(0.6))
    assert k[1, 1, 1] == pytest.approx(147 / math.tan(0.5))
    assert k[2, 1, 1] == pytest.approx(147 / math.tan((math.pi - 1e-3) / 2))
    assert (k[:, 0, 2] == 259).all() and (k[:, 1, 2] == 147).all()
    with pytest.raises(ValueError, match='non-finite'):
        pose_encoding_to_intrinsics(torch.full((9,), float('nan')), (294, 518))
    with pytest.raises(ValueError, match='zero'):
        pose_encoding_to_extrinsics(torch.zeros(9))
    with pytest.raises(ValueError, match='shape'):
        pose_encoding_to_extrinsics(torch.zeros(7))
    with pytest.raises(ValueError, match='shape'):
        to_c2w_4x4(torch.zeros(4, 4))


def test_unprojection_projects_back_to_the_pixel() -> None:
    rng = np.random.default_rng(4)
    height, width = 14, 28
    pose = np.concatenate([rng.uniform(-2, 2, (2, 3)), rng.uniform(-1, 1, (2, 4)),
                           rng.uniform(0.5, 2.0, (2, 2))], axis=1)
    depth = rng.uniform(0.5, 3.0, (2, height, width))
    ext = pose_encoding_to_extrinsics(pose)
    k = pose_encoding_to_intrinsics(pose, (height, width))
    points = unproject_depth(depth, k, ext)
    assert points.shape == (2, height, width, 3)
    # Project back with numpy: X_c = R^T (X_w - t), pixel = K X_c / z.
    rot, trans = ext[:, :, :3], ext[:, :, 3]
    cam = np.einsum('bji,bhwj->bhwi', rot, points - trans[:, None, None])
    pix = np.einsum('bij,bhwj->bhwi', k, cam)
    np.testing.assert_allclose(cam[..., 2], depth, rtol=1e-12)
    v, u = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
    np.testing.assert_allclose(pix[..., 0] / pix[..., 2], np.broadcast_to(u, depth.shape),
                               atol=1e-9)
    np.testing.assert_allclose(pix[..., 1] / pix[..., 2], np.broadcast_to(v, depth.shape),
                               atol=1e-9)
    # The principal-point pixel (u, v) = (W/2, H/2) lies on the optical axis: t + d * R[:, 2].
    np.testing.assert_allclose(points[:, height // 2, width // 2],
                               trans + depth[:, height // 2, width // 2, None] * rot[:, :, 2],
                               atol=1e-12)


@pytest.mark.parametrize('size_hw', [(480, 640), (640, 480)])
def test_intrinsics_for_original_follows_the_resized_image(size_hw: tuple[int, int]) -> None:
    """A blob drawn where K_original projects a point appears where K_processed projects it."""
    height, width = size_hw
    k_proc = np.array([[400.0, 0.0, 259.0], [0.0, 380.0, 0.0], [0.0, 0.0, 1.0]])
    _, info = preprocess_array(np.zeros((height, width, 3), np.uint8))
    k_proc[1, 2] = info.image_size_hw[0] / 2
    k_orig = intrinsics_for_original(k_proc, info)
    point = np.array([0.13, -0.07, 1.0])
    u_o, v_o = (k_orig @ point)[:2]
    rows, cols = np.mgrid[0:height, 0:width]
    blob = 255.0 * np.exp(-((cols - u_o) ** 2 + (rows - v_o) ** 2) / (2 * 6.0 ** 2))
    image, _ = preprocess_array(np.repeat(np.round(blob).astype(np.uint8)[..., None], 3, -1))
    weight = image[0].double().numpy()
    prow, pcol = np.mgrid[0:weight.shape[0], 0:weight.shape[1]]
    centroid = ((weight * pcol).sum() / weight.sum(), (weight * prow).sum() / weight.sum())
    expected = (k_proc @ point)[:2]
    # Measured: 0.007 px; without the half-pixel terms it would be 0.04-0.09 px.
    np.testing.assert_allclose(centroid, expected, atol=0.02)
