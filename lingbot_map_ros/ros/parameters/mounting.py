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
"""``frames.base_to_camera`` as a camera mounting: seven numbers to a ``[4, 4]`` transform.

The parameter is ``x y z qx qy qz qw``: the camera body frame (x forward, y left, z up) in
``base_frame``. The start-up checks (``param_checks.py``, ``input_params.py``) refuse a value this
module refuses; the odometry frames (``publishers/odom_frames.py``) build the mounting with it,
from the parameter or from ``/tf_static``.
"""

from __future__ import annotations

from typing import Sequence

from lingbot_map_ros.engine.image import geometry
import numpy as np

MAX_MOUNT_TRANSLATION_M = 1000.0
"""Largest accepted distance of the camera from ``base_frame`` (metres): farther is a typo or an
attack, and would carry ~1e308 values into every pose."""
_QUAT_NORM_RANGE = (1e-6, 1e6)
"""A quaternion is normalised when its norm is in this range; outside it, it is refused."""


def pose7_to_matrix(values: Sequence[float], source: str = 'frames.base_to_camera'
                    ) -> np.ndarray:
    """``[x, y, z, qx, qy, qz, qw]`` -> ``[4, 4]``, a plausible camera mounting.

    Args:
        values: translation (metres) and quaternion (normalised here).
        source: where the values come from, for the error message.

    Raises:
        ValueError: not 7 finite numbers, a translation farther than
            :data:`MAX_MOUNT_TRANSLATION_M`, or a quaternion that cannot be normalised; the
            message names ``source`` and shows the values as given.
    """
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        v = np.zeros(0)
    shown = ', '.join(repr(x) for x in (values if isinstance(values, (list, tuple)) else v))
    if v.shape != (7,) or not np.isfinite(v).all():
        raise ValueError(f'{source} needs 7 finite numbers (x y z qx qy qz qw), got [{shown}]')
    distance = _norm(v[:3])
    if distance > MAX_MOUNT_TRANSLATION_M:
        raise ValueError(f'{source}: the camera is {distance:.4g} m from '
                         f'the base frame (more than {MAX_MOUNT_TRANSLATION_M:g} m) in [{shown}]')
    norm = _norm(v[3:])
    if not _QUAT_NORM_RANGE[0] <= norm <= _QUAT_NORM_RANGE[1]:
        quat = ', '.join(repr(float(q)) for q in v[3:])
        low, high = _QUAT_NORM_RANGE
        raise ValueError(f'{source}: the quaternion (qx qy qz qw) = ({quat}) has norm '
                         f'{norm:.4g}, outside [{low:g}, {high:g}]: not a rotation')
    out = np.eye(4)
    out[:3, :3] = np.asarray(geometry.quaternion_to_rotation(v[3:] / norm))
    out[:3, 3] = v[:3]
    return out


def _norm(values: np.ndarray) -> float:
    """Euclidean norm without overflow (1e300 values give 1.4e300, not inf)."""
    largest = float(np.abs(values).max())
    return largest * float(np.linalg.norm(values / largest)) if largest > 0 else 0.0
