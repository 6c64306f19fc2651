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
"""The IMU's mounting on the camera: ``imu_from_camera`` from ``/tf_static`` or the parameter.

``imu_from_camera`` maps camera-optical-frame points into the IMU frame (metres). It starts as
``imu.imu_from_camera`` (x y z qx qy qz qw; the identity by default). When tf2_ros is importable
the node also listens to ``/tf_static`` and, as soon as both frames are known -- the IMU's (its
readings' ``header.frame_id``, or ``imu.frame_id``) and the camera's optical frame
(``frames.camera_frame``, or the colour images' ``header.frame_id``) -- looks the transform
``imu frame <- camera frame`` up, once, as the camera's own mounting is read
(``publishers/odom_frames.py``, :func:`~lingbot_map_ros.ros.publishers.odom_frames.lookup_mount`).

A transform found there is taken only when it is plausible for an IMU beside the camera: seven
finite numbers (:func:`~lingbot_map_ros.ros.parameters.mounting.pose7_to_matrix`), the IMU at
most :data:`MAX_IMU_OFFSET_M` from the camera and a unit quaternion (norm within
:data:`QUAT_NORM_TOLERANCE` of 1: tf2 stores what it was sent). Garbage is refused with one WARN
and the parameter is kept; the lookup is not tried again. The mounting in use is one array,
updated in place, so the scale tracker that holds it aligns every later window with the new
mounting. Its source (``tf`` or ``parameter``) is the ``mounting`` key of the ``imu`` status.
"""

from __future__ import annotations

from typing import Any, Callable

from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
import numpy as np

MAX_IMU_OFFSET_M = 2.0
"""Largest accepted distance of the IMU from the camera's optical centre (metres): an IMU that
gives the camera its scale is rigidly mounted beside it; farther is a wrong frame pair."""
QUAT_NORM_TOLERANCE = 0.01
"""A /tf_static rotation whose quaternion norm is farther than this from 1 is refused."""


def lookup_imu_from_camera(buffer: Any, imu_frame: str, camera_frame: str
                           ) -> np.ndarray | None:
    """Return ``imu_frame <- camera_frame`` from a tf2 buffer, or None when it is not there.

    Args:
        buffer: a tf2 ``Buffer`` (or anything with its ``lookup_transform``).
        imu_frame: the IMU readings' frame.
        camera_frame: the camera's optical frame.

    Raises:
        ValueError: the transform is there but not a plausible IMU mounting (module
            docstring); the message names the /tf_static frames.
    """
    try:
        import rclpy.time
        tf = buffer.lookup_transform(imu_frame, camera_frame, rclpy.time.Time())
    except Exception:  # noqa: BLE001 - tf2 raises several types; any means "not known"
        return None
    source = f'/tf_static {imu_frame} -> {camera_frame}'
    t, q = tf.transform.translation, tf.transform.rotation
    values = [t.x, t.y, t.z, q.x, q.y, q.z, q.w]
    matrix = pose7_to_matrix(values, source=source)
    distance = float(np.linalg.norm(matrix[:3, 3]))
    if distance > MAX_IMU_OFFSET_M:
        raise ValueError(f'{source}: the IMU is {distance:.4g} m from the camera (more than '
                         f'{MAX_IMU_OFFSET_M:g} m): not an IMU mounted beside it')
    norm = float(np.linalg.norm(values[3:]))
    if abs(norm - 1.0) > QUAT_NORM_TOLERANCE:
        raise ValueError(f'{source}: the quaternion has norm {norm:.6g}, not a unit rotation')
    return matrix


def static_tf_buffer(node: Any) -> tuple[Any, Any] | None:
    """Return ``(buffer, listener)`` of ``/tf_static`` on ``node``; None without tf2_ros."""
    try:  # tf2_ros comes with a ROS install, not with the PyPI wheels.
        from tf2_ros import Buffer, TransformListener
    except ImportError:
        return None
    buffer = Buffer()
    try:  # only /tf_static where tf2_ros offers it: the mounting is static
        listener = TransformListener(buffer, node, spin_thread=False, static_only=True)
    except TypeError:  # pragma: no cover - older tf2_ros
        listener = TransformListener(buffer, node, spin_thread=False)
    return buffer, listener


class ImuMounting:
    """The mounting in use and where it came from (module docstring)."""

    def __init__(self, parameter: np.ndarray, buffer: Any = None) -> None:
        """Start with the parameter's mounting.

        Args:
            parameter: [4, 4] ``imu_from_camera`` of ``imu.imu_from_camera``.
            buffer: a tf2 buffer holding ``/tf_static`` (None: tf2_ros is not importable,
                the parameter stays).
        """
        self.matrix = np.array(parameter, dtype=np.float64)
        """``imu_from_camera`` in use; updated in place when /tf_static gives it."""
        self.source = 'parameter'
        """'parameter' or 'tf'."""
        self._buffer = buffer
        self._done = buffer is None

    @property
    def tf_available(self) -> bool:
        """Return True when a tf2 buffer is there to read the mounting from."""
        return self._buffer is not None

    def use_tf_buffer(self, buffer: Any) -> None:
        """Read the mounting from ``buffer`` (a tf2 ``Buffer`` or one like it) from now on."""
        self._buffer = buffer
        self._done = buffer is None or self.source == 'tf'

    def update(self, imu_frame: str, camera_frame: str, warn: Callable[[str], None],
               info: Callable[[str], None]) -> bool:
        """Try ``/tf_static`` once both frames are known; return True when it was taken.

        A refused transform is logged (``warn``) and ends the tries; one found is logged
        (``info``) and copied into :attr:`matrix`.
        """
        if self._done or not imu_frame or not camera_frame:
            return False
        try:
            found = lookup_imu_from_camera(self._buffer, imu_frame, camera_frame)
        except ValueError as exc:
            self._done = True
            warn(f'IMU mounting refused: {exc}; keeping imu.imu_from_camera')
            return False
        if found is None:
            return False
        self.matrix[...] = found
        self.source = 'tf'
        self._done = True
        info(f'IMU mounting {imu_frame} <- {camera_frame} read from /tf_static; '
             'imu.imu_from_camera is not used')
        return True

    def describe(self) -> str:
        """Return the start line's words on the mounting."""
        mount = pose7_text(self.matrix)
        if self.source == 'tf':
            return f'imu_from_camera [{mount}] from /tf_static'
        if self.tf_available:
            return (f'imu_from_camera [{mount}] from imu.imu_from_camera until /tf_static '
                    'holds the IMU frame -> camera frame')
        return f'imu_from_camera [{mount}] from imu.imu_from_camera (no tf2_ros)'


def pose7_text(matrix: np.ndarray) -> str:
    """Return a [4, 4] rigid transform as 'x y z qx qy qz qw'."""
    quat = np.asarray(geometry.rotation_to_quaternion(np.asarray(matrix)[:3, :3]))
    return ' '.join(f'{v:g}' for v in (*np.asarray(matrix)[:3, 3], *quat))
