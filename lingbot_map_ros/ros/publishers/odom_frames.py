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
"""REP-105 frames of the outputs: ``odom`` -> ``base_link``, from the engine's camera poses.

The engine gives ``C(t)``, camera-optical-to-world poses in its continuous world (stitched
across rollovers, see ``engine/session/rollover.py``). ``B`` is the camera's mounting: the optical
frame in ``base_frame``. Then

- ``odom`` is ``base_frame`` at the first pose after start or a reset (REP 105: odometry starts
  where the robot starts), so ``T_odom_world = B @ inv(C(0))``;
- ``T_odom_base(t) = T_odom_world @ C(t) @ inv(B)`` is what ``~/pose``, ``~/odometry`` and the
  TF ``odom -> base_frame`` carry.

``B`` comes from ``frames.base_to_camera`` (x y z qx qy qz qw: the camera *body* frame, x
forward, y left, z up, in ``base_frame``; the fixed optical rotation, z forward, x right, y
down, is applied on top of it), or, when tf2_ros is importable, from ``base_frame -> camera
frame`` on ``/tf_static`` if that exists when the first pose is anchored (read once). Either
source must be a plausible mounting (``parameters/mounting.py``: finite, at most 1000 m from the
base, a normalisable quaternion): a bad parameter stops the start, a bad ``/tf_static``
transform is refused with a warning and the mounting in use is kept. The node never broadcasts
the camera frame itself, so an existing camera frame never gets a second parent.

With an IMU (``input.imu_topic``) a :class:`~lingbot_map_ros.engine.imu.leveling.GravityLevel`
is attached (:meth:`OdomFrames.set_level`, the primary camera's frames): when gravity is known
at the anchor, ``T_odom_world = L @ B @ inv(C(0))`` (odom z up, its origin and heading base's
first pose's); otherwise odom is anchored as above and :meth:`OdomFrames.map_level` becomes the
levelling of ``map -> odom`` once the alignment gives gravity (docs/imu.md, Frames). Without
one nothing here changes.
"""

from __future__ import annotations

from typing import Any, Sequence

from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
import numpy as np

OPTICAL_IN_BODY = np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0],
                            [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
"""Camera optical frame (x right, y down, z forward) in the camera body frame (x forward,
y left, z up): forward = optical z, left = -optical x, up = -optical y."""


class OdomFrames:
    """Anchors ``odom`` at the first pose and maps engine poses to ``base_frame`` poses."""

    def __init__(self, base_to_camera: Sequence[float]) -> None:
        """Mounting from the parameter (``frames.base_to_camera``); see the module docstring."""
        self._set_mount(pose7_to_matrix(base_to_camera) @ OPTICAL_IN_BODY)
        self._mount_from_tf = False
        self._odom_from_world: np.ndarray | None = None
        self._level: Any = None

    @property
    def mount(self) -> np.ndarray:
        """``B``: the camera optical frame in ``base_frame``."""
        return self._mount

    @property
    def anchored(self) -> bool:
        """Return True once the first pose after start or a reset fixed ``odom``."""
        return self._odom_from_world is not None

    def set_mount_from_tf(self, base_from_optical: np.ndarray) -> None:
        """Use a mounting read from ``/tf_static`` (only before the first anchor, once)."""
        self._set_mount(np.asarray(base_from_optical, dtype=np.float64))
        self._mount_from_tf = True

    @property
    def mount_from_tf(self) -> bool:
        """Return True when the mounting came from ``/tf_static``."""
        return self._mount_from_tf

    def _set_mount(self, base_from_optical: np.ndarray) -> None:
        self._mount = base_from_optical
        self._optical_from_base = _inverse(base_from_optical)  # used for every pose

    def clear(self) -> None:
        """Forget the anchor: the next pose starts a new ``odom`` origin."""
        self._odom_from_world = None
        if self._level is not None:
            self._level.clear()

    def base_in_odom(self, c2w: np.ndarray, stamp_ns: int | None = None) -> np.ndarray:
        """``T_odom_base`` for an engine pose; the first call after ``clear`` anchors odom.

        ``stamp_ns`` (the pose's stamp) lets an attached levelling read gravity at the anchor.
        """
        if self._odom_from_world is None:
            level = self._level_at_anchor(stamp_ns)
            if level is not None:
                self._odom_from_world = level @ self._mount @ _inverse(c2w)
                return level  # the anchoring pose: only its tilt
            self._odom_from_world = self._mount @ _inverse(c2w)
            # REP 105: the anchoring pose *is* the origin. Returned exactly, not as the
            # product B @ inv(C) @ C @ inv(B), whose round-off depends on the CPU's BLAS.
            return np.eye(4)
        if self._level is not None:
            self._level.after_anchor(self._odom_from_world)
        return self._odom_from_world @ c2w @ self._optical_from_base

    def set_level(self, level: Any) -> None:
        """Attach the IMU's ``GravityLevel`` (``engine/imu/leveling.py``); None detaches it."""
        self._level = level

    def _level_at_anchor(self, stamp_ns: int | None) -> np.ndarray | None:
        """Return odom's levelling at the anchor, or None (no IMU, or gravity not known)."""
        if self._level is None or stamp_ns is None:
            return None
        return self._level.at_anchor(stamp_ns * 1e-9, self._mount)

    def map_level(self) -> np.ndarray:
        """``map -> odom``'s gravity levelling ([4, 4] rotation; the identity without one)."""
        return np.eye(4) if self._level is None else self._level.map_from_odom()

    @property
    def map_level_version(self) -> int:
        """Return a count that changes whenever :meth:`map_level` does (0 without an IMU)."""
        return 0 if self._level is None else self._level.version

    def odom_from_world(self) -> np.ndarray:
        """``T_odom_world`` (for point clouds); the frame must be anchored."""
        if self._odom_from_world is None:
            raise ValueError('odom is not anchored yet: publish a pose first')
        return self._odom_from_world


def _inverse(t: np.ndarray) -> np.ndarray:
    """Inverse of a rigid transform (the engine normalises rotations)."""
    out = np.eye(4)
    out[:3, :3] = t[:3, :3].T
    out[:3, 3] = -t[:3, :3].T @ t[:3, 3]
    return out


def lookup_mount(buffer: Any, base_frame: str, camera_frame: str) -> np.ndarray | None:
    """``base_frame -> camera_frame`` from a tf2 buffer, or None when it is not there.

    Raises:
        ValueError: the transform is there but not a plausible mounting (:func:`pose7_to_matrix`;
            tf2 refuses NaN but accepts an infinite translation); the message names /tf_static.
    """
    try:
        import rclpy.time
        tf = buffer.lookup_transform(base_frame, camera_frame, rclpy.time.Time())
    except Exception:  # noqa: BLE001 - tf2 raises several types; any means "not known"
        return None
    t, q = tf.transform.translation, tf.transform.rotation
    return pose7_to_matrix([t.x, t.y, t.z, q.x, q.y, q.z, q.w],
                           source=f'/tf_static {base_frame} -> {camera_frame}')
