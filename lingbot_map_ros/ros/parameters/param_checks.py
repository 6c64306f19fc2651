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
"""Value checks of the node's parameters beyond rclpy's types and ranges (docs/parameters.md).

Every numeric value must be finite and inside its announced range; arrays may not be empty and
hold only finite values in their element range; ``frames.base_to_camera`` must be a plausible
mounting (:func:`~lingbot_map_ros.ros.publishers.odom_frames.pose7_to_matrix`);
``frames.odom_frame`` and ``frames.base_frame`` may not be empty and no two of odom, base and map
frame may be equal; ``output.directory`` must resolve to an absolute path
(:func:`~lingbot_map_ros.ros.publishers.map_save.resolve_directory`). Each check returns the reason
a value is refused, naming the parameter, or None.
"""

from __future__ import annotations

import math
from typing import Any

from lingbot_map_ros.ros.publishers.map_save import resolve_directory
from lingbot_map_ros.ros.publishers.odom_frames import pose7_to_matrix

ARRAY_ELEMENT_RANGES: dict[str, tuple[int, int]] = {
    'model.tap_layers': (0, 127),
    'model.depth_out_channels': (1, 8192),
}
"""Bounds of the elements of integer arrays (the dataclasses check the arrays' shapes)."""
FRAME_PARAMS = ('frames.odom_frame', 'frames.base_frame', 'frames.map_frame',
                'frames.camera_frame')
REQUIRED_FRAMES = ('frames.odom_frame', 'frames.base_frame')
DISTINCT_FRAMES = ('frames.odom_frame', 'frames.base_frame', 'frames.map_frame')


def check_value(name: str, value: Any, bounds: tuple[float, float] | None) -> str | None:
    """Return why ``value`` is refused for parameter ``name``, or None.

    Args:
        name: the parameter.
        value: proposed value.
        bounds: inclusive range of a numeric parameter, or None.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            return f'{name}={value} is not a finite number'
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f'{name}={value} is outside [{bounds[0]:g}, {bounds[1]:g}]'
        return None
    if isinstance(value, (list, tuple)):
        return _check_array(name, value)
    if name in REQUIRED_FRAMES and not str(value).strip():
        return f'{name} may not be empty'
    if name in FRAME_PARAMS and value != str(value).strip():
        return f'{name}={value!r} has leading or trailing white space'
    if name == 'output.directory':
        try:
            resolve_directory(str(value))
        except ValueError as exc:
            return str(exc)
    return None


def _check_array(name: str, value: list[Any] | tuple[Any, ...]) -> str | None:
    if name == 'frames.base_to_camera':
        try:
            pose7_to_matrix(value, source=name)
        except ValueError as exc:
            return str(exc)
        return None
    if not value:
        return f'{name} may not be empty'
    if not all(math.isfinite(v) for v in value):
        return f'{name}={list(value)} holds a non-finite number'
    low, high = ARRAY_ELEMENT_RANGES.get(name, (-math.inf, math.inf))
    if not all(low <= v <= high for v in value):
        return f'{name}={list(value)}: every value must be in [{low}, {high}]'
    return None


def check_frames(values: dict[str, Any]) -> str | None:
    """Refuse equal odom, base and map frame ids (TF cannot hold a frame as its own parent).

    Args:
        values: parameter values (the ``frames.*`` keys are read).

    Returns:
        None when acceptable, else the reason it is refused.
    """
    seen: dict[str, str] = {}
    for key in DISTINCT_FRAMES:
        frame = values.get(key)
        if not frame:
            continue
        if frame in seen:
            return f"{key} and {seen[frame]} are both '{frame}': they must differ"
        seen[frame] = key
    return None
