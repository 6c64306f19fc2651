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
"""

from __future__ import annotations

from lingbot_map_ros.engine.errors import InvalidFrameError
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
import numpy as np


def to_processed(depth_m: np.ndarray, info: PreprocessInfo) -> np.ndarray:
    """Resize and crop a sensor depth map as the colour image it belongs to was.

    Args:
        depth_m: ``[H0, W0]`` depth in metres (0 or NaN where the sensor has none), the size
            of the colour input image (``info.original_size_hw``).
        info: how that colour image was processed.

    Returns:
        ``[H, W]`` float32 metres at the processed pixels (``info.image_size_hw``); invalid
        values (NaN, Inf, <= 0) are 0.

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
    out[~(out > 0) | ~np.isfinite(out)] = 0.0
    return out
