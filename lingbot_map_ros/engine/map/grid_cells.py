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
"""The dense cells of the occupancy grid and what one keyframe's trace puts into them.

:class:`GridCells` holds log-odds, hit and miss counts and the span of heights of the hits
over the grid's rectangle, grown as the scans reach out; :class:`ScanTrace` is one keyframe's
hits and misses as packed cell keys (:func:`pack_cells`) with their heights, made by
:class:`~lingbot_map_ros.engine.map.occupancy_grid.OccupancyGrid`. :meth:`GridCells.view` gives
the trinary grid (:class:`GridView`). The rules are in ``occupancy_grid.py``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

LOG_ODDS_HIT = math.log(0.7 / 0.3)
"""Log-odds a hit adds (a hit is right 70 % of the time)."""
LOG_ODDS_MISS = math.log(0.4 / 0.6)
"""Log-odds a miss adds (a miss says free with 60 %)."""
LOG_ODDS_MIN, LOG_ODDS_MAX = -2.0, 3.5
"""Clamp of a cell's log-odds, so a cell can change its mind after a few scans."""
MAX_COUNT = np.iinfo(np.uint16).max
"""Hit and miss counts saturate here."""
PAD_CELLS = 32
"""Cells added on each side when the grid grows (fewer reallocations while the robot moves)."""
CELL_OFFSET = 1 << 30
"""Cell coordinates are kept within +-2**30 (two pack into an int64 key with a bit to spare)."""
UNKNOWN, FREE, OCCUPIED = -1, 0, 100
"""Cell values of ``nav_msgs/OccupancyGrid``."""


@dataclass(frozen=True, slots=True)
class GridView:
    """The grid as published: trinary cells over a rectangle of the map frame's x-y plane."""

    data: np.ndarray
    """[H, W] int8 -1 / 0 / 100; row 0 is the lowest y, column 0 the lowest x."""
    resolution: float
    """Cell edge in map units."""
    origin_x: float
    """x of the lower-left corner of cell [0, 0]."""
    origin_y: float
    """y of that corner."""

    @property
    def width(self) -> int:
        """Cells along x."""
        return int(self.data.shape[1])

    @property
    def height(self) -> int:
        """Cells along y."""
        return int(self.data.shape[0])


@dataclass(slots=True)
class ScanTrace:
    """One scan's cells: misses and hits as packed keys, its rectangle and camera."""

    free: np.ndarray
    hit: np.ndarray
    free_height: np.ndarray
    """[F] the lowest height a ray crossed each missed cell at."""
    hit_low: np.ndarray
    """[H] the lowest hit height in each hit cell."""
    hit_high: np.ndarray
    """[H] the highest."""
    box: tuple[int, int, int, int]
    camera_xy: tuple[float, float]
    out_of_range: int


class GridCells:
    """The dense arrays over the grid's rectangle (touched only by the updating thread)."""

    def __init__(self) -> None:
        """Start with no cells."""
        self.x0 = self.y0 = 0
        self.logodds = np.zeros((0, 0), np.float32)
        self.hits = np.zeros((0, 0), np.uint16)
        self.misses = np.zeros((0, 0), np.uint16)
        # The heights a cell's hits spanned (float16: a band's heights need no more); a ray
        # clears a hit cell only where it crosses that span.
        self.low = np.full((0, 0), np.inf, np.float16)
        self.high = np.full((0, 0), -np.inf, np.float16)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.logodds, self.hits, self.misses, self.low, self.high

    @property
    def box(self) -> tuple[int, int, int, int]:
        """Return the arrays' rectangle ``(x0, y0, x1, y1)`` in cells, ends excluded."""
        h, w = self.logodds.shape
        return self.x0, self.y0, self.x0 + w, self.y0 + h

    def grow(self, box: tuple[int, int, int, int], max_cells: int) -> None:
        """Make the arrays cover ``box`` (with padding while it fits ``max_cells``)."""
        have = self.box
        if self.logodds.size and box_contains(have, box):
            return
        want = box_union(have, box) if self.logodds.size else box
        padded = (want[0] - PAD_CELLS, want[1] - PAD_CELLS, want[2] + PAD_CELLS,
                  want[3] + PAD_CELLS)
        if box_area(padded) <= max_cells:
            want = padded
        old = self._arrays()
        h, w = want[3] - want[1], want[2] - want[0]
        self.logodds = np.zeros((h, w), np.float32)
        self.hits = np.zeros((h, w), np.uint16)
        self.misses = np.zeros((h, w), np.uint16)
        self.low = np.full((h, w), np.inf, np.float16)
        self.high = np.full((h, w), -np.inf, np.float16)
        if old[0].size:
            ox, oy = have[0] - want[0], have[1] - want[1]
            oh, ow = old[0].shape
            for new, prev in zip(self._arrays(), old):
                new[oy:oy + oh, ox:ox + ow] = prev
        self.x0, self.y0 = want[0], want[1]

    def apply(self, trace: ScanTrace) -> int:
        """Add one scan's hits and misses; returns its cells outside the arrays (left out).

        A miss counts in a cell never hit, or where the ray crossed the heights the cell's hits
        spanned (what stood there is gone); a ray passing over a low obstacle or under a
        table's top says nothing about them.
        """
        h, w = self.logodds.shape
        outside = 0
        ix, iy = unpack_cells(trace.hit)
        ix, iy = ix - self.x0, iy - self.y0
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        outside += int(inside.size - np.count_nonzero(inside))
        ix, iy = ix[inside], iy[inside]
        self._step(iy, ix, LOG_ODDS_HIT, self.hits)
        self.low[iy, ix] = np.minimum(self.low[iy, ix], trace.hit_low[inside])
        self.high[iy, ix] = np.maximum(self.high[iy, ix], trace.hit_high[inside])
        ix, iy = unpack_cells(trace.free)
        ix, iy = ix - self.x0, iy - self.y0
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        outside += int(inside.size - np.count_nonzero(inside))
        ix, iy, height = ix[inside], iy[inside], trace.free_height[inside]
        low, high = self.low[iy, ix], self.high[iy, ix]
        clears = (self.hits[iy, ix] == 0) | ((height >= low) & (height <= high))
        self._step(iy[clears], ix[clears], LOG_ODDS_MISS, self.misses)
        return outside

    def _step(self, iy: np.ndarray, ix: np.ndarray, step: float, counts: np.ndarray) -> None:
        self.logodds[iy, ix] = np.clip(self.logodds[iy, ix] + np.float32(step), LOG_ODDS_MIN,
                                       LOG_ODDS_MAX)
        counts[iy, ix] = np.minimum(counts[iy, ix].astype(np.int32) + 1, MAX_COUNT)


def pack_cells(ix: np.ndarray, iy: np.ndarray) -> np.ndarray:
    """Return the int64 keys of cells ``(ix, iy)`` (each within +-:data:`CELL_OFFSET`)."""
    # 31 bits an axis: a key stays below 2**62, so a key times two plus a flag fits int64.
    return ((ix.astype(np.int64) + CELL_OFFSET) << 31) | (iy.astype(np.int64) + CELL_OFFSET)


def unpack_cells(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the cells ``(ix, iy)`` of keys made by :func:`pack_cells`."""
    return (keys >> 31) - CELL_OFFSET, (keys & 0x7FFFFFFF) - CELL_OFFSET


def box_area(box: tuple[int, int, int, int]) -> int:
    """Return the cells of a rectangle ``(x0, y0, x1, y1)``, ends excluded."""
    return max(box[2] - box[0], 0) * max(box[3] - box[1], 0)


def box_union(a: tuple[int, int, int, int], b: tuple[int, int, int, int]
              ) -> tuple[int, int, int, int]:
    """Return the smallest rectangle holding both."""
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def box_union_all(boxes: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    """Return the smallest rectangle holding every one of ``boxes`` (not empty)."""
    return box_union_rows(np.array(boxes, np.int64))


def box_union_rows(boxes: np.ndarray) -> tuple[int, int, int, int]:
    """Return the smallest rectangle holding every row of ``boxes`` ([N, 4], N > 0)."""
    return (int(boxes[:, 0].min()), int(boxes[:, 1].min()), int(boxes[:, 2].max()),
            int(boxes[:, 3].max()))


def box_contains(outer: tuple[int, int, int, int], inner: tuple[int, int, int, int]) -> bool:
    """Return whether ``outer`` holds ``inner``."""
    return outer[0] <= inner[0] and outer[1] <= inner[1] and outer[2] >= inner[2] and \
        outer[3] >= inner[3]
