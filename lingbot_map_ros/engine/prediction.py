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
"""What the streaming session returns for each frame.

Conventions (see ``geometry.py``): ``c2w`` maps camera coordinates to world coordinates, camera
axes are OpenCV / ROS optical (x right, y down, z forward), the world frame is nominally the first
frame's camera, and translation and depth share one scale fixed by the scale frames (metres
when a depth camera sets it: ``engine/metric_session.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .frames import Role

__all__ = ['FramePrediction', 'Role']


@dataclass(frozen=True, slots=True)
class FramePrediction:
    """Per-frame output of :class:`lingbot_map_ros.engine.pipeline.StreamingSession`."""

    frame_index: int
    """0-based index of the frame since the last reset."""
    stamp_ns: int
    """The caller's timestamp for this frame, passed through unchanged."""
    role: Role
    """'scale' (first N_s frames, run together), 'keyframe' (cached) or 'non-keyframe'."""
    time_index: int
    """3-D RoPE time index the frame used (number of keyframes cached before it)."""
    pose_enc: np.ndarray
    """[9] float64: translation(3), quaternion xyzw(4), fov_h, fov_w (radians)."""
    c2w: np.ndarray
    """[4, 4] float64 camera-to-world transform (rotation normalised). Behind a
    :class:`~lingbot_map_ros.engine.rollover.RolloverSession` this is the continuous pose,
    stitched across rollovers; ``session_c2w`` keeps the session's own."""
    intrinsics: np.ndarray
    """[3, 3] float64 pinhole matrix for the processed image (``image_size_hw``)."""
    intrinsics_original: np.ndarray
    """[3, 3] float64 pinhole matrix for the original input image (``original_size_hw``)."""
    image_size_hw: tuple[int, int]
    """(H, W) of the processed image the network saw."""
    original_size_hw: tuple[int, int]
    """(H, W) of the input image."""
    depth: np.ndarray | None = None
    """[H, W] float32 depth along z for the processed image, or None: model units, metres
    behind a metric :class:`~lingbot_map_ros.engine.rollover.RolloverSession`."""
    depth_conf: np.ndarray | None = None
    """[H, W] float32 confidence (>= 1), or None."""
    image: np.ndarray | None = None
    """[H, W, 3] uint8 processed RGB image (for colouring point clouds), or None."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Wall-clock milliseconds per stage ('preprocess', 'model', 'total', ...)."""
    session: int = 0
    """Engine session that made the prediction (counts rollovers and resets)."""
    session_c2w: np.ndarray | None = None
    """[4, 4] pose in the session's own frame, before stitching; None when not stitched."""

    @property
    def is_keyframe(self) -> bool:
        """Return True for frames whose K/V stay in the cache (scale frames and keyframes)."""
        return self.role != 'non-keyframe'
