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
"""OccupancyGrid: a 2D occupancy grid for navigation from keyframe-anchored scans (docs/map.md).

Every keyframe keeps a *scan*: its confident depth points in its own camera frame, thinned to
one point per grid cell in 3D (at most :data:`MAX_SCAN_POINTS`, 12 bytes a point), and its
current map-from-camera pose. As with
:class:`~lingbot_map_ros.engine.map.anchored_map.AnchoredMap`, a correction of the poses moves
the scans, and the grid is rebuilt from them, so a revisited wall is not drawn twice. Nothing
here knows about ROS; everything is vectorised numpy on the CPU.

A scan marks the grid by the usual recipe, in the ``x``-``y`` plane of the map frame (``z`` up,
heights measured from ``z = 0``, base_frame's ground where the robot started):

1. points above ``grid.max_height`` are left out (a ceiling says nothing about the floor);
2. a ray runs from the camera to each point, cut at ``grid.max_range``; the cells it crosses
   are *misses*; a point not cut whose height is at least ``grid.min_height`` makes its cell a
   *hit*. Rays ending in the same cell are one ray, and of the rays in a thin wedge around the
   camera (half a cell wide at the range's end) only the longest is sampled (every half cell):
   the others lie within half a cell of it and their end cells are marked on their own. A cell
   counts at most one hit or one miss per scan (a hit wins). A cell keeps the span of heights
   its hits had; a ray clears a cell that was hit only where it crosses that span (what stood
   there is gone), so rays passing over a low box or under a table's top leave them be;
3. each cell keeps log-odds (``grid_cells.py``: a hit adds ``LOG_ODDS_HIT``, a miss
   ``LOG_ODDS_MISS``, clamped to [``LOG_ODDS_MIN``, ``LOG_ODDS_MAX``]) and its hit
   and miss counts. A cell never hit nor missed is unknown (-1); one whose probability is at
   least ``grid.occupied_threshold`` is occupied (100), at most ``grid.free_threshold`` free
   (0), unknown between (a trinary map, as map_server reads it).

:meth:`OccupancyGrid.add` (the frame thread) only stores a scan. :meth:`OccupancyGrid.update`
(a timer) traces the scans not yet in the grid, or rebuilds the grid from every placed scan
after :meth:`OccupancyGrid.set_poses` changed a pose or a scan was dropped. Bounds (counted in
:meth:`OccupancyGrid.stats`): the grid's rectangle holds at most ``grid.max_cells`` cells (the
scans whose cameras are farthest from the newest one are dropped first; if the newest alone
is larger, the cells outside a square around its camera are left out), and the stored scan
points are at most :data:`POINT_BUDGET` (the oldest scans go first).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
import threading

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.image.geometry import unproject_depth
from lingbot_map_ros.engine.map.grid_cells import box_area, box_union_all, box_union_rows, \
    CELL_OFFSET, FREE, GridCells, GridView, OCCUPIED, pack_cells, ScanTrace, UNKNOWN
from lingbot_map_ros.engine.map.keyframe_points import keyframe_points, place_anchored
from lingbot_map_ros.grid_config import GridConfig
import numpy as np
import torch

MAX_SCAN_POINTS = 8192
"""Most points a keyframe's scan keeps (one per 3D grid cell, then thinned evenly)."""
POINT_BUDGET = 4_000_000
"""Most scan points stored over all keyframes (12 bytes each: 48 MB); the oldest go first."""
_THIN_OFFSET = 1 << 20
"""A scan's 3D cells are kept within +-2**20 of its camera (three pack into an int64)."""
_WINDOW_MAX = 8192
"""Larger than any trace window's half side (``grid.max_range / grid.resolution`` + 2)."""
_HALF_MAX = float(np.finfo(np.float16).max)
"""Largest float16: trace heights beyond it saturate when stored."""


def camera_points(depth: torch.Tensor | np.ndarray, confidence: torch.Tensor | np.ndarray | None,
                  intrinsics: np.ndarray, map_config: MapConfig) -> np.ndarray:
    """Return a keyframe's scan: the pixels ``~/map`` keeps, as [M, 3] points in its camera frame.

    Args:
        depth: [H, W] z-depth.
        confidence: [H, W] depth confidence, or None.
        intrinsics: [3, 3] pinhole matrix of those pixels.
        map_config: the stride and confidence filters (``map.*``).

    Raises:
        ValueError: shapes that do not fit together.
    """
    points = unproject_depth(depth, intrinsics, np.eye(4), dtype=torch.float32)
    kept, _, _ = keyframe_points(points, depth, confidence, None, map_config,
                                 torch.device('cpu'))
    return kept.numpy()


@dataclass(slots=True, eq=False)  # scans are compared by identity
class _Scan:
    keyframe_id: int
    xyz: np.ndarray
    """[P, 3] float32 in the keyframe's camera frame."""
    pose: np.ndarray | None
    """[4, 4] map-from-camera, None while not placed."""
    in_grid: bool = False
    """Traced into the grid under ``pose``."""
    camera_xy: tuple[float, float] = (0.0, 0.0)
    """The camera's x y in the map when last traced (for the farthest-first drop)."""
    box: tuple[int, int, int, int] | None = None
    """Cells it touched when last traced: (x0, y0, x1, y1), ends excluded."""


class OccupancyGrid:
    """Keyframe scans and the occupancy grid they make under their current poses."""

    def __init__(self, config: GridConfig, point_budget: int = POINT_BUDGET) -> None:
        """Start an empty grid.

        Args:
            config: the ``grid.*`` settings.
            point_budget: most scan points stored (the oldest scans are dropped past it).
        """
        self._config = config
        self._point_budget = point_budget
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        """Held by the one thread that updates or reads the cells."""
        self._generation = 0
        self.clear()

    @property
    def config(self) -> GridConfig:
        """Return the settings in effect."""
        return self._config

    def clear(self) -> None:
        """Drop every scan and the grid (a session reset)."""
        with self._lock:
            self._scans: list[_Scan] = []
            self._stored = 0
            self._cells = GridCells()
            self._dirty = False
            self._changed = True
            self._counts = dict.fromkeys(
                ('num_traced', 'num_rebuilds', 'num_dropped_far', 'num_dropped_old',
                 'num_cells_outside', 'num_out_of_range', 'num_thinned'), 0)
            self._generation += 1

    def stats(self) -> dict[str, int]:
        """Return the counters and sizes (the grid as of the last update)."""
        with self._lock:
            h, w = self._cells.logodds.shape
            pending = sum(1 for s in self._scans if s.pose is not None and not s.in_grid)
            return {**self._counts, 'num_scans': len(self._scans),
                    'num_scan_points': self._stored, 'width': w, 'height': h,
                    'num_pending': pending, 'dirty': int(self._dirty)}

    def add(self, keyframe_id: int, points: np.ndarray, pose: np.ndarray | None) -> int:
        """Store one keyframe's scan (cheap: the tracing is :meth:`update`'s).

        Args:
            keyframe_id: the keyframe's id, above every earlier scan's (age order).
            points: [M, 3] confident depth points in the keyframe's camera frame; non-finite
                rows are left out. None of them (no confident depth) is a scan too: its camera
                still widens the grid, every cell stays unknown.
            pose: [4, 4] map-from-camera Sim(3), or None (not placed: :meth:`set_poses`).

        Returns:
            The points the scan keeps.

        Raises:
            ValueError: an id not above the last one, a malformed pose, points not [M, 3].
        """
        if pose is not None:
            pose = sim3.check_poses(np.asarray(pose, np.float64)[None], 'grid pose')[0]
        pts = np.asarray(points, np.float32)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise ValueError(f'grid: points must be [M, 3], got {list(pts.shape)}')
        pts, thinned = self._thin(pts[np.isfinite(pts).all(axis=1)])
        with self._lock:
            if self._scans and keyframe_id <= self._scans[-1].keyframe_id:
                raise ValueError(f'grid: keyframe id {keyframe_id} is not above the last one '
                                 f'({self._scans[-1].keyframe_id})')
            self._scans.append(_Scan(keyframe_id, pts, pose))
            self._stored += len(pts)
            self._counts['num_thinned'] += thinned
            self._drop_oldest_points()
        return len(pts)

    def set_poses(self, keyframe_ids: list[int] | np.ndarray, poses: np.ndarray) -> int:
        """Give scans their current map-from-camera poses (after a correction).

        Ids without a scan are skipped. A changed pose makes the next :meth:`update` rebuild.

        Returns:
            The number of scans whose pose changed.

        Raises:
            ValueError: a malformed pose or counts that differ; nothing changes.
        """
        with self._lock:
            changed = place_anchored(self._scans, keyframe_ids, poses, 'grid')
            self._dirty |= changed > 0
        return changed

    def poses(self) -> dict[int, np.ndarray | None]:
        """Return every scan's current pose by keyframe id (None: not placed)."""
        with self._lock:
            return {s.keyframe_id: None if s.pose is None else s.pose.copy()
                    for s in self._scans}

    def update(self) -> bool:
        """Trace the scans not in the grid yet, or rebuild it after a change; True if changed.

        Runs on the caller's thread (a timer): the frame thread's :meth:`add` never waits for
        it, scans added meanwhile are traced at the next call.
        """
        with self._build_lock:
            with self._lock:
                generation = self._generation
                rebuild = self._dirty
                self._dirty = False
                todo = [(s, s.pose) for s in self._scans
                        if s.pose is not None and (rebuild or not s.in_grid)]
                changed = self._changed or bool(todo) or rebuild
                self._changed = False
            if not todo and not rebuild:
                return changed
            cells = GridCells() if rebuild else self._cells
            traces = [self._trace(scan, pose) for scan, pose in todo]
            with self._lock:
                if generation != self._generation:
                    return True  # cleared meanwhile
                for (scan, pose), trace in zip(todo, traces):
                    scan.box, scan.camera_xy = trace.box, trace.camera_xy
                drop = self._fit(todo[-1][0] if todo else None)
            if drop:  # scans left the grid: their cells must go too
                with self._lock:
                    self._dirty = True
                return self._rebuild_all()
            outside = self._apply(cells, traces)
            with self._lock:
                if generation != self._generation:
                    return True
                self._counts['num_traced'] += len(traces)
                self._counts['num_rebuilds'] += int(rebuild)
                self._counts['num_cells_outside'] += outside
                self._counts['num_out_of_range'] += sum(t.out_of_range for t in traces)
                for scan, pose in todo:
                    scan.in_grid = scan.pose is pose  # a pose changed meanwhile: dirty again
                if rebuild:
                    self._cells = cells
            return True

    def _rebuild_all(self) -> bool:
        """Rebuild after :meth:`update` dropped scans (the build lock is held)."""
        with self._lock:
            generation = self._generation
            self._dirty = False
            todo = [(s, s.pose) for s in self._scans if s.pose is not None]
        traces = [self._trace(scan, pose) for scan, pose in todo]
        cells = GridCells()
        outside = self._apply(cells, traces)
        with self._lock:
            if generation == self._generation:
                self._counts['num_traced'] += len(traces)
                self._counts['num_rebuilds'] += 1
                self._counts['num_cells_outside'] += outside
                for (scan, pose), trace in zip(todo, traces):
                    scan.box, scan.camera_xy = trace.box, trace.camera_xy
                    scan.in_grid = scan.pose is pose
                self._cells = cells
        return True

    def view(self) -> GridView:
        """Return the grid as trinary cells, cut to the rectangle of the cells seen.

        With no cell seen yet (no confident depth) the whole rectangle, all unknown.
        """
        cfg = self._config
        with self._build_lock:
            cells = self._cells
            seen = (cells.hits > 0) | (cells.misses > 0)
            data = np.full(cells.logodds.shape, UNKNOWN, np.int8)
            p = 1.0 / (1.0 + np.exp(-cells.logodds.astype(np.float64)))
            data[seen & (p >= cfg.occupied_threshold)] = OCCUPIED
            data[seen & (p <= cfg.free_threshold)] = FREE
            x0, y0 = cells.x0, cells.y0
        rows, cols = np.nonzero(seen.any(axis=1))[0], np.nonzero(seen.any(axis=0))[0]
        if rows.size:
            data = data[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
            x0, y0 = x0 + int(cols[0]), y0 + int(rows[0])
        res = cfg.resolution
        return GridView(np.ascontiguousarray(data), res, x0 * res, y0 * res)

    def counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return copies of ([H, W] log-odds, hit counts, miss counts), as :meth:`view`'s cells."""
        with self._build_lock:
            c = self._cells
            return c.logodds.copy(), c.hits.copy(), c.misses.copy()

    # ---- helpers -------------------------------------------------------------------------

    def _thin(self, pts: np.ndarray) -> tuple[np.ndarray, int]:
        """One point per 3D cell of the grid's edge, at most :data:`MAX_SCAN_POINTS`."""
        if not len(pts):
            return pts.reshape(0, 3), 0
        cell = np.floor(pts / self._config.resolution)
        inside = (np.abs(cell) < _THIN_OFFSET).all(axis=1)
        pts, cell = pts[inside], cell[inside].astype(np.int64) + _THIN_OFFSET
        key = (cell[:, 0] << 42) | (cell[:, 1] << 21) | cell[:, 2]
        _, first = np.unique(key, return_index=True)
        pts = pts[np.sort(first)]
        thinned = max(len(pts) - MAX_SCAN_POINTS, 0)
        if thinned:  # evenly over the image order: every part of the view keeps some
            pts = pts[np.linspace(0, len(pts) - 1, MAX_SCAN_POINTS).round().astype(np.int64)]
        return np.ascontiguousarray(pts), thinned + int(np.count_nonzero(~inside))

    def _trace(self, scan: _Scan, pose: np.ndarray) -> ScanTrace:
        """One scan's misses and hits under ``pose`` (see the module docstring).

        Every cell a scan can touch lies within ``grid.max_range`` of its camera: the cells are
        marked in a square window around it (no sort of the ray samples).
        """
        cfg = self._config
        res = cfg.resolution
        camera = pose[:3, 3]
        cam_cell = np.floor(camera[:2] / res)
        if not (np.abs(cam_cell) < CELL_OFFSET - _WINDOW_MAX).all():
            empty = np.zeros(0, np.int64)
            none = np.zeros(0, np.float16)
            return ScanTrace(empty, empty, none, none, none, (0, 0, 0, 0),
                             (float(camera[0]), float(camera[1])), len(scan.xyz))
        world = scan.xyz.astype(np.float64) @ pose[:3, :3].T + camera
        world = world[world[:, 2] <= cfg.max_height]
        reach = np.linalg.norm(world - camera, axis=1)
        cut = reach > cfg.max_range
        scale = np.where(cut, cfg.max_range / np.maximum(reach, 1e-12), 1.0)
        end = camera + (world - camera) * scale[:, None]
        hit = ~cut & (world[:, 2] >= cfg.min_height)
        radius = int(math.ceil(cfg.max_range / res)) + 2
        cx, cy = int(cam_cell[0]), int(cam_cell[1])
        x0, y0, size = cx - radius, cy - radius, 2 * radius + 1
        ends = np.clip(np.floor(end[:, :2] / res).astype(np.int64) - (x0, y0), 0, size - 1)
        z = end[:, 2]
        # Rays ending in the same cell with the same verdict are one ray; per end cell the
        # hits' span of heights and the lowest end (the height a traced ray ends at).
        hit_low = np.full((size, size), np.inf)
        hit_high = np.full((size, size), -np.inf)
        np.minimum.at(hit_low, (ends[hit, 1], ends[hit, 0]), z[hit])
        np.maximum.at(hit_high, (ends[hit, 1], ends[hit, 0]), z[hit])
        end_low = np.full((size, size), np.inf)
        np.minimum.at(end_low, (ends[:, 1], ends[:, 0]), z)
        crossed = np.full((size, size), np.inf)  # the lowest height a ray crossed a cell at
        np.minimum.at(crossed, (ends[~hit, 1], ends[~hit, 0]), z[~hit])
        end_hit = np.isfinite(hit_low)
        hy, hx = np.nonzero(end_hit)
        fy, fx = np.nonzero(np.isfinite(crossed))
        start = camera[:2] / res - (x0, y0)
        # Each end cell is marked; the cells between are traced along the longest ray of each
        # thin wedge around the camera (half a cell wide at the range's end): a shorter ray
        # of the wedge lies within half a cell of it.
        ex, ey = np.concatenate([hx, fx]), np.concatenate([hy, fy])
        vec = np.stack([ex + 0.5, ey + 0.5], axis=1) - start
        length = np.hypot(vec[:, 0], vec[:, 1])
        wedges = int(math.ceil(4 * math.pi * radius))
        wedge = ((np.arctan2(vec[:, 1], vec[:, 0]) + math.pi) * (wedges / (2 * math.pi))
                 ).astype(np.int64)
        order = np.lexsort((length, wedge))
        longest = order[np.append(wedge[order][1:] != wedge[order][:-1], True)] \
            if len(order) else order
        vec, length = vec[longest], length[longest]
        drop = end_low[ey[longest], ex[longest]] - camera[2]
        steps = np.ceil(length * 2).astype(np.int64) + 1
        ray = np.repeat(np.arange(len(longest)), steps)
        offset = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
        frac = offset / np.maximum(steps[ray] - 1, 1)
        samples = np.clip(np.floor(start + vec[ray] * frac[:, None]).astype(np.int64), 0,
                          size - 1)
        np.minimum.at(crossed, (samples[:, 1], samples[:, 0]), camera[2] + drop[ray] * frac)
        missed = np.isfinite(crossed) & ~end_hit
        my, mx = np.nonzero(missed)
        xs, ys = np.append(ex, cx - x0), np.append(ey, cy - y0)
        box = (int(xs.min()) + x0, int(ys.min()) + y0, int(xs.max()) + x0 + 1,
               int(ys.max()) + y0 + 1)
        return ScanTrace(pack_cells(mx + x0, my + y0), pack_cells(hx + x0, hy + y0),
                         _half(crossed[my, mx]), _half(hit_low[hy, hx]),
                         _half(hit_high[hy, hx]), box,
                         (float(camera[0]), float(camera[1])), 0)

    def _fit(self, newest: _Scan | None) -> bool:
        """Drop the scans farthest from the newest until the rectangle fits (under the lock).

        Returns whether a scan was dropped (the grid is then rebuilt without it).
        """
        placed = [s for s in self._scans if s.pose is not None and s.box is not None]
        if not placed:
            return False
        boxes = np.array([s.box for s in placed], np.int64)
        if box_area(box_union_rows(boxes)) <= self._config.max_cells:
            return False
        last = placed.index(newest) if newest in placed else len(placed) - 1
        anchor = np.asarray(placed[last].camera_xy)
        others = [i for i in range(len(placed)) if i != last]
        distance = np.array([np.hypot(*(np.asarray(placed[i].camera_xy) - anchor))
                             for i in others])
        order = [others[i] for i in np.argsort(-distance, kind='stable')]  # farthest first
        # Rectangle kept after dropping the first k of ``order``: the newest's box and the
        # union of order[k:], a suffix of running minima and maxima.
        rest = boxes[order[::-1]]
        low = np.minimum.accumulate(rest[:, :2], axis=0)[::-1] if len(rest) else rest[:, :2]
        high = np.maximum.accumulate(rest[:, 2:], axis=0)[::-1] if len(rest) else rest[:, 2:]
        own = boxes[last]
        count = len(order)
        for k in range(len(order)):
            box = (min(low[k, 0], own[0]), min(low[k, 1], own[1]), max(high[k, 0], own[2]),
                   max(high[k, 1], own[3]))
            if box_area(box) <= self._config.max_cells:
                count = k
                break
        for i in order[:count]:
            self._scans.remove(placed[i])
            self._stored -= len(placed[i].xyz)
        self._counts['num_dropped_far'] += count
        return count > 0

    def _apply(self, cells: GridCells, traces: list[ScanTrace]) -> int:
        """Grow ``cells`` to the traces' rectangle (bounded) and add them in age order."""
        boxes = [t.box for t in traces if box_area(t.box) > 0]
        if not boxes:
            return 0
        box = box_union_all(boxes)
        limit = self._config.max_cells
        if box_area(box) > limit:  # the newest alone is too large: a square around its camera
            side = max(int(math.isqrt(limit)), 1)
            cx, cy = (int(math.floor(v / self._config.resolution)) for v in traces[-1].camera_xy)
            box = (cx - side // 2, cy - side // 2, cx - side // 2 + side, cy - side // 2 + side)
        cells.grow(box, limit)
        return sum(cells.apply(t) for t in traces)

    def _drop_oldest_points(self) -> None:
        """Drop the oldest scans while the stored points pass the budget (lock held)."""
        dropped = 0
        while self._stored > self._point_budget and len(self._scans) > 1:
            scan = self._scans.pop(0)
            self._stored -= len(scan.xyz)
            dropped += 1
            self._dirty |= scan.in_grid
        self._counts['num_dropped_old'] += dropped


def _half(heights: np.ndarray) -> np.ndarray:
    """Store heights as float16; beyond its range they saturate (no overflow to inf)."""
    return np.clip(heights, -_HALF_MAX, _HALF_MAX).astype(np.float16)
