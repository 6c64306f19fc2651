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
"""``MapConfig``: the ``map.*`` parameters (``engine/map/``, docs/map.md).

Kept beside :mod:`lingbot_map_ros.config` (which re-exports it) as ``metric_config.py`` is: the
map is not part of ``EngineConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lingbot_map_ros.metric_config import section_from_flat


@dataclass(frozen=True)
class MapConfig:
    """The accumulated point-cloud map (``engine/map/map_accumulator.py``, docs/map.md)."""

    enable: bool = True
    """Build and publish ~/map from the keyframes' depth. The map only grows while depth runs
    (stream.enable_depth and model.enable_depth), so by default it is off unless depth is on."""
    voxel_size: float = 0.01
    """Edge of a map voxel, in map units: metres with metric.source 'depth', else non-metric
    (about 1/100 of the median depth of the first frames; the node logs that depth). Each voxel
    keeps one point."""
    max_points: int = 500_000
    """Most voxels in the map; past it, the voxels seen longest ago are dropped first."""
    confidence_percentile: float = 50.0
    """Drop this percentage of each keyframe's pixels, the least confident (0 keeps all; the
    upstream viewer drops 50 %)."""
    min_confidence: float = 1.0
    """Absolute floor on the depth confidence (>= 1 by construction, so 1.0 is off)."""
    pixel_stride: int = 2
    """Unproject every n-th pixel per direction of a keyframe's depth."""
    period_s: float = 1.0
    """Period of ~/map, when it changed (steady time)."""
    load_path: str = ''
    """A saved map folder (~/save_map) loaded at start to localize in or map into (map.mode,
    docs/loop_closure.md); '' starts without one. A map that is refused is logged with the
    reason and the node starts without a map. ~/load_map loads it again at run time."""
    save_path: str = ''
    """Folder ~/save_map writes the keyframe map into ('' is <output.directory>/map); a map
    already there is replaced atomically."""
    mode: Literal['mapping', 'localization'] = 'mapping'
    """With a loaded map: 'localization' finds the robot in it and never grows it, 'mapping'
    joins the new keyframes to it once a first match ties the run to it (from the next load)."""
    localize_matches: int = 3
    """With a loaded map: verified matches that must agree (where they put the robot) before
    the run is localized in it; one wrong match alone never places the robot (from the next
    load or ~/localize_in_map)."""

    def __post_init__(self) -> None:
        if self.mode not in ('mapping', 'localization'):
            raise ValueError(f"map.mode={self.mode!r} must be 'mapping' or 'localization'")
        if not self.voxel_size > 0:
            raise ValueError(f'map.voxel_size={self.voxel_size} must be > 0')
        if self.max_points < 1:
            raise ValueError(f'map.max_points={self.max_points} must be >= 1')
        if not 0.0 <= self.confidence_percentile < 100.0:
            raise ValueError(f'map.confidence_percentile={self.confidence_percentile} must be '
                             'in [0, 100)')
        if self.pixel_stride < 1:
            raise ValueError(f'map.pixel_stride={self.pixel_stride} must be >= 1')
        if not self.period_s > 0:
            raise ValueError(f'map.period_s={self.period_s} must be > 0')
        if not 1 <= self.localize_matches <= 100:
            raise ValueError(f'map.localize_matches={self.localize_matches} must be in [1, 100]')

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> 'MapConfig':
        """Build from the ``map.*`` keys of flat parameter values (other keys are ignored).

        Raises:
            ValueError: unknown ``map.*`` key or bad value.
        """
        return section_from_flat(cls, 'map', values)
