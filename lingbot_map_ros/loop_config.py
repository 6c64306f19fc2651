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
"""``LoopConfig``: the ``loop.*`` parameters (``engine/mapping/``, docs/loop_closure.md).

Kept beside :mod:`lingbot_map_ros.config` (which re-exports it) as ``metric_config.py`` is.
"""

from __future__ import annotations

from dataclasses import dataclass
import math


@dataclass(frozen=True)
class LoopConfig:
    """Loop closure: place recognition, verification, pose graph, the ``map`` frame."""

    enable: bool = True
    """Close loops: index every keyframe's place descriptor, verify candidates with the model,
    optimise a pose graph and publish map -> odom (needs gtsam; off in the tiny demo)."""
    candidates: int = 3
    """Most earlier keyframes retrieved per keyframe, each verified in turn (best first)."""
    min_score: float = 0.85
    """Least cosine similarity of two keyframes' place descriptors for a candidate."""
    exclude_recent: int = 30
    """The query's most recent keyframes are never candidates (odometry covers them)."""
    separation: int = 5
    """Candidates within this many keyframes of a better one are near-duplicates (dropped)."""
    verify_frames: int = 2
    """Keyframes on each side (query, candidate) of the model's joint verification pass."""
    verify_unit_interval: int = 3
    """A unit of the verification pass runs beside at most one frame in this many: the check's
    model work costs each frame 1/N of a unit on average, and a check takes N times as many
    frames (33 units with the official model: 97 frames from first to last at the default 3)."""
    min_inlier_fraction: float = 0.3
    """Least share of confident points that agree after the verified relative pose."""
    inlier_threshold: float = 0.05
    """A point agrees within this distance, relative to the scene's spread."""
    max_residual: float = 3.0
    """A loop whose whitened residual in the optimised graph stays above this is rejected."""
    odometry_translation_sigma: float = 0.05
    """Odometry edge's translation standard deviation, relative to the step's length."""
    odometry_rotation_sigma: float = 0.01
    """Odometry edge's rotation standard deviation per keyframe (radians)."""
    odometry_scale_sigma: float = 0.01
    """Odometry edge's log-scale standard deviation per keyframe (scale drift)."""
    image_store_mb: float = 64.0
    """Bound of the stored keyframe JPEGs (MB; the oldest go first); 0 keeps none."""
    image_folder: str = ''
    """Keep the keyframe JPEGs as files in this folder instead of in RAM (same bound)."""

    def __post_init__(self) -> None:
        if isinstance(self.verify_unit_interval, bool) \
                or not isinstance(self.verify_unit_interval, int):
            raise ValueError(f'loop.verify_unit_interval={self.verify_unit_interval!r} must be '
                             'an integer (frames)')
        for name in ('candidates', 'verify_frames', 'verify_unit_interval'):
            if getattr(self, name) < 1:
                raise ValueError(f'loop.{name}={getattr(self, name)} must be >= 1')
        for name in ('exclude_recent', 'separation'):
            if getattr(self, name) < 0:
                raise ValueError(f'loop.{name}={getattr(self, name)} must be >= 0')
        if not -1.0 <= self.min_score <= 1.0:
            raise ValueError(f'loop.min_score={self.min_score} must be in [-1, 1]')
        if not 0.0 <= self.min_inlier_fraction <= 1.0:
            raise ValueError(f'loop.min_inlier_fraction={self.min_inlier_fraction} must be '
                             'in [0, 1]')
        for name in ('inlier_threshold', 'max_residual', 'odometry_translation_sigma',
                     'odometry_rotation_sigma', 'odometry_scale_sigma'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f'loop.{name}={value} must be a finite number > 0')
        if not (math.isfinite(self.image_store_mb) and self.image_store_mb >= 0):
            raise ValueError(f'loop.image_store_mb={self.image_store_mb} must be a finite '
                             'number >= 0')

    @property
    def image_store_bytes(self) -> int:
        """``image_store_mb`` in bytes."""
        return int(self.image_store_mb * 1_000_000)
