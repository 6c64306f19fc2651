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
"""Image messages to RGB arrays: raw ``sensor_msgs/Image`` and JPEG/PNG ``CompressedImage``.

Nothing here imports ``rclpy`` or a ``*_msgs`` package: message fields are read by name, so the
node's messages (``array.array`` data) and ``rosbags`` messages (``numpy`` data) both work.
Images come out as ``[H, W, 3]`` uint8 RGB, C-contiguous and writable (never a view into the
message buffer). 16-bit inputs are scaled to 8 bit by a fixed ``>> 8`` (no per-frame
normalisation, so brightness does not flicker between frames).

Input limits (see docs/robustness.md): at most :data:`MAX_SIDE_PX` per side and
:data:`MAX_PIXELS` pixels. A compressed payload is checked before it is decoded: its header gives
the size and depth (:mod:`~lingbot_map_ros.ros.messages.compressed_header`), it must be the format
that ``format`` names, its container must be intact, and it may not expand more than
:data:`MAX_DECODE_RATIO` times once the decoded image is larger than :data:`RATIO_FREE_BYTES`.
So a decompression bomb or a corrupt payload is refused in about the time it takes to read it,
with no pixel memory allocated. Damage inside JPEG scan data that keeps the structure intact is
caught from libjpeg's own warnings (:mod:`~lingbot_map_ros.ros.messages.jpeg_warnings`).
"""

from __future__ import annotations

from typing import Any

import cv2
from lingbot_map_ros.ros.messages.compressed_header import (CorruptPayload, inspect_compressed,
                                                            sniff_kind)
from lingbot_map_ros.ros.messages.jpeg_warnings import imdecode_jpeg
import numpy as np

# Largest accepted side, in pixels; larger headers are corrupt or not a camera.
MAX_SIDE_PX = 16384
# Largest accepted image, in pixels (8K UHD).
MAX_PIXELS = 7680 * 4320
# Most a compressed payload may expand (decoded bytes / payload bytes) once its decoded image is
# larger than RATIO_FREE_BYTES. PNG's deflate tops out near 1032:1, so this mainly stops crafted
# JPEG/PNG streams; a camera frame of up to 12 MP RGB is never refused by it.
MAX_DECODE_RATIO = 250
RATIO_FREE_BYTES = 36 * 1024 * 1024

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


def message_bytes(data: Any) -> np.ndarray:
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
    if height * width > MAX_PIXELS:
        raise ImageConversionError(
            'size', f'image size {width}x{height} exceeds {MAX_PIXELS} pixels')


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
    buf = message_bytes(msg.data)
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

    The payload type comes from its magic bytes and must agree with ``format`` ('jpeg', 'png',
    'rgb8; jpeg compressed bgr8', ...) when ``format`` names one; ``compressedDepth`` is refused.
    Size, depth and structure are checked before decoding (module docstring).

    Args:
        msg: object with ``format`` and ``data``.

    Returns:
        [H, W, 3] uint8 RGB array.

    Raises:
        ImageConversionError: unsupported or mislabelled format ('encoding'), empty or cut-off
            payload ('truncated'), damaged payload ('decode'), or an image over the limits
            ('size').
    """
    fmt = str(msg.format).lower()
    if 'compresseddepth' in fmt:
        raise ImageConversionError('encoding', f"format '{msg.format}' is a depth map, not an "
                                   'image; subscribe to the colour stream')
    buf = message_bytes(msg.data)
    if buf.size == 0:
        raise ImageConversionError('truncated', 'compressed image has no data')
    _check_format(fmt, str(msg.format), sniff_kind(buf[:8].tobytes()))
    raw = buf.tobytes()
    try:
        header = inspect_compressed(raw, header_only=True)
        _check_size(header.height, header.width)
        if header.decoded_bytes > RATIO_FREE_BYTES and \
                header.decoded_bytes > MAX_DECODE_RATIO * buf.size:
            raise ImageConversionError(
                'size', f'{header.kind} of {buf.size} bytes would decode to '
                f'{header.decoded_bytes} bytes (over {MAX_DECODE_RATIO}:1): refused as a '
                'decompression bomb')
        inspect_compressed(raw)  # the whole structure, once the size is known to be sane
    except CorruptPayload as exc:
        raise ImageConversionError(exc.reason, str(exc)) from None
    # 8-bit RGB straight from the decoder: no 16-bit or BGR intermediate copy.
    if header.kind == 'jpeg':
        decoded, warnings = imdecode_jpeg(buf, cv2.IMREAD_COLOR_RGB)
        if warnings:
            raise ImageConversionError('decode', f'JPEG of {buf.size} bytes is damaged: '
                                       f'{"; ".join(warnings)}')
    else:
        decoded = cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB)
    if decoded is None or decoded.shape[:2] != (header.height, header.width):
        raise ImageConversionError('decode', f'cannot decode {buf.size} bytes of '
                                   f"'{msg.format}' data")
    return decoded


def _check_format(fmt: str, original: str, kind: str | None) -> None:
    """Refuse a payload that is not JPEG/PNG or not the format that ``format`` names."""
    named = [name for name, words in (('jpeg', ('jpeg', 'jpg')), ('png', ('png',)))
             if any(word in fmt for word in words)]
    if fmt and not named:
        raise ImageConversionError('encoding', f"unsupported compressed format '{original}' "
                                   '(supported: jpeg, png)')
    if kind is None:
        what = f"'{original}'" if original else 'with an empty format string'
        raise ImageConversionError('decode', f'payload labelled {what} is neither JPEG nor PNG')
    if named and kind not in named:
        raise ImageConversionError('encoding', f"format '{original}' says {named[0]} but the "
                                   f'payload is {kind}')
