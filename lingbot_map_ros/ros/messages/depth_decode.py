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
"""Depth images (``sensor_msgs/Image``, REP 118) to metres, or a refusal with its drop reason.

Encodings: ``16UC1`` / ``mono16`` in millimetres, ``32FC1`` in metres; 0, NaN, Inf and values
outside the physical range (:func:`~lingbot_map_ros.engine.image.sensor_depth.valid_range`:
1 mm to 1 km, or ``metric.max_range_m``) mean no value. Anything else raises
:class:`DepthConversionError` naming the drop reason (``depth_encoding``, ``depth_size``,
``depth_no_valid_pixels``), which the pairing (``ros/inference/depth_input.py``) counts. Nothing
here imports rclpy: message fields are read by name, as in
:mod:`~lingbot_map_ros.ros.messages.conversions`.
"""

from __future__ import annotations

from typing import Any

from lingbot_map_ros.engine.image.sensor_depth import valid_mask, valid_range
from lingbot_map_ros.ros.messages.image_decode import MAX_PIXELS, MAX_SIDE_PX, message_bytes
import numpy as np

DEPTH_ENCODINGS: dict[str, tuple[str, float]] = {
    '16UC1': ('u2', 1e-3), 'mono16': ('u2', 1e-3), '32FC1': ('f4', 1.0)}
"""Accepted encodings: (numpy type without byte order, metres per unit)."""


class DepthConversionError(ValueError):
    """A depth message that cannot be used; ``reason`` is its drop reason (``Reason`` value)."""

    def __init__(self, reason: str, message: str) -> None:
        """Store the drop reason next to the message."""
        super().__init__(message)
        self.reason = reason


def depth_msg_to_metres(msg: Any, max_range_m: float = 0.0) -> np.ndarray:
    """Convert a ``sensor_msgs/Image`` depth message to metres.

    Args:
        msg: object with ``height``, ``width``, ``encoding``, ``is_bigendian``, ``step``,
            ``data``.
        max_range_m: ``metric.max_range_m`` (0: only the physical range).

    Returns:
        ``[H, W]`` float32 metres (0, NaN, Inf or out of range where the sensor has no value).

    Raises:
        DepthConversionError: unsupported encoding, empty, huge or inconsistent size, step or
            data length, or no valid pixel at all (every pixel 0, NaN, Inf or out of range).
    """
    encoding = str(msg.encoding)
    if encoding not in DEPTH_ENCODINGS:
        raise DepthConversionError('depth_encoding', f"depth encoding '{encoding}' is not one "
                                   f"of {', '.join(DEPTH_ENCODINGS)} (REP 118)")
    kind, unit = DEPTH_ENCODINGS[encoding]
    dtype = np.dtype(('>' if msg.is_bigendian else '<') + kind)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if not (0 < height <= MAX_SIDE_PX and 0 < width <= MAX_SIDE_PX
            and height * width <= MAX_PIXELS):
        raise DepthConversionError('depth_size', f'depth image size {width}x{height} is empty '
                                   'or too large')
    if step < width * dtype.itemsize or step % dtype.itemsize:
        raise DepthConversionError('depth_size', f'step {step} does not fit width {width} of '
                                   f"'{encoding}'")
    buf = message_bytes(msg.data)
    if buf.size < step * height:
        raise DepthConversionError('depth_size', f'data has {buf.size} bytes, step {step} x '
                                   f'height {height} needs {step * height}')
    rows = buf[:step * height].reshape(height, step)[:, :width * dtype.itemsize]
    values = np.ascontiguousarray(rows).view(dtype).reshape(height, width)
    metres = values.astype(np.float32)
    if unit != 1.0:
        metres *= np.float32(unit)
    if not np.any(valid_mask(metres, max_range_m)):
        low, high = valid_range(max_range_m)
        raise DepthConversionError('depth_no_valid_pixels', 'every depth pixel is 0, NaN, Inf '
                                   f'or outside [{low:g}, {high:g}] m')
    return metres
