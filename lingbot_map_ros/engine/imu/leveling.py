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
"""Levelling ``odom`` or ``map`` with gravity, once per origin (REP 103/105: z up).

``odom`` is anchored at the first pose after start or a reset (``T_odom_world = B @ inv(C0)``,
``ros/publishers/odom_frames.py``). With an IMU there are two cases:

- **Gravity known at the anchor** (the IMU (quasi-)still over a short window up to the anchoring
  frame's stamp, :func:`~lingbot_map_ros.engine.imu.gravity.still_gravity`): ``odom`` itself is
  levelled, ``T_odom_world = L @ B @ inv(C0)`` with ``L`` the smallest rotation taking gravity
  (in ``base_frame`` at the anchor) to -z. odom's origin and heading stay base's first pose's;
  the first published pose is ``L`` itself, so base's roll and pitch show at once.
- **Not known at the anchor** (no readings yet, the robot moving): odom is anchored as without an
  IMU, and once the visual-inertial alignment gives gravity in the engine's world,
  ``map`` is levelled instead: ``map -> odom`` gets the smallest rotation taking gravity in odom
  to -z. ``~/odometry`` and ``odom -> base`` never jump after the fact; REP 105 lets ``map`` jump.

Either is fixed until the next origin (:meth:`GravityLevel.clear`): a rollover keeps it (the
stitched world is continuous).
"""

from __future__ import annotations

import math
import threading
from typing import Callable

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.imu.gravity import aligned_from_world, still_gravity
import numpy as np

STILL_WINDOW_S = (0.5, 0.2)
"""Seconds of readings up to the anchor tried for the still test, longest first (an IMU that
started, or a robot that stopped, shortly before the anchoring frame still counts)."""
STILL_MAX_RATE = 0.05
"""rad/s: quasi-still. Above a consumer gyroscope's turn-on bias plus its white noise per
reading, low enough that gravity turns by well under a degree over the window."""
STILL_SLACK_S = 1e-3
"""Seconds before the anchor's stamp the window must reach (float stamps are not exact)."""

Readings = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(stamps, gyro, accel)`` of a window (``ImuBuffer.window``)."""


def level_matrix(gravity: np.ndarray) -> np.ndarray:
    """Return the [4, 4] rotation taking the unit ``gravity`` to -z (no translation).

    Raises:
        ValueError: ``gravity`` not a finite nonzero [3] vector.
    """
    out = np.eye(4)
    out[:3, :3] = aligned_from_world(gravity)
    return out


def tilt_deg(level: np.ndarray) -> float:
    """Return the angle of a levelling rotation in degrees (the tilt it corrects)."""
    return math.degrees(float(np.linalg.norm(so3.log(np.asarray(level)[:3, :3]))))


def gravity_in_base(gravity_imu: np.ndarray, imu_from_camera: np.ndarray,
                    base_from_optical: np.ndarray) -> np.ndarray:
    """Return gravity in ``base_frame`` from gravity in the IMU frame.

    Args:
        gravity_imu: [3] unit direction gravity pulls, IMU frame.
        imu_from_camera: [4, 4] camera optical frame into the IMU frame.
        base_from_optical: [4, 4] ``B``, the camera optical frame in ``base_frame``.
    """
    in_camera = np.asarray(imu_from_camera)[:3, :3].T @ np.asarray(gravity_imu, np.float64)
    out = np.asarray(base_from_optical)[:3, :3] @ in_camera
    return out / np.linalg.norm(out)


def anchor_level(readings: Readings | None, imu_from_camera: np.ndarray,
                 base_from_optical: np.ndarray, max_rate: float = STILL_MAX_RATE
                 ) -> np.ndarray | None:
    """Return odom's levelling ``L`` ([4, 4]) from still readings at the anchor, or None.

    None when there are no readings or they show motion (:func:`still_gravity`).
    """
    if readings is None:
        return None
    _, gyro, accel = readings
    still = still_gravity(gyro, accel, max_rate=max_rate)
    if not still.still:
        return None
    return level_matrix(gravity_in_base(still.gravity, imu_from_camera, base_from_optical))


def map_level(gravity_world: np.ndarray, odom_from_world: np.ndarray) -> np.ndarray:
    """Return ``map -> odom``'s levelling rotation ([4, 4]) from gravity in the engine's world.

    Args:
        gravity_world: [3] direction gravity pulls in the engine's continuous world.
        odom_from_world: [4, 4] ``T_odom_world`` (rigid, or a similarity: its rotation is used).
    """
    linear = np.asarray(odom_from_world, np.float64)[:3, :3]
    in_odom = linear @ np.asarray(gravity_world, np.float64)
    return level_matrix(in_odom / np.linalg.norm(in_odom))


class GravityLevel:
    """The levelling of one origin: ``odom`` at the anchor, else ``map`` once gravity is known.

    Thread-safe: the inference thread anchors and updates it, the diagnostics read it.
    """

    def __init__(self, still_readings: Callable[[float, float], Readings | None],
                 world_gravity: Callable[[], np.ndarray | None],
                 imu_from_camera: np.ndarray) -> None:
        """Build the levelling of the IMU mounted at ``imu_from_camera``.

        Args:
            still_readings: ``(t0, t1)`` -> the readings covering ``[t0, t1]`` (camera clock,
                s; ``ImuBuffer.window``), None when the buffer does not cover it.
            world_gravity: the visual-inertial gravity in the engine's continuous world, or None
                while not known.
            imu_from_camera: [4, 4] camera optical frame into the IMU frame (the primary camera).
        """
        self._still_readings = still_readings
        self._world_gravity = world_gravity
        self._imu_from_camera = np.asarray(imu_from_camera, np.float64)
        self._lock = threading.Lock()
        self._frame = 'none'
        self._level = np.eye(4)
        self._version = 0
        self._anchored = False

    def at_anchor(self, stamp_s: float, base_from_optical: np.ndarray) -> np.ndarray | None:
        """Return odom's levelling at a new anchor, or None when gravity is not known there."""
        level = None
        for length in STILL_WINDOW_S:  # a robot that stopped shortly before: the shorter one
            readings = self._still_readings_in(stamp_s - length, stamp_s)
            level = anchor_level(readings, self._imu_from_camera, base_from_optical)
            if level is not None:
                break
        with self._lock:
            self._anchored = True
            if level is not None:
                self._frame, self._level = 'odom', level
        return None if level is None else level.copy()

    def _still_readings_in(self, t0: float, t1: float) -> Readings | None:
        window = self._still_readings(t0, t1 - STILL_SLACK_S)
        if window is None:
            return None
        stamps, gyro, accel = window
        # The buffer gives the first reading at or after the end too: keep it only near it.
        keep = stamps <= t1 + STILL_SLACK_S
        return stamps[keep], gyro[keep], accel[keep]

    def after_anchor(self, odom_from_world: np.ndarray) -> bool:
        """Level ``map`` once gravity is known, when odom was not levelled at its anchor.

        Returns:
            True when ``map -> odom`` changed now.
        """
        with self._lock:
            if not self._anchored or self._frame != 'none':
                return False
        gravity = self._world_gravity()
        if gravity is None or not np.isfinite(gravity).all():
            return False
        level = map_level(gravity, odom_from_world)
        with self._lock:
            if self._frame != 'none':
                return False
            self._frame, self._level = 'map', level
            self._version += 1
        return True

    def clear(self) -> None:
        """Forget the origin (a reset): the next anchor levels again from the accelerometer."""
        with self._lock:
            if self._frame == 'map':
                self._version += 1  # map -> odom goes back to the identity
            self._frame, self._level, self._anchored = 'none', np.eye(4), False

    def map_from_odom(self) -> np.ndarray:
        """Return the levelling of ``map -> odom`` ([4, 4]; the identity unless ``map``)."""
        with self._lock:
            return self._level.copy() if self._frame == 'map' else np.eye(4)

    @property
    def version(self) -> int:
        """Return a count that changes whenever :meth:`map_from_odom` does."""
        with self._lock:
            return self._version

    def state(self) -> tuple[str, float | None]:
        """Return which frame is levelled (``odom``, ``map``, ``none``) and its tilt in degrees."""
        with self._lock:
            frame, level = self._frame, self._level
        return frame, (tilt_deg(level) if frame != 'none' else None)
