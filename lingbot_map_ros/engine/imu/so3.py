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
"""Rotation-group helpers of the IMU code: hat, exponential, logarithm, right Jacobian (numpy).

Rotation vectors are axis times angle in radians; matrices are proper [3, 3] rotations. The
small-angle branches keep the Taylor terms so the preintegration stays exact to float64 at
200 Hz, where one gyroscope step turns a few milliradians.
"""

from __future__ import annotations

import numpy as np

_SMALL = 1e-8


def hat(v: np.ndarray) -> np.ndarray:
    """Return the skew matrix of a [3] vector (matrix times b is the cross product v x b)."""
    x, y, z = v
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def exp(phi: np.ndarray) -> np.ndarray:
    """Return the rotation matrix of the rotation vector ``phi`` [3] (Rodrigues)."""
    angle = float(np.linalg.norm(phi))
    k = hat(phi)
    if angle < _SMALL:
        return np.eye(3) + k + 0.5 * k @ k
    return (np.eye(3) + (np.sin(angle) / angle) * k
            + ((1.0 - np.cos(angle)) / angle ** 2) * k @ k)


def log(rotation: np.ndarray) -> np.ndarray:
    """Return the rotation vector [3] of a rotation matrix (angle in [0, pi])."""
    cos = np.clip((np.trace(rotation) - 1.0) / 2.0, -1.0, 1.0)
    angle = float(np.arccos(cos))
    skew = np.array([rotation[2, 1] - rotation[1, 2], rotation[0, 2] - rotation[2, 0],
                     rotation[1, 0] - rotation[0, 1]])
    if angle < 1e-6:
        return 0.5 * skew
    if np.pi - angle < 1e-4:
        # Near pi the skew part vanishes: the axis is the dominant column of R + I.
        sym = (rotation + np.eye(3)) / 2.0
        axis = sym[:, int(np.argmax(np.diag(sym)))]
        axis = axis / np.linalg.norm(axis)
        if axis @ skew < 0.0:
            axis = -axis
        return angle * axis
    return angle / (2.0 * np.sin(angle)) * skew


def right_jacobian(phi: np.ndarray) -> np.ndarray:
    """Return the right Jacobian of SO(3) at ``phi``: ``exp(phi + d) ~ exp(phi) exp(Jr d)``."""
    angle = float(np.linalg.norm(phi))
    k = hat(phi)
    if angle < _SMALL:
        return np.eye(3) - 0.5 * k + k @ k / 6.0
    return (np.eye(3) - ((1.0 - np.cos(angle)) / angle ** 2) * k
            + ((angle - np.sin(angle)) / angle ** 3) * k @ k)


def angle_between(a: np.ndarray, b: np.ndarray) -> float:
    """Return the angle in radians between two nonzero [3] vectors."""
    cos = float(a @ b) / (float(np.linalg.norm(a)) * float(np.linalg.norm(b)))
    return float(np.arccos(np.clip(cos, -1.0, 1.0)))
