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
"""A depth camera's image, taken to the processed image's pixels (metric scale).

The sensor depth is aligned to the colour image (same size, same pixels: a RealSense's
``aligned_depth_to_color``). The colour image is resized and cropped by
:mod:`~lingbot_map_ros.engine.image.preprocess`; :func:`to_processed` applies the same geometry to
the depth with nearest neighbour, so no value is ever interpolated across a depth edge: the
processed pixel ``(u, v)`` takes the input pixel nearest to where
:class:`~lingbot_map_ros.engine.image.preprocess.PreprocessInfo` says it sits,
``(floor((u + 0.5) / scale_x), floor((v + crop_top + 0.5) / scale_y))``.

**Physical range.** A depth camera measures between a few millimetres and a few hundred metres;
a value outside [:data:`MIN_DEPTH_M`, :data:`MAX_DEPTH_M`] (or beyond ``metric.max_range_m``
when that is set) is no measurement, and its pixel is invalid, like 0, NaN and Inf. So a
sensor that sends 1e9 m or 1e-40 m gives no metric scale (``degenerate``) instead of poses
scaled by it.
"""

from __future__ import annotations

from lingbot_map_ros.engine.errors import InvalidFrameError
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
import numpy as np

MIN_DEPTH_M = 1e-3
"""Smallest sensor depth taken as a measurement (1 mm: one unit of a 16UC1 image)."""
MAX_DEPTH_M = 1000.0
"""Largest sensor depth taken as a measurement (also the largest ``metric.max_range_m``)."""


def valid_range(max_range_m: float = 0.0) -> tuple[float, float]:
    """Return the [low, high] metres of a valid sensor depth (``max_range_m`` 0: no own limit)."""
    high = MAX_DEPTH_M if not max_range_m > 0 else min(MAX_DEPTH_M, float(max_range_m))
    return MIN_DEPTH_M, high


def valid_mask(depth_m: np.ndarray, max_range_m: float = 0.0) -> np.ndarray:
    """Return where ``depth_m`` is a measurement: finite and inside :func:`valid_range`."""
    low, high = valid_range(max_range_m)
    with np.errstate(invalid='ignore'):
        return (depth_m >= low) & (depth_m <= high)  # NaN fails both, Inf the second


def to_processed(depth_m: np.ndarray, info: PreprocessInfo, max_range_m: float = 0.0
                 ) -> np.ndarray:
    """Resize and crop a sensor depth map as the colour image it belongs to was.

    Args:
        depth_m: ``[H0, W0]`` depth in metres (0 or NaN where the sensor has none), the size
            of the colour input image (``info.original_size_hw``).
        info: how that colour image was processed.
        max_range_m: ``metric.max_range_m`` (0: only the physical range).

    Returns:
        ``[H, W]`` float32 metres at the processed pixels (``info.image_size_hw``); invalid
        values (NaN, Inf, outside :func:`valid_range`) are 0.

    Raises:
        InvalidFrameError: the depth is not 2-D or not the colour image's size.
    """
    depth = np.asarray(depth_m)
    if depth.ndim != 2 or depth.shape != tuple(info.original_size_hw):
        raise InvalidFrameError(f'depth image of shape {depth.shape} does not match the colour '
                                f'image {tuple(info.original_size_hw)} (H, W): it must be '
                                'aligned to it')
    height0, width0 = info.original_size_hw
    height, width = info.image_size_hw
    cols = np.minimum(((np.arange(width) + 0.5) / info.scale_x).astype(np.int64), width0 - 1)
    rows = np.minimum(((np.arange(height) + info.crop_top + 0.5) / info.scale_y)
                      .astype(np.int64), height0 - 1)
    out = depth[rows[:, None], cols[None, :]].astype(np.float32)
    out[~valid_mask(out, max_range_m)] = 0.0
    return out
