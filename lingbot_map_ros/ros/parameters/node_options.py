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
"""The node options the worker thread reads per frame, as one typed, immutable value.

The node builds a new :class:`NodeOptions` whenever a parameter changes and hands it to the
session runner (``SessionRunner.set_options``); a frame in progress keeps the one it started
with, so it never sees half of a parameter update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lingbot_map_ros.config import GridConfig, MapConfig


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """Per-frame options of the worker (names as the ROS parameters they come from)."""

    camera_frame: str
    """``frames.camera_frame``: the camera optical frame (depth image, mounting lookup); ''
    uses the image's frame_id."""
    backwards_reset_s: float
    """``input.backwards_reset_s``: a stamp this far back resets the session."""
    forward_jump_s: float
    """``input.forward_jump_s``: a stamp this far ahead waits for the next frame to confirm."""
    resolution_change_frames: int
    """``input.resolution_change_frames``: frames of a new size before the session restarts."""
    path_max_poses: int
    """``publish.path_max_poses``: poses kept in the published path."""
    publish_tf: bool
    """``publish.tf``: broadcast odom -> base frame."""
    publish_depth: bool
    """``publish.depth``: publish the depth image."""
    publish_cloud: bool
    """``publish.cloud``: publish the point cloud."""
    cloud_stride: int
    """``publish.cloud_stride``: pixel stride of the cloud."""
    map_config: MapConfig
    """``map.*``: the accumulated map (``~/map``)."""
    output_directory: str
    """``output.directory``: where ``~/save`` writes."""
    max_poses: int
    """``output.max_poses``: poses kept for ``~/save`` (oldest dropped)."""
    grid_config: GridConfig = GridConfig()
    """``grid.*``: the occupancy grid (``~/grid``)."""

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> NodeOptions:
        """Build from the node's parameter values (``{'publish.tf': True, ...}``)."""
        return cls(camera_frame=str(values['frames.camera_frame']),
                   backwards_reset_s=float(values['input.backwards_reset_s']),
                   forward_jump_s=float(values['input.forward_jump_s']),
                   resolution_change_frames=int(values['input.resolution_change_frames']),
                   path_max_poses=int(values['publish.path_max_poses']),
                   publish_tf=bool(values['publish.tf']),
                   publish_depth=bool(values['publish.depth']),
                   publish_cloud=bool(values['publish.cloud']),
                   cloud_stride=int(values['publish.cloud_stride']),
                   map_config=MapConfig.from_flat(values),
                   output_directory=str(values['output.directory']),
                   max_poses=int(values['output.max_poses']),
                   grid_config=GridConfig.from_flat(values))
