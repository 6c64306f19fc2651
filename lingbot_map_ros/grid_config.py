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
"""``GridConfig``: the ``grid.*`` parameters (``engine/map/occupancy_grid.py``, docs/map.md).

Kept beside :mod:`lingbot_map_ros.config` (which re-exports it) as ``map_config.py`` is: the
grid is not part of ``EngineConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any

from lingbot_map_ros.metric_config import section_from_flat

MAX_CELLS_PER_RAY = 4096
"""Most cells one ray may cross (``grid.max_range / grid.resolution``): bounds a keyframe's
ray tracing."""
MAX_EXTENT = 1000.0
"""Largest accepted ``grid.resolution``, ``grid.max_range`` and height (map units): farther is
a typo, and a cell that large is no map."""
MAX_GRID_CELLS = 100_000_000
"""Largest accepted ``grid.max_cells`` (one byte a cell in the message, 13 in the grid)."""


@dataclass(frozen=True)
class GridConfig:
    """The 2D occupancy grid ``~/grid`` (``engine/map/occupancy_grid.py``, docs/map.md)."""

    enable: bool = True
    """Build and publish ~/grid (nav_msgs/OccupancyGrid) from the keyframes' confident depth
    (needs map.enable and depth, as ~/map)."""
    resolution: float = 0.05
    """Edge of a grid cell, in map units (metres with metric.source 'depth')."""
    min_height: float = 0.1
    """Lowest point that marks an obstacle: height above base_frame's ground plane (z = 0 of
    odom / map, base_frame where the robot started), in map units."""
    max_height: float = 1.5
    """Highest point that marks an obstacle; points above it (ceilings) are left out, their
    rays too."""
    max_range: float = 5.0
    """Rays are cut at this distance from the camera; a point farther marks only free cells up
    to it."""
    occupied_threshold: float = 0.65
    """A cell whose occupancy probability (from its log-odds) is at least this is occupied
    (100)."""
    free_threshold: float = 0.25
    """A cell whose occupancy probability is at most this is free (0); between the two, and
    never seen, unknown (-1)."""
    period_s: float = 1.0
    """Period of ~/grid, when it changed (steady time); new keyframes are added to the grid
    on this timer, off the frame thread."""
    max_cells: int = 4_000_000
    """Most cells of the grid (its bounding rectangle, 17 bytes a cell); past it the
    keyframes farthest from the newest are dropped (counted)."""

    def __post_init__(self) -> None:
        checks = (
            (0 < self.resolution <= MAX_EXTENT,
             f'grid.resolution={self.resolution} must be in (0, {MAX_EXTENT:g}] map units'),
            (0 < self.max_range <= MAX_EXTENT,
             f'grid.max_range={self.max_range} must be in (0, {MAX_EXTENT:g}] map units'),
            (abs(self.min_height) <= MAX_EXTENT and abs(self.max_height) <= MAX_EXTENT,
             f'grid.min_height={self.min_height} and grid.max_height={self.max_height} must be '
             f'within +-{MAX_EXTENT:g} map units'),
            (self.min_height < self.max_height,
             f'grid.min_height={self.min_height} must be below '
             f'grid.max_height={self.max_height}'),
            (0 < self.free_threshold < self.occupied_threshold < 1,
             f'grid.free_threshold={self.free_threshold} and grid.occupied_threshold='
             f'{self.occupied_threshold} must satisfy 0 < free < occupied < 1'),
            (self.period_s > 0 and math.isfinite(self.period_s),
             f'grid.period_s={self.period_s} must be > 0'),
            (1 <= self.max_cells <= MAX_GRID_CELLS,
             f'grid.max_cells={self.max_cells} must be in [1, {MAX_GRID_CELLS}]'),
        )
        for ok, message in checks:  # NaN fails every comparison: refused too
            if not ok:
                raise ValueError(message)
        cells = self.max_range / self.resolution
        if cells > MAX_CELLS_PER_RAY:
            raise ValueError(f'grid.max_range / grid.resolution = {cells:.4g} cells a ray, more '
                             f'than {MAX_CELLS_PER_RAY}: raise grid.resolution or lower '
                             'grid.max_range')

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> 'GridConfig':
        """Build from the ``grid.*`` keys of flat parameter values (other keys are ignored).

        Raises:
            ValueError: unknown ``grid.*`` key or bad value.
        """
        return section_from_flat(cls, 'grid', values)
