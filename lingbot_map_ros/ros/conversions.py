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
messages deserialised from a bag by ``rosbags`` (``numpy`` data). The node prefers ``cv_bridge``
for raw images when it is installed and falls back to :func:`image_msg_to_rgb`; the replay tool
always uses these functions.

Images come out as ``[H, W, 3]`` uint8 RGB, C-contiguous and writable (never a view into the
message buffer). 16-bit inputs are scaled to 8 bit by a fixed ``>> 8`` (no per-frame
normalisation, so brightness does not flicker between frames).

Poses: ``c2w`` is the 4x4 transform of the camera optical frame (x right, y down, z forward) in
the map frame; quaternions are ``(x, y, z, w)`` as in ``geometry_msgs/Quaternion``.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

# Largest accepted side, in pixels; larger headers are corrupt or not a camera.
MAX_SIDE_PX = 16384

# encoding -> (channels, bytes per channel, cv2 colour code to RGB or None when already RGB).
# 8UC3 / 8UC4 follow OpenCV's BGR(A) order, as cv_bridge does.
_RAW_ENCODINGS: dict[str, tuple[int, int, int | None]] = {
    'rgb8': (3, 1, None),
    'bgr8': (3, 1, cv2.COLOR_BGR2RGB),
    'rgba8': (4, 1, cv2.COLOR_RGBA2RGB),
    'bgra8': (4, 1, cv2.COLOR_BGRA2RGB),
    'mono8': (1, 1, cv2.COLOR_GRAY2RGB),
    '8UC1': (1, 1, cv2.COLOR_GRAY2RGB),
    '8UC3': (3, 1, cv2.COLOR_BGR2RGB),
    '8UC4': (4, 1, cv2.COLOR_BGRA2RGB),
    'mono16': (1, 2, cv2.COLOR_GRAY2RGB),
    '16UC1': (1, 2, cv2.COLOR_GRAY2RGB),
    'rgb16': (3, 2, None),
    'bgr16': (3, 2, cv2.COLOR_BGR2RGB),
    # Packed 4:2:2, two bytes per pixel. ROS 'yuv422' is UYVY byte order.
    'yuv422': (2, 1, cv2.COLOR_YUV2RGB_UYVY),
    'uyvy': (2, 1, cv2.COLOR_YUV2RGB_UYVY),
    'yuv422_yuy2': (2, 1, cv2.COLOR_YUV2RGB_YUYV),
    'yuyv': (2, 1, cv2.COLOR_YUV2RGB_YUYV),
    # OpenCV names Bayer patterns by the 2x2 block starting at pixel (1, 1), hence the shift.
    'bayer_rggb8': (1, 1, cv2.COLOR_BayerBG2RGB),
    'bayer_bggr8': (1, 1, cv2.COLOR_BayerRG2RGB),
    'bayer_gbrg8': (1, 1, cv2.COLOR_BayerGR2RGB),
    'bayer_grbg8': (1, 1, cv2.COLOR_BayerGB2RGB),
}

SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(sorted(_RAW_ENCODINGS))
"""Raw ``sensor_msgs/Image`` encodings :func:`image_msg_to_rgb` accepts."""

DROP_REASONS: tuple[str, ...] = ('encoding', 'size', 'step', 'truncated', 'decode')
"""Every ``ImageConversionError.reason`` value (drop-counter keys)."""

_JPEG_SOI = b'\xff\xd8'
_JPEG_EOI = b'\xff\xd9'
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_PNG_IEND = b'IEND'


class ImageConversionError(ValueError):
    """An image message that cannot be turned into an RGB array.

    Attributes:
        reason: short drop-counter key, one of :data:`DROP_REASONS`.
    """

    def __init__(self, reason: str, message: str) -> None:
        """Store the reason code next to the human-readable message.

        Args:
            reason: one of :data:`DROP_REASONS`.
            message: what was wrong, naming the offending field and value.
        """
        super().__init__(message)
        self.reason = reason


def _as_bytes(data: Any) -> np.ndarray:
    """View message data (bytes, array.array, numpy, list of ints) as a flat uint8 array."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8) if data.dtype.itemsize == 1 else \
            np.frombuffer(data.tobytes(), np.uint8)
    try:
        return np.frombuffer(memoryview(data).cast('B'), np.uint8)
    except TypeError:
        # A plain list of ints (hand-built messages); slow but correct.
        return np.asarray(data, dtype=np.uint8).reshape(-1)


def _check_size(height: int, width: int) -> None:
    if height <= 0 or width <= 0:
        raise ImageConversionError('size', f'image size {width}x{height} is empty')
    if height > MAX_SIDE_PX or width > MAX_SIDE_PX:
        raise ImageConversionError(
            'size', f'image size {width}x{height} exceeds {MAX_SIDE_PX} px per side')


def check_image_msg(msg: Any) -> np.ndarray:
    """Check a ``sensor_msgs/Image``'s encoding, size, step and data length; return its bytes.

    The node runs this before any converter (cv_bridge or ours), so the same frames are accepted
    and dropped for the same reasons whichever converter is installed.

    Args:
        msg: object with ``height``, ``width``, ``encoding``, ``step``, ``data``.

    Returns:
        The message data as a flat uint8 array (a view, no copy).

    Raises:
        ImageConversionError: see :func:`image_msg_to_rgb`.
    """
    encoding = str(msg.encoding)
    spec = _RAW_ENCODINGS.get(encoding)
    if spec is None:
        raise ImageConversionError(
            'encoding', f"unsupported encoding '{encoding}' (supported: "
            f"{', '.join(SUPPORTED_ENCODINGS)})")
    channels, depth_bytes, _ = spec
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    _check_size(height, width)
    if channels == 2 and width % 2:
        raise ImageConversionError('size', f"'{encoding}' needs an even width, got {width}")
    row_bytes = width * channels * depth_bytes
    if step < row_bytes or step % depth_bytes:
        raise ImageConversionError(
            'step', f"step {step} does not fit width {width} of '{encoding}' "
            f'(needs >= {row_bytes} and a multiple of {depth_bytes})')
    buf = _as_bytes(msg.data)
    if buf.size < step * height:
        raise ImageConversionError(
            'truncated', f'data has {buf.size} bytes, step {step} x height {height} '
            f'needs {step * height}')
    return buf


def image_msg_to_rgb(msg: Any) -> np.ndarray:
    """Convert a ``sensor_msgs/Image`` to RGB.

    Honours row padding (``step`` > ``width * bytes per pixel``) and ``is_bigendian`` for 16-bit
    encodings. Bytes past ``step * height`` are ignored.

    Args:
        msg: object with ``height``, ``width``, ``encoding``, ``is_bigendian``, ``step``, ``data``.

    Returns:
        [H, W, 3] uint8 RGB array (a new, writable buffer).

    Raises:
        ImageConversionError: unsupported encoding ('encoding'), empty or huge size ('size'),
            inconsistent step ('step'), or too little data ('truncated').
    """
    buf = check_image_msg(msg)
    channels, depth_bytes, code = _RAW_ENCODINGS[str(msg.encoding)]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row_bytes = width * channels * depth_bytes
    rows = buf[:step * height].reshape(height, step)[:, :row_bytes]
    if depth_bytes == 2:
        dtype = np.dtype('>u2' if msg.is_bigendian else '<u2')
        pixels = np.ascontiguousarray(rows).view(dtype).reshape(height, width, channels)
        pixels = (pixels >> 8).astype(np.uint8)
    else:
        pixels = rows.reshape(height, width, channels)
    return _to_rgb(np.ascontiguousarray(pixels), code)


def _to_rgb(pixels: np.ndarray, code: int | None) -> np.ndarray:
    """Apply a cv2 colour conversion, returning a new C-contiguous [H, W, 3] uint8 array."""
    if code is None:
        return pixels.copy()
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    return cv2.cvtColor(pixels, code)


def compressed_msg_to_rgb(msg: Any) -> np.ndarray:
    """Convert a ``sensor_msgs/CompressedImage`` (JPEG or PNG) to RGB.

    The payload type is taken from its magic bytes; ``format`` ('jpeg', 'png',
    'rgb8; jpeg compressed bgr8', ...) is only used to refuse payloads that are not plain
    images, such as ``compressedDepth``. A JPEG without its end-of-image marker or a PNG without
    its ``IEND`` chunk counts as truncated (libjpeg would otherwise return a half-grey frame).

    Args:
        msg: object with ``format`` and ``data``.

    Returns:
        [H, W, 3] uint8 RGB array.

    Raises:
        ImageConversionError: unsupported format ('encoding'), empty or cut-off payload
            ('truncated'), undecodable payload ('decode'), or decoded size out of range ('size').
    """
    fmt = str(msg.format).lower()
    if 'compresseddepth' in fmt:
        raise ImageConversionError('encoding', f"format '{msg.format}' is a depth map, not an "
                                   'image; subscribe to the colour stream')
    buf = _as_bytes(msg.data)
    if buf.size == 0:
        raise ImageConversionError('truncated', 'compressed image has no data')
    head = buf[:8].tobytes()
    if head.startswith(_JPEG_SOI):
        # Encoders may pad after EOI; look for it near the end only.
        if _JPEG_EOI not in buf[-64:].tobytes():
            raise ImageConversionError('truncated', f'JPEG of {buf.size} bytes has no '
                                       'end-of-image marker')
    elif head == _PNG_SIGNATURE:
        if _PNG_IEND not in buf[-32:].tobytes():
            raise ImageConversionError('truncated', f'PNG of {buf.size} bytes has no IEND chunk')
    elif fmt and not any(name in fmt for name in ('jpeg', 'jpg', 'png')):
        raise ImageConversionError('encoding', f"unsupported compressed format '{msg.format}' "
                                   '(supported: jpeg, png)')
    decoded = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if decoded is None or decoded.size == 0:
        raise ImageConversionError('decode', f'cannot decode {buf.size} bytes of '
                                   f"'{msg.format}' data")
    _check_size(decoded.shape[0], decoded.shape[1])
    return _decoded_to_rgb(decoded)


def _decoded_to_rgb(decoded: np.ndarray) -> np.ndarray:
    """Turn a cv2.imdecode result (gray, BGR or BGRA; 8 or 16 bit) into [H, W, 3] uint8 RGB."""
    if decoded.dtype == np.uint16:
        decoded = (decoded >> 8).astype(np.uint8)
    elif decoded.dtype != np.uint8:
        raise ImageConversionError('encoding', f'decoded image has dtype {decoded.dtype}')
    if decoded.ndim == 2:
        return cv2.cvtColor(decoded, cv2.COLOR_GRAY2RGB)
    codes = {1: cv2.COLOR_GRAY2RGB, 3: cv2.COLOR_BGR2RGB, 4: cv2.COLOR_BGRA2RGB}
    if decoded.shape[2] not in codes:
        raise ImageConversionError('encoding', f'decoded image has {decoded.shape[2]} channels')
    return cv2.cvtColor(decoded, codes[decoded.shape[2]])


def stamp_to_ns(stamp: Any) -> int:
    """Convert a ``builtin_interfaces/Time`` (fields ``sec``, ``nanosec``) to nanoseconds.

    Args:
        stamp: object with ``sec`` and ``nanosec``.

    Returns:
        Integer nanoseconds since the epoch of the clock that stamped the message.
    """
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


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


def rotation_to_quaternion(rotation: np.ndarray) -> tuple[float, float, float, float]:
    """Convert a 3x3 rotation matrix to a unit quaternion ``(x, y, z, w)`` with ``w >= 0``.

    Uses the largest-diagonal branch (Shepperd's method) so it stays accurate near 180 degrees.

    Args:
        rotation: [3, 3] rotation matrix (small non-orthogonality is tolerated).

    Returns:
        ``(x, y, z, w)``, normalised.

    Raises:
        ValueError: wrong shape or non-finite values.
    """
    r = np.asarray(rotation, dtype=np.float64)
    if r.shape != (3, 3) or not np.all(np.isfinite(r)):
        raise ValueError(f'rotation must be a finite 3x3 matrix, got shape {r.shape}')
    trace = r[0, 0] + r[1, 1] + r[2, 2]
    i = int(np.argmax([r[0, 0], r[1, 1], r[2, 2], trace]))
    if i == 3:
        w = 0.5 * np.sqrt(max(1.0 + trace, 0.0))
        s = 0.25 / w
        q = [(r[2, 1] - r[1, 2]) * s, (r[0, 2] - r[2, 0]) * s, (r[1, 0] - r[0, 1]) * s, w]
    else:
        j, k = (i + 1) % 3, (i + 2) % 3
        v = 0.5 * np.sqrt(max(1.0 + r[i, i] - r[j, j] - r[k, k], 0.0))
        s = 0.25 / v
        q = [0.0, 0.0, 0.0, (r[k, j] - r[j, k]) * s]
        q[i], q[j], q[k] = v, (r[j, i] + r[i, j]) * s, (r[k, i] + r[i, k]) * s
    qa = np.asarray(q)
    qa /= np.linalg.norm(qa)
    if qa[3] < 0:
        qa = -qa
    return float(qa[0]), float(qa[1]), float(qa[2]), float(qa[3])


def c2w_to_pose(
        c2w: np.ndarray) -> tuple[tuple[float, float, float], tuple[float, float, float, float]]:
    """Split a camera-to-map transform into a position and an ``(x, y, z, w)`` quaternion.

    Args:
        c2w: [4, 4] transform of the camera optical frame in the map frame.

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
    return position, rotation_to_quaternion(m[:3, :3])


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
