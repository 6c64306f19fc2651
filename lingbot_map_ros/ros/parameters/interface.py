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
"""The node's ROS interface as one table: every topic, service and transform, and when.

Both executables' ``--help`` print it (:mod:`~lingbot_map_ros.ros.parameters.cli_help`), and the
tests compare it with the endpoints a running node really has in the ROS graph and with
docs/ros_interface.md, so the three cannot drift apart: a new publisher or service fails those
tests until it has its row here.

Names as the node creates them: relative (``image``: namespace and remaps apply), private
(``~/pose``: under the node's name) or absolute (``/diagnostics``). With several cameras
(``input.cameras``) each camera's input and odometry names gain its name (``<camera>/image``,
``~/<camera>/pose``); docs/cameras.md has them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ['Endpoint', 'ENDPOINTS', 'KINDS', 'TRANSFORMS', 'of_kind']


@dataclass(frozen=True)
class Endpoint:
    """One topic or service of the node."""

    kind: str
    """``'subscribes'``, ``'publishes'`` or ``'service'``."""
    name: str
    """Topic or service name as created (relative, ``~/`` private or absolute)."""
    type: str  # noqa: A003 - the field's name in ROS's own words
    """Message or service type (``sensor_msgs/Image``)."""
    what: str
    """What it carries or does, and when it exists or is used."""


KINDS = ('subscribes', 'publishes', 'service')

ENDPOINTS = (
    Endpoint('subscribes', 'image', 'sensor_msgs/Image',
             'the camera images (input.transport raw)'),
    Endpoint('subscribes', 'image/compressed', 'sensor_msgs/CompressedImage',
             'instead of image with input.transport compressed (JPEG or PNG)'),
    Endpoint('subscribes', 'camera_info', 'sensor_msgs/CameraInfo',
             'optional: only compared with the estimated intrinsics, in the log'),
    Endpoint('subscribes', 'depth', 'sensor_msgs/Image',
             'a depth image aligned to the colour image (16UC1 mm or 32FC1 m), with '
             'metric.source depth'),
    Endpoint('publishes', '~/pose', 'geometry_msgs/PoseStamped',
             'the camera pose of every frame, in frames.odom_frame'),
    Endpoint('publishes', '~/odometry', 'nav_msgs/Odometry', 'the same pose as odometry'),
    Endpoint('publishes', '~/path', 'nav_msgs/Path', 'the trajectory so far'),
    Endpoint('publishes', '~/depth/image', 'sensor_msgs/Image',
             'the predicted depth (32FC1), with publish.depth'),
    Endpoint('publishes', '~/depth/camera_info', 'sensor_msgs/CameraInfo',
             'the intrinsics of ~/depth/image'),
    Endpoint('publishes', '~/cloud', 'sensor_msgs/PointCloud2',
             "each frame's points, with publish.cloud"),
    Endpoint('publishes', '~/map', 'sensor_msgs/PointCloud2',
             'the fused keyframe map (map.enable, with depth on), every map.period_s when it '
             'changed; in frames.map_frame with loop closure, else in frames.odom_frame'),
    Endpoint('publishes', '~/map_pose', 'geometry_msgs/PoseWithCovarianceStamped',
             'the pose in frames.map_frame after loop closure (silent while loop.enable is '
             'false)'),
    Endpoint('publishes', '~/map_path', 'nav_msgs/Path',
             'the optimised keyframe trajectory in frames.map_frame (loop closure)'),
    Endpoint('publishes', '~/loop_closures', 'visualization_msgs/MarkerArray',
             'the accepted loop closures as lines between keyframes (loop closure)'),
    Endpoint('publishes', '~/localized', 'std_msgs/Bool',
             'loop closure: true while poses are published in frames.map_frame (with a loaded '
             'map: once map.localize_matches matches agree); latched, on change'),
    Endpoint('publishes', '~/map_job', 'std_msgs/String',
             'progress of ~/save_map and ~/load_map (running, then done or refused); latched'),
    Endpoint('subscribes', '/initialpose', 'geometry_msgs/PoseWithCovarianceStamped',
             "loop closure with a loaded map: RViz's 2D Pose Estimate seeds a search near the "
             'pose (in frames.map_frame)'),
    Endpoint('publishes', '~/grid', 'nav_msgs/OccupancyGrid',
             'the occupancy grid for nav2 (grid.enable, with ~/map): in frames.map_frame with '
             'loop closure, else frames.odom_frame; latched, every grid.period_s when it changed'),
    Endpoint('publishes', '~/grid_metadata', 'nav_msgs/MapMetaData',
             "~/grid's size, resolution and origin; latched"),
    Endpoint('publishes', '/diagnostics', 'diagnostic_msgs/DiagnosticArray',
             'the node statuses (input, engine, output, cache, loop), every '
             'diagnostics.period_s'),
    Endpoint('service', '~/reset', 'std_srvs/Trigger', 'start a new map (a new session)'),
    Endpoint('service', '~/save', 'std_srvs/Trigger',
             "write the trajectory and ~/map's cloud under output.directory"),
    Endpoint('service', '~/save_map', 'std_srvs/Trigger',
             'write the keyframe map (for reuse) into map.save_path'),
    Endpoint('service', '~/load_map', 'std_srvs/Trigger',
             'load the map of map.load_path (map.mode: mapping or localization)'),
    Endpoint('service', '~/localize_in_map', 'nav_msgs/SetMap',
             'search the loaded map again for the robot (initial_pose a hint when its '
             'header.frame_id is set; the map it carries is ignored)'),
)
"""Every topic and service of one camera's node, all features on."""

TRANSFORMS = (
    ('frames.odom_frame -> frames.base_frame', 'every frame, on /tf (publish.tf; REP 105)'),
    ('frames.map_frame -> frames.odom_frame', "on /tf: the pose graph's correction with loop "
     'closure, else a static identity (publish.map_tf, with frames.map_frame set)'),
    ('frames.base_frame -> camera', 'read from /tf_static when there (the mounting), else '
     'frames.base_to_camera'),
)
"""The transforms the node broadcasts or reads (all need tf2_ros importable)."""


def of_kind(kind: str) -> list[Endpoint]:
    """Return the endpoints of one kind (``'subscribes'``, ``'publishes'``, ``'service'``)."""
    return [e for e in ENDPOINTS if e.kind == kind]


def help_lines() -> list[str]:
    """Return the interface as the ``--help`` section: one line per endpoint and transform."""
    titles = {'subscribes': 'Subscribes (relative names: namespace and remaps apply):',
              'publishes': 'Publishes (private names under the node, stamped with the '
                           "input image's stamp):",
              'service': 'Services:'}
    lines = []
    for kind in KINDS:
        lines.append(titles[kind])
        lines += [f'  {e.name} ({e.type}): {e.what}' for e in of_kind(kind)]
    lines.append('Transforms (/tf, /tf_static):')
    lines += [f'  {frames}: {what}' for frames, what in TRANSFORMS]
    return lines
