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
"""Gravity: the rotation that makes a frame z-up, and gravity from an IMU standing still.

REP 103/105 want ``odom`` and ``map`` with +z up. Once gravity is known in the model's world
frame (the alignment, or the accelerometer while still), :func:`aligned_from_world` is the
smallest rotation taking that frame's gravity to -z; it leaves the heading as it was as far as a
tilt correction can, so an already level frame is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.imu.alignment import STANDARD_GRAVITY
import numpy as np

DOWN = np.array([0.0, 0.0, -1.0])
"""Gravity's direction in a z-up frame."""


def aligned_from_world(gravity: np.ndarray) -> np.ndarray:
    """Return the smallest [3, 3] rotation taking the unit ``gravity`` (world frame) to -z.

    Raises:
        ValueError: ``gravity`` is not a finite nonzero [3] vector.
    """
    g = np.asarray(gravity, dtype=np.float64)
    if g.shape != (3,) or not np.isfinite(g).all() or np.linalg.norm(g) == 0.0:
        raise ValueError(f'gravity must be a finite nonzero [3] vector, got {gravity!r}')
    g = g / np.linalg.norm(g)
    axis = np.cross(g, DOWN)
    sin = float(np.linalg.norm(axis))
    cos = float(g @ DOWN)
    if sin < 1e-12:
        # Already down, or exactly up: then half a turn about x.
        return np.eye(3) if cos > 0.0 else so3.exp(np.array([np.pi, 0.0, 0.0]))
    return so3.exp(axis / sin * np.arctan2(sin, cos))


@dataclass(frozen=True)
class StillGravity:
    """Gravity from readings while still."""

    still: bool
    """True when the readings show no motion (rotation and specific force steady)."""
    gravity: np.ndarray
    """[3] unit direction gravity pulls, IMU frame (NaN when not still)."""
    accel_norm: float
    """m/s^2, magnitude of the mean specific force."""


def still_gravity(gyro: np.ndarray, accel: np.ndarray, max_rate: float = 0.02,
                  max_accel_std: float = 0.1, gravity_tolerance: float = 0.5) -> StillGravity:
    """Return gravity in the IMU frame when the readings were taken standing still.

    Still means every angular rate below ``max_rate`` rad/s (after no bias: a bias above it is
    read as motion), the specific force's spread below ``max_accel_std`` m/s^2 per axis and
    its mean's magnitude within ``gravity_tolerance`` m/s^2 of standard gravity; then gravity
    pulls against the mean specific force. This gives roll and pitch at once, before any
    motion lets the alignment run.

    Args:
        gyro: [M, 3] rad/s.
        accel: [M, 3] m/s^2 specific force.
        max_rate: rad/s.
        max_accel_std: m/s^2.
        gravity_tolerance: m/s^2.

    Returns:
        Whether still, and gravity's direction when so.
    """
    gyro = np.asarray(gyro, dtype=np.float64)
    accel = np.asarray(accel, dtype=np.float64)
    nan = np.full(3, np.nan)
    if len(accel) < 2 or not (np.isfinite(gyro).all() and np.isfinite(accel).all()):
        return StillGravity(False, nan, float('nan'))
    mean = accel.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    still = (float(np.abs(gyro).max()) < max_rate
             and float(accel.std(axis=0).max()) < max_accel_std
             and abs(norm - STANDARD_GRAVITY) < gravity_tolerance)
    return StillGravity(still, -mean / norm if still else nan, norm)
