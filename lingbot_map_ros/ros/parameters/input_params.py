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
"""Parameters of the inputs, the cameras and the frames (``input.*``, ``frames.*``).

One camera (``input.cameras`` empty, the default) subscribes ``image`` (or
``<image>/compressed``) and ``camera_info``. Several cameras (``input.cameras: [front, left]``)
subscribe ``<name>/image`` and ``<name>/camera_info`` per name, relative to the node's
namespace, and publish each camera's outputs under ``~/<name>/`` (docs/ros_interface.md,
"Several cameras"). A name must be a valid ROS name token (a letter first, then letters, digits
and ``_``), unique, and not one of the node's own output names; ``input.primary_camera`` must
be one of them. Each camera's mounting is ``frames.cameras.<name>.base_to_camera`` (declared per
name, default ``frames.base_to_camera``), unless ``/tf_static`` has it.
"""

from __future__ import annotations

import re
from typing import Any

from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
from lingbot_map_ros.ros.parameters.param_spec import LIVE as _LIVE, ParamSpec, RO as _RO

MAX_CAMERAS = 32
"""Most cameras of one node (each is a stream on the node's page pool)."""
MAX_SYNC_TOLERANCE_S = 1.0
"""Largest ``input.sync_tolerance_s``: frames a second apart are not one instant."""
RESERVED_NAMES = frozenset({'pose', 'odometry', 'path', 'depth', 'cloud', 'map', 'save',
                            'reset', 'image', 'camera_info'})
"""Names of the node's own topics and services: a camera so named would publish over them."""
MAX_NAME_CHARS = 64
"""Longest camera name: it is one token of ``~/<name>/odometry`` and the like, whose full name
(namespace and node name included) ROS caps at a few hundred characters."""
_NAME = re.compile(r'[A-Za-z][A-Za-z0-9_]*')

INPUT_PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec('input.transport', 'raw', "'raw': sensor_msgs/Image on 'image'; 'compressed': "
              "sensor_msgs/CompressedImage on '<image>/compressed' (JPEG or PNG).", _RO,
              choices=('raw', 'compressed')),
    ParamSpec('input.queue_mode', 'live', "'live': keep only the newest frame, drop older ones "
              "(counted as queue_overflow); 'bag': process every frame in order, blocking the "
              'subscription when the queue is full (use reliable QoS with a deep history).', _RO,
              choices=('live', 'bag')),
    ParamSpec('input.queue_size', 64, 'Frames held between the subscription and the worker in '
              'bag mode (live mode holds one).', _RO, int_range=(1, 10000, 0)),
    ParamSpec('input.qos.reliability', 'best_effort', 'Image subscription reliability: '
              "'best_effort' (sensor data, default) or 'reliable'.", _RO,
              choices=('best_effort', 'reliable')),
    ParamSpec('input.qos.depth', 5, 'Image subscription history depth (keep last).', _RO,
              int_range=(1, 10000, 0)),
    ParamSpec('input.backwards_reset_s', 1.0, 'A stamp this many seconds older than the last '
              'one is a clock jump (bag loop, simulator reset) and resets the session; a '
              'smaller step back is a reordered frame and is dropped.', _LIVE,
              float_range=(0.0, 3600.0)),
    ParamSpec('input.forward_jump_s', 0.1, 'A stamp more than this (or 4 frame periods, if '
              'longer) ahead of the last is held back: fed when the next frame comes after it, '
              'else dropped as an outlier; 0 turns the check off.', _LIVE,
              float_range=(0.0, 3600.0)),
    ParamSpec('input.imu_topic', '', 'sensor_msgs/Imu topic of an IMU beside the camera '
              '(sensor-data QoS): gravity and metric scale from the colour camera, the imu.* '
              'settings (docs/imu.md); empty: no IMU.', _RO),
    ParamSpec('input.resolution_change_frames', 3, 'Consecutive frames of a new image size '
              'needed before the session restarts at that size; fewer are dropped.', _LIVE,
              int_range=(1, 1000, 0)),
    ParamSpec('frames.odom_frame', 'odom', 'Continuous frame of the poses, path, odometry, TF '
              'and cloud (REP 105): base_frame at start or at the last reset; rollovers do '
              'not move it.', _RO),
    ParamSpec('frames.base_frame', 'base_link', 'Frame whose pose is published (TF odom_frame '
              '-> base_frame, odometry child_frame_id).', _RO),
    ParamSpec('frames.base_to_camera', [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], 'Camera mounting: '
              'x y z qx qy qz qw of the camera body frame (x forward, z up) in base_frame; the '
              'optical rotation is applied on top. Replaced by base_frame -> camera frame from '
              '/tf_static when tf2_ros finds it.', _RO),
    ParamSpec('frames.map_frame', 'map', 'Frame of the loop-closed outputs (~/map_pose, '
              '~/map_path, ~/loop_closures); map_frame -> odom_frame on TF (publish.map_tf) '
              "comes from the pose graph, or is a static identity without loop closure; '' "
              'leaves map to a localization node.', _RO),
    ParamSpec('frames.camera_frame', '', 'Camera optical frame of the outputs; empty: the '
              'frame_id of each input image.', _RO),
    ParamSpec('input.cameras', (), 'Camera names; empty: one camera on image and camera_info. '
              'With names, each camera subscribes <name>/image (or <name>/image/compressed) '
              'and <name>/camera_info and publishes under ~/<name>/; all cameras share the '
              'model and the page pool.', _RO),
    ParamSpec('input.primary_camera', '', 'Camera whose poses give odom -> base_frame, '
              '~/pose and ~/odometry (several cameras); empty: the first name.', _RO),
    ParamSpec('input.sync_tolerance_s', 0.010, 'Frames of different cameras whose stamps are '
              'within this many seconds are one synchronised group (fed together, matched '
              'for the alignment); 0: equal stamps only.', _RO,
              float_range=(0.0, MAX_SYNC_TOLERANCE_S)),
)
"""Input, camera and frame parameters, part of ``params.NODE_PARAMS``."""


def camera_names(values: dict[str, Any]) -> tuple[str, ...]:
    """Return the configured camera names (empty: the single camera of ``image``)."""
    return tuple(values.get('input.cameras') or ())


def group_names(values: dict[str, Any]) -> tuple[str, ...]:
    """Return the node's camera group: ``input.cameras``, or the one unnamed camera ``''``."""
    return camera_names(values) or ('',)


def camera_topic(name: str, leaf: str) -> str:
    """Return camera ``name``'s topic ``<name>/<leaf>``; the unnamed camera's is ``leaf``."""
    return f'{name}/{leaf}' if name else leaf


def primary_camera(values: dict[str, Any]) -> str:
    """Return the primary camera's name ('' with one camera)."""
    names = camera_names(values)
    return (values.get('input.primary_camera') or names[0]) if names else ''


def mount_param(name: str) -> str:
    """Return the name of camera ``name``'s mounting parameter."""
    return f'frames.cameras.{name}.base_to_camera'


def check_cameras(values: dict[str, Any]) -> str | None:
    """Return why ``input.cameras`` / ``input.primary_camera`` are refused, or None."""
    names = camera_names(values)
    if len(names) > MAX_CAMERAS:
        return f'input.cameras lists {len(names)} cameras; at most {MAX_CAMERAS} are supported'
    seen: set[str] = set()
    for name in names:
        if not _NAME.fullmatch(str(name)) or len(str(name)) > MAX_NAME_CHARS:
            shown = repr(name) if len(str(name)) <= MAX_NAME_CHARS else \
                f'{str(name)[:MAX_NAME_CHARS]!r}... ({len(str(name))} characters)'
            return (f'input.cameras: {shown} is not a valid camera name (a letter, then '
                    f'letters, digits or _, at most {MAX_NAME_CHARS} characters; it becomes a '
                    'topic name)')
        if name in RESERVED_NAMES:
            return (f"input.cameras: '{name}' is one of the node's own topic names "
                    f"({', '.join(sorted(RESERVED_NAMES))}); choose another")
        if name in seen:
            return f"input.cameras lists '{name}' twice: camera names must be unique"
        seen.add(name)
    if names and values.get('metric.source', 'none') != 'none':
        return ("metric.source 'depth' pairs one depth camera with one colour camera: it "
                'is not available with input.cameras')
    primary = values.get('input.primary_camera') or ''
    if primary and primary not in seen:
        return (f"input.primary_camera '{primary}' is not one of input.cameras "
                f"({', '.join(names) or 'empty'})")
    return None


def declare_mounts(node: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Declare ``frames.cameras.<name>.base_to_camera`` per camera and return their values.

    Each defaults to ``frames.base_to_camera``.

    Raises:
        ValueError: a mounting that is not plausible (the message names its parameter).
    """
    from rcl_interfaces.msg import ParameterDescriptor, ParameterType  # the tables need no ROS

    out = {}
    for name in camera_names(values):
        key = mount_param(name)
        desc = ParameterDescriptor(
            name=key, read_only=True, type=ParameterType.PARAMETER_DOUBLE_ARRAY,
            description=f'Mounting of camera {name} (as frames.base_to_camera).')
        out[key] = list(node.declare_parameter(key, list(values['frames.base_to_camera']),
                                               desc).value)
        pose7_to_matrix(out[key], source=key)
    return out


def declare_names(node: Any, spec: ParamSpec) -> list[str]:
    """Declare a string-array spec whose default is empty and return its value as a list.

    rclpy types an empty list as a byte array, so it is declared by type, unset; unset reads
    as the empty default.
    """
    from rclpy.parameter import Parameter  # the tables need no ROS

    value = node.declare_parameter(spec.name, Parameter.Type.STRING_ARRAY,
                                   spec.descriptor()).value
    return list(value or [])
