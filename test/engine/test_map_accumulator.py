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
"""MapAccumulator: voxel de-duplication, the bound, the confidence filter, the frame transform.

Run: ``pytest test/engine/test_map_accumulator.py`` (CPU, about a second).
"""

import dataclasses

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.image.geometry import unproject_depth
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.engine.session.prediction import FramePrediction
import numpy as np
import pytest
import torch

K = np.array([[2.0, 0.0, 1.5], [0.0, 2.0, 1.0], [0.0, 0.0, 1.0]])


def config(**overrides):
    return MapConfig(**{'voxel_size': 0.5, 'confidence_percentile': 0.0, 'pixel_stride': 1,
                        **overrides})


def pose(yaw_rad=0.0, t=(0.0, 0.0, 0.0)):
    c, s = np.cos(yaw_rad), np.sin(yaw_rad)
    c2w = np.eye(4)
    c2w[:3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]
    c2w[:3, 3] = t
    return c2w


def sorted_rows(a):
    return a[np.lexsort(a.T[::-1])]


def test_points_are_the_unprojected_depth_in_the_map_frame():
    rng = np.random.default_rng(0)
    depth = rng.uniform(1.0, 4.0, (2, 3)).astype(np.float32)
    c2w = pose(0.7, (1.0, -2.0, 0.5))
    # A voxel far smaller than the spacing of the points: one point per voxel, unchanged.
    acc = MapAccumulator(config(voxel_size=1e-4))
    update = acc.add(depth, None, None, K, c2w)
    assert (update.num_pixels, update.num_points, update.map_points) == (6, 6, 6)
    xyz, rgb = acc.points()
    expected = unproject_depth(depth.astype(np.float64), K, c2w).reshape(-1, 3)
    np.testing.assert_allclose(sorted_rows(xyz), sorted_rows(expected), atol=1e-5)
    assert (rgb == 255).all()  # no colours given: white


def test_same_voxel_points_merge_into_their_weighted_mean_colour_and_position():
    acc = MapAccumulator(config(voxel_size=10.0))
    depth = np.array([[1.0, 2.0]], np.float32)
    k = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    rgb = np.array([[[0, 0, 0], [100, 200, 50]]], np.uint8)
    acc.add(depth, None, rgb, k, np.eye(4))
    xyz, colour = acc.points()
    # Pixels (0, 0) at z=1 and (1, 0) at z=2: points (0, 0, 1) and (2, 0, 2), one voxel.
    np.testing.assert_allclose(xyz, [[1.0, 0.0, 1.5]])
    np.testing.assert_array_equal(colour, [[50, 100, 25]])
    # The same keyframe again: no new voxel, same mean.
    update = acc.add(depth, None, rgb, k, np.eye(4))
    assert (update.map_points, acc.num_points, acc.num_keyframes) == (1, 1, 2)
    np.testing.assert_allclose(acc.points()[0], [[1.0, 0.0, 1.5]])


def test_a_revisited_surface_does_not_grow_the_map():
    rng = np.random.default_rng(1)
    depth = rng.uniform(2.0, 3.0, (30, 40)).astype(np.float32)
    k = np.array([[40.0, 0.0, 20.0], [0.0, 40.0, 15.0], [0.0, 0.0, 1.0]])
    acc = MapAccumulator(config(voxel_size=0.05))
    first = acc.add(depth, None, None, k, pose()).map_points
    assert 0 < first < depth.size  # several pixels share voxels
    assert acc.add(depth, None, None, k, pose()).map_points == first
    # Moved sideways by half a voxel: the points shift, and most voxels are reused.
    grown = acc.add(depth, None, None, k, pose(t=(0.025, 0.0, 0.0))).map_points
    assert first < grown < 2 * first


def test_bound_drops_the_voxels_seen_longest_ago():
    acc = MapAccumulator(config(voxel_size=0.1, max_points=10))
    k = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    depth = np.ones((1, 6), np.float32)  # 6 points 1 apart along x: 6 voxels
    acc.add(depth, None, None, k, pose(t=(0.0, 0.0, 0.0)))
    update = acc.add(depth, None, None, k, pose(t=(0.0, 10.0, 0.0)))
    assert (update.num_dropped, update.map_points) == (2, 10)
    xyz, _ = acc.points()
    # All of the second keyframe (y = 10) stays; 4 of the first remain.
    assert int((np.abs(xyz[:, 1] - 10.0) < 1e-6).sum()) == 6
    assert int((np.abs(xyz[:, 1]) < 1e-6).sum()) == 4
    # Seeing the first keyframe's points again makes them the newest: the second's go now.
    acc.add(depth, None, None, k, pose())
    xyz, _ = acc.points()
    assert int((np.abs(xyz[:, 1]) < 1e-6).sum()) == 6
    assert acc.num_points == 10


def test_confidence_percentile_and_floor():
    depth = np.ones((1, 10), np.float32)
    conf = np.arange(1, 11, dtype=np.float32)[None]  # 1 .. 10
    k = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    acc = MapAccumulator(config(voxel_size=0.01, confidence_percentile=50.0))
    acc.add(depth, conf, None, k, np.eye(4))
    # The upper half by confidence: conf >= median (5.5), pixels u = 5 .. 9.
    np.testing.assert_allclose(np.sort(acc.points()[0][:, 0]), [5, 6, 7, 8, 9])
    acc = MapAccumulator(config(voxel_size=0.01, min_confidence=8.0))
    acc.add(depth, conf, None, k, np.eye(4))
    np.testing.assert_allclose(np.sort(acc.points()[0][:, 0]), [7, 8, 9])
    # Invalid depth and non-finite confidence never enter the map.
    depth[0, 9], conf[0, 8] = 0.0, np.nan
    acc = MapAccumulator(config(voxel_size=0.01))
    assert acc.add(depth, conf, None, k, np.eye(4)).num_points == 8


def test_stride_far_outliers_clear_and_fixed_settings():
    depth = np.ones((4, 6), np.float32)
    depth[0, 0] = 1e9  # far beyond 2**20 voxels
    k = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    acc = MapAccumulator(config(voxel_size=0.01, pixel_stride=2))
    update = acc.add(torch.from_numpy(depth), None, None, k, np.eye(4))
    assert (update.num_pixels, update.num_out_of_range, update.map_points) == (6, 1, 5)
    # Strided pixels keep their full-resolution coordinates: u in {2, 4}, v in {0, 2}.
    xyz = acc.points()[0]
    assert set(np.round(xyz[:, 0], 3)) == {0.0, 2.0, 4.0}
    assert acc.clear() == 5 and acc.num_points == 0 and acc.num_keyframes == 0
    acc.config = config(voxel_size=0.01, pixel_stride=1, confidence_percentile=10.0)
    assert acc.config.pixel_stride == 1
    with pytest.raises(ValueError, match='voxel_size'):
        acc.config = config(voxel_size=0.02)


def test_bad_input_is_refused_with_a_reason():
    acc = MapAccumulator(config())
    with pytest.raises(ValueError, match='confidence'):
        acc.add(np.ones((2, 2)), np.ones((3, 2)), None, K, np.eye(4))
    with pytest.raises(ValueError, match='non-finite'):
        acc.add(np.ones((2, 2)), None, None, K, np.full((4, 4), np.nan))
    assert acc.num_points == 0


@pytest.mark.parametrize('field, value', [('voxel_size', 0.0), ('max_points', 0),
                                          ('confidence_percentile', 100.0),
                                          ('pixel_stride', 0), ('period_s', 0.0)])
def test_config_validation(field, value):
    with pytest.raises(ValueError, match=f'map.{field}'):
        MapConfig(**{field: value})


def test_incremental_map_equals_one_pass_voxel_means():
    """Keyframe by keyframe, the map holds each voxel's mean of every point that fell in it."""
    rng = np.random.default_rng(3)
    k = np.array([[8.0, 0.0, 4.0], [0.0, 8.0, 3.0], [0.0, 0.0, 1.0]])
    acc = MapAccumulator(config(voxel_size=0.2))
    everything = []
    for i in range(6):
        depth = rng.uniform(1.0, 2.0, (6, 8)).astype(np.float32)
        rgb = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        c2w = pose(0.3 * i, (0.1 * i, 0.0, 0.05 * i))
        acc.add(depth, None, rgb, k, c2w)
        world = unproject_depth(depth.astype(np.float64), k, c2w).reshape(-1, 3)
        everything.append(np.concatenate([world, rgb.reshape(-1, 3)], axis=1))
    points = np.concatenate(everything)
    cells = np.floor(points[:, :3].astype(np.float32) / np.float32(0.2)).astype(np.int64)
    _, group = np.unique(cells, axis=0, return_inverse=True)
    group = group.reshape(-1)
    means = np.stack([np.bincount(group, points[:, c]) / np.bincount(group)
                      for c in range(6)], axis=1)
    xyz, rgb = acc.points()
    assert len(xyz) == len(means) and (np.bincount(group) <= 64).all()  # below MAX_WEIGHT
    np.testing.assert_allclose(sorted_rows(xyz), sorted_rows(means[:, :3]), atol=1e-4)
    # The map's keys are sorted and unique after every merge.
    keys = acc.voxel_ids.cpu().numpy()
    assert (np.diff(keys) > 0).all()


def _keyframe(rng: np.random.Generator) -> FramePrediction:
    """Make a keyframe prediction with depth (a few invalid pixels), colours and a pose."""
    depth = rng.uniform(1.0, 3.0, (6, 8)).astype(np.float32)
    depth[0, 0], depth[2, 3], depth[5, 7] = 0.0, np.nan, -1.0
    k = np.array([[6.0, 0.0, 4.0], [0.0, 6.0, 3.0], [0.0, 0.0, 1.0]])
    info = PreprocessInfo(original_size_hw=(6, 8), resized_size_hw=(6, 8), image_size_hw=(6, 8),
                          crop_top=0)
    return FramePrediction(
        frame_index=3, tag=FrameTag(42), role='keyframe', time_index=3,
        pose_enc=np.zeros(9), c2w=pose(0.4, (0.5, -1.0, 2.0)), intrinsics=k,
        intrinsics_original=k, preprocess=info, network_input=torch.rand(3, 6, 8),
        depth=torch.from_numpy(depth), depth_conf=torch.full((6, 8), 2.0),
        image=torch.from_numpy(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)))


def test_the_cloud_and_the_map_get_one_unprojection_of_a_keyframe():
    pred = _keyframe(np.random.default_rng(5))
    odom_from_world = pose(-0.2, (3.0, 0.0, -1.0))
    points = pred.points(odom_from_world)
    # Unprojected once: the map (second consumer) gets the very tensor the cloud got.
    assert pred.points(odom_from_world.copy()) is points
    expected = unproject_depth(pred.depth.numpy().astype(np.float64), pred.intrinsics,
                               odom_from_world @ pred.c2w)
    valid = np.isfinite(expected).all(axis=-1)
    assert points.dtype == torch.float32 and tuple(points.shape) == (6, 8, 3)
    np.testing.assert_allclose(points.numpy()[valid], expected[valid], rtol=1e-6, atol=1e-5)
    cloud, rgb, positive = pred.host_cloud(odom_from_world, 1)
    np.testing.assert_array_equal(cloud[valid], points.numpy()[valid])
    np.testing.assert_array_equal(rgb, pred.image.numpy())
    np.testing.assert_array_equal(positive, pred.depth.numpy() > 0)
    # The map's input points are the cloud's: one voxel per point, no filter in between.
    acc = MapAccumulator(config(voxel_size=1e-4))
    update = acc.add_points(points, pred.depth, pred.depth_conf, pred.image)
    assert (update.num_pixels, update.num_points) == (48, 45)  # 0, NaN and < 0 never enter
    kept = positive & np.isfinite(pred.depth.numpy())
    np.testing.assert_allclose(sorted_rows(acc.points()[0]), sorted_rows(cloud[kept]),
                               rtol=1e-6, atol=1e-6)
    # add() (depth and camera) unprojects with the same function: the same map.
    again = MapAccumulator(config(voxel_size=1e-4))
    again.add(pred.depth, pred.depth_conf, pred.image, pred.intrinsics,
              odom_from_world @ pred.c2w)
    np.testing.assert_allclose(sorted_rows(again.points()[0]), sorted_rows(acc.points()[0]),
                               rtol=1e-6, atol=1e-6)
    # A cloud strided by 2 is the same points, every other row and column.
    strided, _, _ = pred.host_cloud(odom_from_world, 2)
    np.testing.assert_array_equal(strided[valid[::2, ::2]], cloud[::2, ::2][valid[::2, ::2]])


def test_points_are_recomputed_for_another_frame_or_pose_and_refused_without_depth():
    pred = _keyframe(np.random.default_rng(6))
    first = pred.points(np.eye(4))
    moved = pred.points(pose(t=(1.0, 0.0, 0.0)))
    assert moved is not first
    np.testing.assert_allclose(moved.numpy() - first.numpy(),
                               np.where(np.isnan(first.numpy()), np.nan, [1.0, 0.0, 0.0]),
                               atol=1e-5)
    # A copy with other values (the rollover's stitching scales the depth) starts afresh:
    # R (2 d K^-1 p) + t = 2 (X - t) + t.
    stitched = dataclasses.replace(pred, depth=pred.depth * 2.0)
    np.testing.assert_allclose(stitched.points(np.eye(4)).numpy(),
                               2.0 * first.numpy() - pred.c2w[:3, 3], atol=1e-5)
    with pytest.raises(ValueError, match='no depth'):
        dataclasses.replace(pred, depth=None).points(np.eye(4))
    with pytest.raises(ValueError, match='non-finite'):
        pred.points(np.full((4, 4), np.nan))
