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
"""Pure conversions between ROS message fields and numpy arrays or poses.

Nothing here imports ``rclpy`` or a ``*_msgs`` package: every function reads message fields by name
(duck typing), so the same code serves messages received by the node (``array.array`` data) and
messages deserialised from a bag by ``rosbags`` (``numpy`` data). Image decoding lives in
:mod:`~lingbot_map_ros.ros.messages.image_decode` (its names are re-exported here); the node
prefers ``cv_bridge`` for raw images when it is installed, the replay tool always uses ours.

Poses: a 4x4 transform of a child frame in its parent frame (the node publishes ``base_frame``
in ``odom_frame``; the replay the camera optical frame in its world); quaternions are
``(x, y, z, w)`` as in ``geometry_msgs/Quaternion``.
"""

from __future__ import annotations

from typing import Any

import cv2
from lingbot_map_ros.engine.image.geometry import rotation_to_quaternion
from lingbot_map_ros.ros.messages.image_decode import (  # noqa: F401 - re-exported for callers
    check_image_msg, compressed_msg_to_rgb, DROP_REASONS, image_msg_to_rgb, ImageConversionError,
    MAX_PIXELS, MAX_SIDE_PX, SUPPORTED_ENCODINGS)
import numpy as np


class InvalidStampError(ValueError):
    """A ``builtin_interfaces/Time`` that no clock produces (``nanosec`` outside [0, 1e9))."""


def stamp_to_ns(stamp: Any) -> int:
    """Convert a ``builtin_interfaces/Time`` (fields ``sec``, ``nanosec``) to nanoseconds.

    Args:
        stamp: object with ``sec`` and ``nanosec``.

    Returns:
        Integer nanoseconds since the epoch of the clock that stamped the message.

    Raises:
        InvalidStampError: ``nanosec`` is not in [0, 1e9) (two such stamps could compare in the
            wrong order).
    """
    nanosec = int(stamp.nanosec)
    if not 0 <= nanosec < 1_000_000_000:
        raise InvalidStampError(f'stamp nanosec={nanosec} is not in [0, 1e9)')
    return int(stamp.sec) * 1_000_000_000 + nanosec


def ns_to_sec_nanosec(stamp_ns: int) -> tuple[int, int]:
    """Split nanoseconds into ``(sec, nanosec)`` with ``0 <= nanosec < 1e9``.

    Args:
        stamp_ns: integer nanoseconds.

    Returns:
        ``(sec, nanosec)`` for a ``builtin_interfaces/Time``.
    """
    sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
    return sec, nanosec


def fill_stamp(stamp: Any, stamp_ns: int) -> Any:
    """Write nanoseconds into a ``builtin_interfaces/Time``-like object in place.

    Args:
        stamp: object with writable ``sec`` and ``nanosec``.
        stamp_ns: integer nanoseconds.

    Returns:
        ``stamp``, for chaining.
    """
    stamp.sec, stamp.nanosec = ns_to_sec_nanosec(stamp_ns)
    return stamp


def c2w_to_pose(
        c2w: np.ndarray) -> tuple[tuple[float, float, float], tuple[float, float, float, float]]:
    """Split a child-to-parent transform into a position and an ``(x, y, z, w)`` quaternion.

    Args:
        c2w: [4, 4] transform of the child frame in its parent frame.

    Returns:
        ``((x, y, z), (qx, qy, qz, qw))`` as plain floats.

    Raises:
        ValueError: wrong shape or non-finite values (the node resets the session on this).
    """
    m = np.asarray(c2w, dtype=np.float64)
    if m.shape != (4, 4):
        raise ValueError(f'c2w must be 4x4, got shape {m.shape}')
    if not np.all(np.isfinite(m)):
        raise ValueError('c2w has non-finite values')
    position = (float(m[0, 3]), float(m[1, 3]), float(m[2, 3]))
    q = rotation_to_quaternion(m[:3, :3])
    return position, (float(q[0]), float(q[1]), float(q[2]), float(q[3]))


def camera_info_k(msg: Any) -> np.ndarray:
    """Read the 3x3 intrinsic matrix of a ``sensor_msgs/CameraInfo``.

    Args:
        msg: object with ``k`` (9 floats, row-major).

    Returns:
        [3, 3] float64 matrix.

    Raises:
        ValueError: ``k`` does not hold 9 values.
    """
    k = np.asarray(msg.k, dtype=np.float64).reshape(-1)
    if k.size != 9:
        raise ValueError(f'camera_info.k has {k.size} values, expected 9')
    return k.reshape(3, 3)


def map_axes_transform(map_axes: str) -> np.ndarray:
    """4x4 transform from the engine's world (first camera, optical axes) to ``map_frame``.

    Args:
        map_axes: 'optical' (identity) or 'flu' (x forward, y left, z up; REP 103).

    Returns:
        [4, 4] float64 rotation-only transform.

    Raises:
        ValueError: unknown name.
    """
    if map_axes == 'optical':
        return np.eye(4)
    if map_axes == 'flu':
        # forward = optical z, left = -optical x, up = -optical y.
        return np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0],
                         [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    raise ValueError(f"frames.map_axes='{map_axes}' is not one of 'flu', 'optical'")


def twist_between(c2w_prev: np.ndarray, c2w: np.ndarray,
                  dt_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Finite-difference velocity of a camera, in the camera frame (as ``Odometry.twist``).

    Args:
        c2w_prev: [4, 4] previous camera-to-map transform.
        c2w: [4, 4] current camera-to-map transform.
        dt_s: time between the two, in seconds (> 0).

    Returns:
        ``(linear [3], angular [3])`` in map units per second and radians per second.

    Raises:
        ValueError: ``dt_s`` not positive.
    """
    if dt_s <= 0:
        raise ValueError(f'dt_s must be > 0, got {dt_s}')
    delta = np.linalg.inv(np.asarray(c2w_prev, np.float64)) @ np.asarray(c2w, np.float64)
    rvec, _ = cv2.Rodrigues(delta[:3, :3])
    return delta[:3, 3] / dt_s, rvec.reshape(3) / dt_s


def xyz_rgb_cloud(points: np.ndarray, rgb: np.ndarray | None, stride: int,
                  valid: np.ndarray | None = None) -> tuple[int, bytes]:
    """Pack a decimated organised point set as PointCloud2 ``x y z rgb`` float32 records.

    ``rgb`` is packed the PCL way: 0x00RRGGBB stored in the bytes of a float32 field.

    Args:
        points: [H, W, 3] points.
        rgb: [H, W, 3] uint8 colours, or None for white.
        stride: keep every ``stride``-th row and column.
        valid: [H, W] bool mask of points to keep (non-finite points are always removed).

    Returns:
        ``(number of points, little-endian data of 16 bytes per point)``.
    """
    pts = np.asarray(points, np.float32)[::stride, ::stride].reshape(-1, 3)
    keep = np.all(np.isfinite(pts), axis=1)
    if valid is not None:
        keep &= np.asarray(valid, bool)[::stride, ::stride].reshape(-1)
    if rgb is None:
        colors = np.full((pts.shape[0], 3), 255, np.uint32)
    else:
        colors = np.asarray(rgb)[::stride, ::stride].reshape(-1, 3).astype(np.uint32)
    packed = (colors[:, 0] << 16) | (colors[:, 1] << 8) | colors[:, 2]
    record = np.empty(int(keep.sum()), dtype=[('x', '<f4'), ('y', '<f4'), ('z', '<f4'),
                                              ('rgb', '<u4')])
    record['x'], record['y'], record['z'] = pts[keep, 0], pts[keep, 1], pts[keep, 2]
    record['rgb'] = packed[keep]
    return record.shape[0], record.tobytes()
