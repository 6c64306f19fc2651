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
"""OccupancyGrid and its map-server files against the synthetic scene's true plan (CPU).

The scene (tools/synthetic_scene.py) is an 8 x 6 m room with three boxes; its true depth and
poses play the oracle network. At 5 cm the grid marks most wall cells occupied and most free
floor free, with no obstacle farther than one cell from a true one; a drifted second lap draws
the walls twice, and the corrected poses (one rebuild) take them back. Also: incremental
tracing equals one pass, the files read back by map_server's rules give the grid, the bounds
drop and count, no confident depth is an all-unknown grid, bad settings are refused.
"""

from dataclasses import replace
from pathlib import Path

from lingbot_map_ros.config import GridConfig
from lingbot_map_ros.engine.map.grid_cells import LOG_ODDS_MAX, LOG_ODDS_MIN, OCCUPIED, UNKNOWN
from lingbot_map_ros.engine.map.grid_files import write_map_server
from lingbot_map_ros.engine.map.occupancy_grid import OccupancyGrid
from lingbot_map_ros.tools import grid_quality, synthetic_scene
import numpy as np
import pytest
import yaml


@pytest.fixture(scope='module')
def two_laps():
    """Return the scans and true poses of the scene driven twice (30 frames a lap)."""
    return grid_quality.scene_scans(synthetic_scene.SceneConfig(num_frames=30, laps=2))


@pytest.fixture(scope='module')
def one_lap_grid(two_laps):
    scans, poses = two_laps
    grid, _ = grid_quality.build(scans[:30], poses[:30])
    return grid


def test_the_grid_matches_the_true_plan_at_5_cm(one_lap_grid):
    view = one_lap_grid.view()
    assert view.resolution == pytest.approx(0.05)
    result = grid_quality.score(view)
    assert result.wall_occupied > 0.85, result
    assert result.free_free > 0.9, result
    assert result.occupied > 500
    assert result.false_obstacles == 0, result
    # The room (8 x 6 m) and no more than a cell or two around it.
    assert 160 <= view.width <= 164 and 120 <= view.height <= 124
    assert view.origin_x == pytest.approx(-4.0, abs=0.11)
    assert view.origin_y == pytest.approx(-3.0, abs=0.11)


def test_log_odds_are_clamped_and_counted(one_lap_grid):
    logodds, hits, misses = one_lap_grid.counts()
    assert logodds.min() >= LOG_ODDS_MIN - 1e-6 and logodds.max() <= LOG_ODDS_MAX + 1e-6
    # Wall cells are hit by several of the 30 keyframes: clamped at the top, counted past it.
    assert logodds.max() == pytest.approx(LOG_ODDS_MAX)
    assert logodds.min() == pytest.approx(LOG_ODDS_MIN)
    assert 5 < hits.max() <= 30 and 10 < misses.max() <= 30
    data = one_lap_grid.view().data
    assert (data == UNKNOWN).any()  # e.g. the inside of the box taller than the camera


def test_tracing_keyframe_by_keyframe_equals_one_pass(two_laps, one_lap_grid):
    scans, poses = two_laps
    grid = OccupancyGrid(GridConfig())
    for i in range(30):
        grid.add(i, scans[i], poses[i])
    assert grid.update()
    assert not grid.update()  # nothing new
    mine, theirs = grid.view(), one_lap_grid.view()
    assert mine.data.tolist() == theirs.data.tolist()
    assert (mine.origin_x, mine.origin_y) == pytest.approx((theirs.origin_x, theirs.origin_y))
    # The arrays differ only by the padding their growth added: the same sums.
    for a, b in zip(grid.counts(), one_lap_grid.counts()):
        assert float(a.astype(np.float64).sum()) == \
            pytest.approx(float(b.astype(np.float64).sum()), rel=1e-6)
    assert grid.stats()['num_traced'] == 30 and grid.stats()['num_rebuilds'] == 0


def test_a_correction_takes_the_double_walls_back(two_laps):
    scans, poses = two_laps
    drifted = np.concatenate([poses[:30], grid_quality.drifted(poses[30:])])
    grid, _ = grid_quality.build(scans, drifted)
    before = grid_quality.score(grid.view())
    assert before.false_obstacles > 100, before  # the second lap's walls stand off
    moved = grid.set_poses(np.arange(30, 60), poses[30:])
    assert moved == 30
    assert grid.update()
    after = grid_quality.score(grid.view())
    assert after.false_obstacles == 0, after
    assert after.wall_occupied > 0.85 and after.free_free > 0.9, after
    stats = grid.stats()
    assert stats['num_rebuilds'] == 1 and stats['num_traced'] == 60 + 60


def test_map_server_files_read_back_by_the_format_rules(one_lap_grid, tmp_path):
    view = one_lap_grid.view()
    meta_path, pgm_path = write_map_server(tmp_path / 'grid', view)
    meta = yaml.safe_load(meta_path.read_text())
    assert meta['mode'] == 'trinary' and meta['negate'] == 0
    assert meta['image'] == 'grid.pgm' and pgm_path == tmp_path / 'grid.pgm'
    assert meta['resolution'] == pytest.approx(0.05)
    np.testing.assert_allclose(meta['origin'], [view.origin_x, view.origin_y, 0.0])
    assert read_map_server(meta_path).tolist() == view.data.tolist()
    assert {-1, 0, 100} == set(np.unique(view.data).tolist())


def read_map_server(meta_path: Path) -> np.ndarray:
    """Read map-server files as map_server does: P5 PGM, trinary, negate 0; row 0 lowest y.

    occupancy = (255 - v) / 255 (negate 0); above occupied_thresh 100, below free_thresh 0,
    else -1; the image's first row is the map's highest y.
    """
    meta = yaml.safe_load(meta_path.read_text())
    raw = (meta_path.parent / meta['image']).read_bytes()
    tokens, pos = [], 0
    while len(tokens) < 4:  # magic, width, height, maxval; '#' starts a comment line
        while raw[pos:pos + 1].isspace():
            pos += 1
        if raw[pos:pos + 1] == b'#':
            pos = raw.index(b'\n', pos) + 1
            continue
        end = pos
        while not raw[end:end + 1].isspace():
            end += 1
        tokens.append(raw[pos:end].decode())
        pos = end
    assert tokens[0] == 'P5' and tokens[3] == '255'
    width, height = int(tokens[1]), int(tokens[2])
    pixels = np.frombuffer(raw[pos + 1:], np.uint8).reshape(height, width)
    occupancy = (255.0 - pixels) / 255.0
    out = np.full(pixels.shape, -1, np.int8)
    out[occupancy > meta['occupied_thresh']] = 100
    out[occupancy < meta['free_thresh']] = 0
    return out[::-1]


def test_no_confident_depth_is_an_all_unknown_grid():
    grid = OccupancyGrid(GridConfig())
    pose = np.eye(4)
    pose[:3, 3] = [1.0, 2.0, 1.2]
    assert grid.add(0, np.zeros((0, 3), np.float32), pose) == 0
    assert grid.add(1, np.full((5, 3), np.nan, np.float32), pose) == 0
    assert grid.update()
    view = grid.view()
    assert view.width * view.height >= 1 and (view.data == UNKNOWN).all()
    assert view.origin_x <= 1.0 < view.origin_x + view.width * view.resolution


def test_the_cell_bound_drops_the_farthest_scans_and_counts_them(two_laps):
    scans, poses = two_laps
    config = GridConfig(max_cells=150 * 110)  # less than the room's 160 x 120
    grid, _ = grid_quality.build(scans[:30], poses[:30], config)
    stats = grid.stats()
    view = grid.view()
    assert stats['num_dropped_far'] > 0
    assert stats['width'] * stats['height'] <= config.max_cells
    assert view.width * view.height <= config.max_cells
    assert (view.data == OCCUPIED).sum() > 100
    # The newest scan's camera is inside what is left.
    x, y = poses[29][:2, 3]
    assert view.origin_x <= x <= view.origin_x + view.width * view.resolution
    assert view.origin_y <= y <= view.origin_y + view.height * view.resolution


def test_one_scan_larger_than_the_bound_keeps_a_square_around_its_camera(two_laps):
    scans, poses = two_laps
    grid, _ = grid_quality.build(scans[:1], poses[:1], GridConfig(max_cells=400))
    stats = grid.stats()
    assert stats['width'] * stats['height'] <= 400
    assert stats['num_cells_outside'] > 0


def test_stored_points_are_bounded_oldest_first(two_laps):
    scans, poses = two_laps
    grid, _ = grid_quality.build(scans[:10], poses[:10], point_budget=30_000)
    stats = grid.stats()
    assert stats['num_dropped_old'] > 0
    assert stats['num_scan_points'] <= 30_000
    assert stats['num_scans'] == 10 - stats['num_dropped_old'] - stats['num_dropped_far']


@pytest.mark.parametrize('changes, words', [
    ({'resolution': 1e9}, 'grid.resolution'),
    ({'resolution': float('nan')}, 'grid.resolution'),
    ({'resolution': 1e-4}, 'cells a ray'),
    ({'min_height': 2.0, 'max_height': 1.0}, 'must be below'),
    ({'max_height': 1e12}, 'grid.max_height'),
    ({'min_height': float('-inf')}, 'grid.min_height'),
    ({'free_threshold': 0.7}, 'free < occupied'),
    ({'max_cells': 0}, 'grid.max_cells'),
    ({'max_range': 0.0}, 'grid.max_range'),
])
def test_bad_settings_are_refused_in_one_line(changes, words):
    with pytest.raises(ValueError, match=words) as info:
        replace(GridConfig(), **changes)
    assert '\n' not in str(info.value)


def test_bad_input_is_refused():
    grid = OccupancyGrid(GridConfig())
    grid.add(3, np.zeros((1, 3)), np.eye(4))
    with pytest.raises(ValueError, match='not above'):
        grid.add(3, np.zeros((1, 3)), np.eye(4))
    with pytest.raises(ValueError, match=r'\[M, 3\]'):
        grid.add(4, np.zeros((2, 2)), np.eye(4))
    bad = np.eye(4)
    bad[0, 3] = np.nan
    with pytest.raises(ValueError):
        grid.add(5, np.zeros((1, 3)), bad)
    assert grid.stats()['num_scans'] == 1


def _column_scan(x, heights, camera_z=1.2):
    """Return points (camera frame = map axes, camera at (0, 0, camera_z)) at x along y = 0."""
    return np.array([[x, 0.01, z - camera_z] for z in heights], np.float32)


@pytest.mark.parametrize('span, cleared', [((0.2, 0.3, 0.4), False),   # a low box: rays pass over
                                           ((0.2, 0.8, 1.4), True)])    # a person who left
def test_a_ray_clears_a_hit_cell_only_through_the_heights_its_hits_spanned(span, cleared):
    pose = np.eye(4)
    pose[2, 3] = 1.2
    grid = OccupancyGrid(GridConfig())
    grid.add(0, _column_scan(2.02, span), pose)
    # Then the floor beyond it: the ray crosses x = 2.02 at about 0.6 m.
    for i in range(1, 8):
        grid.add(i, _column_scan(4.02, (0.0,)), pose)
    grid.update()
    view = grid.view()
    col = int(np.floor((2.02 - view.origin_x) / view.resolution + 1e-9))
    row = int(np.floor((0.01 - view.origin_y) / view.resolution + 1e-9))
    assert view.data[row, col] == (0 if cleared else OCCUPIED)
    floor_col = int(np.floor((3.0 - view.origin_x) / view.resolution + 1e-9))
    assert view.data[row, floor_col] == 0  # the floor between is free either way
