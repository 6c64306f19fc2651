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
"""The occupancy grid of the synthetic scene against its true geometry (docs/map.md).

The scene of :mod:`~lingbot_map_ros.tools.synthetic_scene` is known exactly: an 8 x 6 m room
and three boxes on its floor. :func:`scene_scans` gives each frame's true depth as points in
the camera frame with the true camera pose in the z-up room frame (the floor at z = 0, the
role of ``map`` with ``base_frame`` on the floor); :func:`truth` the cells a wall or a box
covers and the free floor; :func:`score` what share of each the grid got right and its
obstacle cells farther than one cell from any true obstacle.

``python -m lingbot_map_ros.tools.grid_quality [--png grid.png]`` prints the scores, the cost
of a keyframe and the grid's memory at the ``grid.*`` defaults, and draws the grid beside the
true plan.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import time

from lingbot_map_ros.config import GridConfig
from lingbot_map_ros.engine.map.grid_cells import FREE, GridView, OCCUPIED
from lingbot_map_ros.engine.map.occupancy_grid import OccupancyGrid
from lingbot_map_ros.tools import synthetic_scene as scene
import numpy as np


@dataclass(frozen=True)
class GridScore:
    """How a grid matches the scene's true plan."""

    wall_occupied: float
    """Share of the cells a true wall or box face crosses that the grid marks occupied."""
    free_free: float
    """Share of the truly free floor cells (inside the room, off the boxes) marked free."""
    false_obstacles: int
    """Occupied cells farther than one cell from every true obstacle cell."""
    occupied: int
    """Occupied cells in the grid."""


def scene_scans(config: scene.SceneConfig = scene.SceneConfig(), stride: int = 2
                ) -> tuple[list[np.ndarray], np.ndarray]:
    """Return every frame's true depth points (camera frame) and camera poses (room frame).

    Args:
        config: the scene's size and length.
        stride: keep every n-th pixel per direction (as ``map.pixel_stride``).

    Returns:
        ``([N] [M, 3] float32 points, [N, 4, 4] room-from-camera poses)``.
    """
    seq = scene.render_sequence(config)
    poses = scene.camera_path(config.num_frames, config.laps)
    k = seq.intrinsics
    h, w = seq.depth.shape[1:]
    v, u = np.mgrid[0:h:stride, 0:w:stride]
    scans = []
    for depth in seq.depth:
        z = depth[::stride, ::stride]
        # The renderer casts through pixel centres (u + 0.5).
        pts = np.stack([(u + 0.5 - k[0, 2]) / k[0, 0] * z, (v + 0.5 - k[1, 2]) / k[1, 1] * z, z],
                       axis=-1).reshape(-1, 3)
        scans.append(pts[np.isfinite(pts).all(axis=1) & (pts[:, 2] > 0)].astype(np.float32))
    return scans, poses


def truth(view: GridView) -> tuple[np.ndarray, np.ndarray]:
    """Return the true ([H, W] obstacle cells, [H, W] free floor cells) on ``view``'s cells.

    A cell is an obstacle when a wall line or a box's footprint meets it (a box is solid from
    the floor up, inside the band at the defaults), free when it lies wholly inside the room
    and off every box.
    """
    res = view.resolution
    x0 = view.origin_x + res * np.arange(view.width)
    y0 = view.origin_y + res * np.arange(view.height)
    lo_x, lo_y = np.meshgrid(x0, y0)
    hi_x, hi_y = lo_x + res, lo_y + res
    eps = 1e-6 * res  # a side on a cell border meets both neighbours, despite round-off
    lo_x, lo_y, hi_x, hi_y = lo_x - eps, lo_y - eps, hi_x + eps, hi_y + eps
    low, high = scene.ROOM
    inside = (lo_x + 2 * eps >= low[0]) & (hi_x - 2 * eps <= high[0]) & \
        (lo_y + 2 * eps >= low[1]) & (hi_y - 2 * eps <= high[1])
    # The walls: cells a side of the room's outline meets (closed cells: a side on a cell
    # border marks both neighbours).
    along_x = (hi_x >= low[0]) & (lo_x <= high[0])
    along_y = (hi_y >= low[1]) & (lo_y <= high[1])
    obstacle = np.zeros_like(inside)
    for side in (low[0], high[0]):
        obstacle |= (lo_x <= side) & (hi_x >= side) & along_y
    for side in (low[1], high[1]):
        obstacle |= (lo_y <= side) & (hi_y >= side) & along_x
    free = inside.copy()
    for b_lo, b_hi in scene.BOXES:
        obstacle |= (hi_x >= b_lo[0]) & (lo_x <= b_hi[0]) & (hi_y >= b_lo[1]) & \
            (lo_y <= b_hi[1])
        free &= ~((hi_x - 2 * eps > b_lo[0]) & (lo_x + 2 * eps < b_hi[0]) &
                  (hi_y - 2 * eps > b_lo[1]) & (lo_y + 2 * eps < b_hi[1]))
    return obstacle, free


def score(view: GridView) -> GridScore:
    """Score ``view`` against the scene's plan (see :class:`GridScore`)."""
    obstacle, free = truth(view)
    occupied = view.data == OCCUPIED
    near = obstacle.copy()  # obstacle cells grown by one cell (8-neighbourhood)
    padded = np.pad(obstacle, 1)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            near |= padded[1 + dy:1 + dy + obstacle.shape[0], 1 + dx:1 + dx + obstacle.shape[1]]
    # The wall cells the room's outline crosses, and a box's outline (its faces).
    outline = obstacle & ~_eroded(obstacle)
    return GridScore(float(occupied[outline].mean()), float((view.data[free] == FREE).mean()),
                     int(np.count_nonzero(occupied & ~near)), int(np.count_nonzero(occupied)))


def build(scans: list[np.ndarray], poses: np.ndarray, config: GridConfig = GridConfig(),
          **grid_args: int) -> tuple[OccupancyGrid, list[float]]:
    """Add and trace the scans one keyframe at a time; return the grid and each step's seconds.

    ``grid_args`` go to :class:`OccupancyGrid` (``point_budget``).
    """
    grid = OccupancyGrid(config, **grid_args)
    seconds = []
    for i, (pts, pose) in enumerate(zip(scans, poses)):
        start = time.perf_counter()
        grid.add(i, pts, pose)
        grid.update()
        seconds.append(time.perf_counter() - start)
    return grid, seconds


def drifted(poses: np.ndarray, angle: float = 0.08, shift: tuple[float, float] = (0.25, -0.15)
            ) -> np.ndarray:
    """Return poses moved by a yaw about the room's centre and a shift (odometry drift)."""
    c, s = np.cos(angle), np.sin(angle)
    drift = np.eye(4)
    drift[:2, :2] = [[c, -s], [s, c]]
    drift[:2, 3] = shift
    return drift @ poses


def _drift_check(frames: int) -> None:
    scans, poses = scene_scans(scene.SceneConfig(num_frames=frames, laps=2))
    grid, _ = build(scans, np.concatenate([poses[:frames], drifted(poses[frames:])]))
    before = score(grid.view())
    grid.set_poses(np.arange(frames, 2 * frames), poses[frames:])
    start = time.perf_counter()
    grid.update()
    seconds = time.perf_counter() - start
    after = score(grid.view())
    for name, result in (('drifted second lap', before), ('after the correction', after)):
        print(f'{name}: wall cells occupied {result.wall_occupied:.3f}, free cells free '
              f'{result.free_free:.3f}, occupied cells beyond one cell of a true obstacle '
              f'{result.false_obstacles} of {result.occupied}')
    print(f'rebuild of {2 * frames} keyframes: {seconds:.2f} s')


def _eroded(mask: np.ndarray) -> np.ndarray:
    """Cells whose 4 neighbours are all in ``mask`` too."""
    padded = np.pad(mask, 1)
    return mask & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]


def _draw(view: GridView, path: str) -> None:
    import cv2
    obstacle, _ = truth(view)
    grey = np.full(view.data.shape, 160, np.uint8)
    grey[view.data == FREE] = 255
    grey[view.data == OCCUPIED] = 0
    plan = np.full(view.data.shape, 255, np.uint8)
    plan[obstacle] = 0
    gap = np.full((view.height, 4), 255, np.uint8)
    image = np.concatenate([grey, gap, plan], axis=1)[::-1]  # y up
    cv2.imwrite(path, cv2.resize(image, None, fx=3, fy=3, interpolation=cv2.INTER_NEAREST))


def main(argv: list[str] | None = None) -> None:
    """Print the synthetic scene's grid scores, cost and memory; optionally draw it."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--png', help='draw the grid (left) beside the true plan (right)')
    parser.add_argument('--frames', type=int, default=60, help='frames of the loop')
    parser.add_argument('--drift', action='store_true',
                        help='drive the loop twice, the second lap drifted (a yaw and a shift) '
                             'then corrected: the double walls before and after')
    args = parser.parse_args(argv)
    if args.drift:
        _drift_check(args.frames)
        return
    scans, poses = scene_scans(scene.SceneConfig(num_frames=args.frames))
    grid, seconds = build(scans, poses)
    view = grid.view()
    result = score(view)
    logodds, hits, misses = grid.counts()
    stats = grid.stats()
    # log-odds, hit and miss counts, and the hits' span of heights (two float16 a cell)
    memory = logodds.nbytes + hits.nbytes + misses.nbytes + 4 * logodds.size + \
        12 * stats['num_scan_points']
    print(f'{len(scans)} keyframes, grid {view.width} x {view.height} at {view.resolution} m')
    print(f'wall cells occupied {result.wall_occupied:.3f}, free cells free '
          f'{result.free_free:.3f}, occupied cells beyond one cell of a true obstacle '
          f'{result.false_obstacles} of {result.occupied}')
    print(f'per keyframe (store + trace) median {1e3 * np.median(seconds):.1f} ms, '
          f'max {1e3 * np.max(seconds):.1f} ms; memory {memory / 1e6:.2f} MB '
          f'(cells {(memory - 12 * stats["num_scan_points"]) / 1e6:.2f} MB, scans '
          f'{12 * stats["num_scan_points"] / 1e6:.2f} MB)')
    if args.png:
        _draw(view, args.png)
        print(f'wrote {args.png}')


if __name__ == '__main__':
    main()
