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
"""``MetricConfig`` (the ``metric.*`` parameters) and the flat-key reader of the side sections.

Kept apart from :mod:`lingbot_map_ros.config` (which re-exports ``MetricConfig``, the metric
scale from a depth camera of ``engine/session/metric_session.py``) so that file stays one screenful
per section; :func:`section_from_flat` reads the ``section.*`` keys of ``MapConfig`` and
``MetricConfig`` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
import math
from typing import Any, Literal, TypeVar

MetricSource = Literal['none', 'depth']
_Section = TypeVar('_Section')


def section_from_flat(cls: type[_Section], section: str, values: dict[str, Any]) -> _Section:
    """Build ``cls`` from the ``<section>.*`` keys of flat parameter values (others ignored).

    Raises:
        ValueError: an unknown ``<section>.*`` key, or a bad value (the dataclass's checks).
    """
    own = {k.partition('.')[2]: v for k, v in values.items() if k.startswith(section + '.')}
    unknown = sorted(set(own) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f'unknown {section} setting(s) '
                         f"{', '.join(f'{section}.{k}' for k in unknown)}")
    return cls(**own)


@dataclass(frozen=True)
class MetricConfig:
    """Metric scale from a depth camera (engine/session/metric_session.py, docs/odometry.md)."""

    source: MetricSource = 'none'
    """'none': outputs in the model's per-session units; 'depth': a depth image aligned to the
    colour image (topic ``depth``, 16UC1 mm or 32FC1 m) gives every session its scale in
    metres (needs stream.enable_depth and model.enable_depth)."""
    max_dt_s: float = 0.005
    """A depth image pairs with the colour image whose stamp is within this many seconds."""
    settle_keyframes: int = 16
    """Keyframes of a session (its scale frames included) over which the scale is refined;
    then it is held until the next rollover or reset."""
    min_valid_fraction: float = 0.05
    """Share of the pixels with a valid depth pair (sensor and model) below which a frame,
    and a session without better frames, is degenerate (no metric scale)."""
    max_range_m: float = 0.0
    """Sensor depths beyond this are not used for the scale (0: only the physical range of
    ``engine/image/sensor_depth.py``, 1 mm to 1 km)."""
    depth_wait_s: float = 0.05
    """Longest wait of a colour frame for its depth image when the depth stream is alive."""

    def __post_init__(self) -> None:
        if self.source not in ('none', 'depth'):
            raise ValueError(f"metric.source='{self.source}' is not 'none' or 'depth'")
        for name in ('max_dt_s', 'min_valid_fraction', 'max_range_m', 'depth_wait_s'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f'metric.{name}={value} must be a finite number >= 0')
        if self.min_valid_fraction > 1:
            raise ValueError(f'metric.min_valid_fraction={self.min_valid_fraction} must be '
                             '<= 1')
        if self.settle_keyframes < 1:
            raise ValueError(f'metric.settle_keyframes={self.settle_keyframes} must be >= 1')

    @property
    def enabled(self) -> bool:
        """Return True when a depth camera sets the scale."""
        return self.source == 'depth'

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> 'MetricConfig':
        """Build from the ``metric.*`` keys of flat parameter values (other keys are ignored).

        Raises:
            ValueError: unknown ``metric.*`` key or bad value.
        """
        return section_from_flat(cls, 'metric', values)
