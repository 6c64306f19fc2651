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
"""The procedural scene: deterministic, geometrically exact poses and depth, a closed loop.

Run: ``pytest test/tools/test_synthetic_scene.py`` (a few seconds on 2 cores).

The strongest check is photometric: pixels of one frame, lifted with the rendered depth and the
ground-truth poses and projected into another frame, land on the same colours; with a wrong pose
they do not.
"""

from lingbot_map_ros.tools.synthetic_scene import camera_path, pinhole_intrinsics
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
import numpy as np
import pytest

SMALL = SceneConfig(width=160, height=90, num_frames=30)


@pytest.fixture(scope='module')
def seq():
    return render_sequence(SMALL)


def _reprojection_error(seq, i: int, j: int, c2w_i: np.ndarray) -> tuple[float, float]:
    """(fraction of frame i visible in frame j, mean abs colour difference 0-255 there)."""
    k = seq.intrinsics
    h, w = seq.depth.shape[1:]
    v, u = np.mgrid[0:h, 0:w]
    # Pixel centres: the renderer casts rays through (u + 0.5, v + 0.5).
    pix = np.stack([u + 0.5, v + 0.5, np.ones((h, w))], -1).reshape(-1, 3)
    cam = (pix @ np.linalg.inv(k).T) * seq.depth[i].reshape(-1, 1)
    world = cam @ c2w_i[:3, :3].T + c2w_i[:3, 3]
    w2c = np.linalg.inv(seq.c2w[j])
    cam_j = world @ w2c[:3, :3].T + w2c[:3, 3]
    proj = cam_j @ k.T
    uj, vj = proj[:, 0] / proj[:, 2], proj[:, 1] / proj[:, 2]
    inside = (cam_j[:, 2] > 0.1) & (uj >= 0) & (uj < w) & (vj >= 0) & (vj < h)
    ui, vi = np.floor(uj[inside]).astype(int), np.floor(vj[inside]).astype(int)
    visible = np.abs(seq.depth[j][vi, ui] - cam_j[inside, 2]) < 0.03 * cam_j[inside, 2]
    a = seq.images[i].reshape(-1, 3)[inside][visible].astype(float)
    b = seq.images[j][vi[visible], ui[visible]].astype(float)
    return float(inside.mean()), float(np.abs(a - b).mean())


def test_shapes_stamps_and_intrinsics(seq):
    assert seq.images.shape == (30, 90, 160, 3) and seq.images.dtype == np.uint8
    assert seq.depth.shape == (30, 90, 160)
    assert seq.c2w.shape == (30, 4, 4)
    np.testing.assert_array_equal(np.diff(seq.stamps_ns), 100_000_000)  # 10 fps
    assert seq.stamps_ns[0] == SMALL.start_ns
    # 75 deg horizontal field of view: f = 80 / tan(37.5 deg).
    np.testing.assert_allclose(seq.intrinsics, [[104.2576, 0, 80], [0, 104.2576, 45], [0, 0, 1]],
                               atol=1e-3)
    # Textured, not flat: a wide spread of intensities.
    assert seq.images.std() > 20 and 40 < seq.images.mean() < 200


def test_poses_are_rigid_start_at_identity_and_close_the_loop(seq):
    np.testing.assert_allclose(seq.c2w[0], np.eye(4), atol=1e-12)
    rot = seq.c2w[:, :3, :3]
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rot.shape),
                               atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-12)
    steps = np.linalg.norm(np.diff(seq.c2w[:, :3, 3], axis=0), axis=1)
    closing = np.linalg.norm(seq.c2w[-1, :3, 3] - seq.c2w[0, :3, 3])
    assert steps.min() > 0.2 and closing < 1.5 * steps.max()
    # The camera looks ahead: optical z of frame 0 points towards where it goes next.
    assert seq.c2w[1, 2, 3] > 0.1


def test_depth_and_poses_reproject_onto_the_same_colours(seq):
    for i, j in ((1, 0), (2, 0), (5, 4), (29, 0)):
        overlap, error = _reprojection_error(seq, i, j, seq.c2w[i])
        assert overlap > 0.3, (i, j, overlap)
        assert error < 6.0, (i, j, error)
    # Control: a pose 10 cm off already gives several times the error.
    off = seq.c2w[2].copy()
    off[:3, 3] += (0.1, 0.0, 0.0)
    _, wrong = _reprojection_error(seq, 2, 0, off)
    assert wrong > 10.0


def test_deterministic_per_seed():
    cfg = SceneConfig(width=64, height=36, num_frames=3, seed=5)
    a, b = render_sequence(cfg), render_sequence(cfg)
    # Rendered through float maths: a round-off may move one pixel by one level.
    assert np.abs(a.images.astype(int) - b.images).max() <= 1
    np.testing.assert_allclose(a.c2w, b.c2w, rtol=0, atol=1e-12)
    other = render_sequence(SceneConfig(width=64, height=36, num_frames=3, seed=6))
    assert np.abs(other.images.astype(int) - a.images).mean() > 5
    np.testing.assert_allclose(other.c2w, a.c2w, rtol=0, atol=1e-12)  # seed: textures only


def test_camera_path_and_intrinsics_helpers():
    poses = camera_path(8)
    # Eye height above the floor of the z-up room frame, optical y (down) pointing down-ish.
    assert np.all((poses[:, 2, 3] > 1.0) & (poses[:, 2, 3] < 1.5))
    assert np.all(poses[:, 2, 1] < -0.9)
    k = pinhole_intrinsics(200, 100, 90.0)
    np.testing.assert_allclose(k[0, 0], 100.0)


@pytest.mark.parametrize('bad', [{'width': 8}, {'num_frames': 0}, {'fps': 0.0},
                                 {'hfov_deg': 170.0}, {'supersample': 0}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        SceneConfig(**bad)
