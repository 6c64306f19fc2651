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
"""AnchoredMap: keyframe pieces that move with their keyframes (CPU).

Two keyframes see one planar wall (z = 3); with a drifted pose for the second the map shows
two walls, with the corrected poses one. Also: adding piece by piece equals a rebuild, the
bounds drop the oldest pieces (counted), and bad input is refused or counted.
"""

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.map import anchored_map
from lingbot_map_ros.engine.map.anchored_map import AnchoredMap
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
import numpy as np
import pytest
import torch

WALL_Z = 3.0
VOXEL = 0.02
H, W = 120, 160
K = np.array([[130.0, 0.0, W / 2], [0.0, 130.0, H / 2], [0.0, 0.0, 1.0]])


def yaw(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def wall_view(pose: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth of the wall z = WALL_Z seen from ``pose`` and the points in the camera frame."""
    u, v = np.meshgrid(np.arange(W), np.arange(H))
    rays = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u, float)],
                    axis=-1)
    direction = rays @ pose[:3, :3].T
    depth = (WALL_Z - pose[2, 3]) / direction[..., 2]  # z-depth: the rays have z = 1
    depth = depth.astype(np.float32)
    points = geometry.unproject_depth(depth, K, np.eye(4), dtype=torch.float32)
    return depth, np.asarray(points)


def config(**overrides) -> MapConfig:
    values = {'voxel_size': VOXEL, 'confidence_percentile': 0.0, 'pixel_stride': 1}
    return MapConfig(**{**values, **overrides})


def nearest(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance of each point of ``a`` to the nearest point of ``b`` (in chunks of ``a``)."""
    b = torch.as_tensor(b, dtype=torch.float64)
    return np.concatenate([torch.cdist(torch.as_tensor(part, dtype=torch.float64), b)
                           .min(dim=1).values.numpy() for part in np.array_split(
                               a, max(len(a) // 1024, 1))])


TRUE_A = np.eye(4)
TRUE_B = sim3.make(yaw(0.1), np.array([0.4, 0.0, 0.2]))
# The odometry's B: 0.3 nearer to the wall and turned 3 degrees more.
DRIFTED_B = TRUE_B @ sim3.make(yaw(np.radians(3.0)), np.array([0.0, 0.0, 0.3]))


def two_views() -> AnchoredMap:
    amap = AnchoredMap(config())
    for key, truth, pose in ((0, TRUE_A, TRUE_A), (1, TRUE_B, DRIFTED_B)):
        depth, points = wall_view(truth)
        update = amap.add(key, points, depth, None, None, pose)
        assert update.num_pixels == H * W and update.num_non_finite == 0
        assert 0 < update.num_points <= update.num_pixels
    return amap


def test_drifted_pieces_make_two_walls_and_corrected_ones_one():
    amap = two_views()
    a, b = amap.piece_points(0), amap.piece_points(1)
    np.testing.assert_allclose(a[:, 2], WALL_Z, atol=1e-4)
    # Where B's view overlaps A's, B's drifted wall stands apart from A's.
    overlap = np.abs(b[:, 0]) < 0.5
    assert overlap.sum() > 100
    assert np.median(nearest(b[overlap], a)) > 0.2
    xyz, _ = amap.points()
    off_wall = np.abs(xyz[:, 2] - WALL_Z) > 5 * VOXEL
    assert off_wall.mean() > 0.3  # the second wall

    moved = amap.set_poses([0, 1], np.stack([TRUE_A, TRUE_B]))
    assert moved == 1  # A's pose did not change
    b = amap.piece_points(1)
    np.testing.assert_allclose(b[:, 2], WALL_Z, atol=1e-3)
    overlap = np.abs(b[:, 0]) < 0.5
    assert np.median(nearest(b[overlap], a)) < VOXEL
    assert nearest(b[overlap], a).max() < 2 * VOXEL
    xyz, _ = amap.points()
    np.testing.assert_allclose(xyz[:, 2], WALL_Z, atol=1e-3)  # one wall
    assert amap.stats()['num_rebuilds'] == 1


def test_the_odom_accumulator_shows_the_same_double_wall():
    """The odom map (MapAccumulator) with the same drifted poses: the wall is doubled there."""
    acc = MapAccumulator(config())
    for truth, pose in ((TRUE_A, TRUE_A), (TRUE_B, DRIFTED_B)):
        depth, points = wall_view(truth)
        world = np.asarray(points) @ pose[:3, :3].T + pose[:3, 3]
        acc.add_points(world.astype(np.float32), depth, None, None)
    xyz, _ = acc.points()
    assert (np.abs(xyz[:, 2] - WALL_Z) > 5 * VOXEL).mean() > 0.3


def random_pieces(count: int, seed: int = 0, spread: float = 1.0) -> list[tuple]:
    """``count`` pieces of random points and colours, as ``AnchoredMap.add`` arguments."""
    rng = np.random.default_rng(seed)
    pieces = []
    for key in range(count):
        points = rng.uniform(-1, 1, (20, 30, 3)).astype(np.float32)
        rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
        pose = sim3.make(yaw(rng.uniform(-np.pi, np.pi)), spread * rng.normal(size=3),
                         float(np.exp(rng.uniform(-0.2, 0.2))))
        pieces.append((10 * key, points, np.ones((20, 30), np.float32), None, rgb, pose))
    return pieces


def sorted_rows(xyz: np.ndarray, rgb: np.ndarray) -> np.ndarray:
    rows = np.concatenate([xyz.astype(np.float64), rgb.astype(np.float64)], axis=1)
    return rows[np.lexsort(rows[:, :3].T[::-1])]


def same_map(a: tuple, b: tuple) -> None:
    """Assert two maps hold the same points (1e-4) and colours (rounding: 1)."""
    a, b = sorted_rows(*a), sorted_rows(*b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-4)
    np.testing.assert_allclose(a[:, 3:], b[:, 3:], atol=1.0)


def test_incremental_adds_equal_a_full_rebuild():
    amap = AnchoredMap(config(voxel_size=0.05))
    for piece in random_pieces(8, spread=0.3):  # overlapping: voxels shared between them
        amap.add(*piece)
    incremental = amap.points()
    assert amap.stats()['num_rebuilds'] == 0
    amap.rebuild()
    rebuilt = amap.points()
    assert len(incremental[0]) == len(rebuilt[0]) > 1000
    assert len(incremental[0]) < amap.stats()['num_piece_points']  # shared voxels
    same_map(incremental, rebuilt)


def test_a_piece_added_during_a_rebuild_joins_the_map():
    """A rebuild runs outside the map lock: a piece that arrives meanwhile is folded in after."""
    pieces = random_pieces(6, spread=0.3)
    amap = AnchoredMap(config(voxel_size=0.05))
    for piece in pieces[:5]:
        amap.add(*piece)
    build = amap._build
    calls = []

    def build_while_adding(placed):
        calls.append(len(placed))
        if len(calls) == 1:
            before = amap.stats()['map_points']
            amap.add(*pieces[5])  # the frame thread, while the reader builds
            # Not merged into the stale map that the build replaces.
            assert amap.stats()['map_points'] == before
        return build(placed)
    amap._build = build_while_adding
    amap.set_poses([0], pieces[0][5][None] @ sim3.make(yaw(0.2), np.zeros(3))[None])
    got = amap.points()
    assert calls == [5]  # one build, of the five pieces it saw
    fresh = AnchoredMap(config(voxel_size=0.05))
    for piece in pieces:
        fresh.add(*piece)
    fresh.set_poses([0], amap.poses()[0][None])
    same_map(got, fresh.points())


def test_a_scaled_pose_scales_its_piece():
    amap = AnchoredMap(config())
    depth, points = wall_view(TRUE_A)
    amap.add(0, points, depth, None, None, TRUE_A)
    base = amap.piece_points(0)
    amap.set_poses([0], sim3.make(np.eye(3), np.zeros(3), 2.0)[None])
    np.testing.assert_allclose(amap.piece_points(0), 2.0 * base, rtol=1e-6, atol=1e-5)


def test_unplaced_pieces_wait_for_a_pose():
    amap = AnchoredMap(config())
    depth, points = wall_view(TRUE_A)
    amap.add(0, points, depth, None, None, None)
    assert amap.num_points == 0 and amap.num_pieces == 1
    assert amap.poses() == {0: None}
    amap.set_poses([0], TRUE_A[None])
    assert amap.num_points > 1000


def test_the_bound_drops_the_oldest_pieces_and_counts_them():
    amap = AnchoredMap(config(voxel_size=0.05, max_points=2000))
    pieces = random_pieces(12, spread=20.0)  # far apart: about 590 voxels each, none shared
    for piece in pieces:
        amap.add(*piece)
    xyz, rgb = amap.points()
    stats = amap.stats()
    assert 0 < len(xyz) <= 0.9 * 2000  # cut to REFILL of the bound
    kept = sorted(amap.poses())
    # The newest pieces stay, the oldest went, counted.
    assert kept == [10 * k for k in range(12 - len(kept), 12)]
    assert stats['num_dropped_pieces'] == 12 - len(kept) > 0
    assert stats['num_pieces'] == len(kept)
    # What is left is exactly the map of the kept pieces alone.
    only = AnchoredMap(config(voxel_size=0.05, max_points=2000))
    for piece in pieces[12 - len(kept):]:
        only.add(*piece)
    same_map((xyz, rgb), only.points())


def test_stored_piece_points_are_bounded(monkeypatch):
    monkeypatch.setattr(anchored_map, 'PIECE_BUDGET', 1)
    amap = AnchoredMap(config(voxel_size=0.05, max_points=3000))
    for piece in random_pieces(12, spread=0.0):  # all in one place: the voxels stay few
        amap.add(*piece)
    assert amap.num_points <= 3000
    stats = amap.stats()
    assert stats['num_piece_points'] <= 3000 and stats['num_dropped_pieces'] > 0
    assert stats['num_pieces'] == 12 - stats['num_dropped_pieces']


def test_piece_size_is_bounded_and_thinning_counted(monkeypatch):
    monkeypatch.setattr(anchored_map, 'MAX_PIECE_POINTS', 500)
    amap = AnchoredMap(config())
    depth, points = wall_view(TRUE_A)
    update = amap.add(0, points, depth, None, None, TRUE_A)
    assert update.num_points == 500 and update.num_thinned > 0
    assert amap.stats()['num_thinned'] == update.num_thinned
    xyz = amap.piece_points(0)
    # Thinned evenly: the kept points still span the view.
    assert np.ptp(xyz[:, 0]) > 0.8 * np.ptp(np.asarray(points)[..., 0] * 1.0)


def test_bad_input_is_refused_or_counted():
    amap = AnchoredMap(config())
    depth, points = wall_view(TRUE_A)
    bad = TRUE_A.copy()
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match='non-finite'):
        amap.add(0, points, depth, None, None, bad)
    skewed = TRUE_A.copy()
    skewed[0, 1] = 0.5
    with pytest.raises(ValueError, match='s \\* R'):
        amap.add(0, points, depth, None, None, skewed)
    assert amap.num_pieces == 0
    # Non-finite points where the depth is valid: dropped and counted, the rest kept.
    holes = np.array(points, copy=True)
    holes[:10] = np.nan
    update = amap.add(0, holes, depth, None, None, TRUE_A)
    assert update.num_non_finite == 10 * W
    assert amap.stats()['num_non_finite'] == 10 * W
    assert np.isfinite(amap.points()[0]).all()
    # Points beyond the voxel keys' reach (2**20 voxels): dropped and counted.
    far = np.array(points, copy=True)
    far[:3] *= 1e6
    update = amap.add(1, far, depth, None, None, TRUE_A)
    assert update.num_too_far == 3 * W and amap.stats()['num_too_far'] == 3 * W
    with pytest.raises(ValueError, match='not above'):
        amap.add(1, points, depth, None, None, TRUE_A)
    with pytest.raises(ValueError, match='poses'):
        amap.set_poses([0, 1], TRUE_A[None])
    inf = TRUE_A.copy()
    inf[1, 3] = np.inf
    with pytest.raises(ValueError, match='non-finite'):
        amap.set_poses([0], inf[None])
    np.testing.assert_array_equal(amap.poses()[0], TRUE_A)  # unchanged
    with pytest.raises(ValueError, match='depth'):
        amap.add(2, points[:5], depth, None, None, TRUE_A)
    with pytest.raises(ValueError, match='cannot change'):
        amap.config = config(voxel_size=0.5)
    assert amap.clear() > 0 and amap.num_points == 0 and amap.num_pieces == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_on_cuda_the_map_equals_the_cpu_map_and_corrections_rebuild_it():
    # The node keeps the pieces on the engine's device: the same answers there as on the CPU.
    maps = {}
    for device in ('cpu', 'cuda'):
        amap = AnchoredMap(config(voxel_size=0.05), device)
        for piece in random_pieces(8, spread=0.3):
            amap.add(*piece)
        incremental = amap.points()
        amap.rebuild()
        same_map(incremental, amap.points())
        amap.set_poses([0], np.eye(4)[None])
        maps[device] = amap.points()
    same_map(maps['cpu'], maps['cuda'])
