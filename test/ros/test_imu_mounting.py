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
"""The IMU's mounting from /tf_static or the parameter (``ros/inference/imu_mounting.py``).

tf2_ros is not part of the PyPI wheels: the buffer here holds transforms and answers
``lookup_transform`` as tf2's does (target frame, source frame), like the camera mounting's
tests (``test_hardening_node.py``).

Run: ``python -m pytest test/ros/test_imu_mounting.py`` (instant).
"""

from __future__ import annotations

import math

from geometry_msgs.msg import TransformStamped
from lingbot_map_ros.engine.imu import ImuScaleTracker
from lingbot_map_ros.ros.inference.imu_mounting import (ImuMounting, lookup_imu_from_camera,
                                                        pose7_text)
from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

# IMU axes forward-left-up, 2 cm beside the optical centre: camera points into the IMU frame.
MOUNT7 = [0.02, -0.01, 0.005, *Rotation.from_matrix(
    [[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]).as_quat()]


class _StaticBuffer:
    """A tf2 buffer holding fixed transforms (the lookup of tf2's ``Buffer``)."""

    def __init__(self, *transforms: TransformStamped) -> None:
        self.transforms = {(t.header.frame_id, t.child_frame_id): t for t in transforms}
        self.lookups = 0

    def lookup_transform(self, target: str, source: str, _time) -> TransformStamped:
        self.lookups += 1
        if (target, source) not in self.transforms:
            raise LookupError(f'{target} -> {source} unknown')
        return self.transforms[(target, source)]


def transform(parent: str, child: str, values) -> TransformStamped:
    """Return ``parent -> child`` carrying x y z qx qy qz qw."""
    tf = TransformStamped(child_frame_id=child)
    tf.header.frame_id = parent
    t, q = tf.transform.translation, tf.transform.rotation
    t.x, t.y, t.z, q.x, q.y, q.z, q.w = map(float, values)
    return tf


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def test_the_lookup_reads_imu_from_camera() -> None:
    """imu_link <- camera optical frame: the matrix maps camera points into the IMU frame."""
    buffer = _StaticBuffer(transform('imu_link', 'cam_optical', MOUNT7))
    mount = lookup_imu_from_camera(buffer, 'imu_link', 'cam_optical')
    np.testing.assert_allclose(mount, pose7_to_matrix(MOUNT7), atol=1e-12)
    # The camera's forward axis (optical z) is the IMU's x.
    np.testing.assert_allclose(mount[:3, :3] @ [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], atol=1e-12)
    assert lookup_imu_from_camera(buffer, 'cam_optical', 'imu_link') is None  # other way
    assert lookup_imu_from_camera(buffer, 'imu_link', 'other_cam') is None


@pytest.mark.parametrize('values, match', [
    ([math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], 'needs 7 finite'),
    ([5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], r'5 m from the camera'),
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 'not a rotation'),
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5], 'norm 0.5'),
])
def test_garbage_on_tf_static_is_refused(values, match) -> None:
    """Infinite, far, zero or non-unit rotations: a ValueError naming /tf_static."""
    buffer = _StaticBuffer(transform('imu_link', 'cam_optical', values))
    with pytest.raises(ValueError, match=match) as info:
        lookup_imu_from_camera(buffer, 'imu_link', 'cam_optical')
    assert '/tf_static imu_link -> cam_optical' in str(info.value)


def test_the_tracker_aligns_with_the_mounting_read_from_tf() -> None:
    """Found on /tf_static: copied into the tracker's array, source tf, one INFO, no retry."""
    parameter = np.eye(4)
    mounting = ImuMounting(parameter)
    assert mounting.source == 'parameter' and 'no tf2_ros' in mounting.describe()
    tracker = ImuScaleTracker(None, imu_from_camera=mounting.matrix)
    buffer = _StaticBuffer(transform('imu_link', 'cam_optical', MOUNT7))
    mounting.use_tf_buffer(buffer)
    warn, info = _Log(), _Log()
    assert not mounting.update('', 'cam_optical', warn, info)  # IMU frame not known yet
    assert not mounting.update('imu_link', '', warn, info)  # camera frame not known yet
    assert buffer.lookups == 0
    assert mounting.update('imu_link', 'cam_optical', warn, info)
    assert mounting.source == 'tf' and not warn.lines
    assert len(info.lines) == 1 and '/tf_static' in info.lines[0]
    np.testing.assert_allclose(tracker._mount, pose7_to_matrix(MOUNT7), atol=1e-12)
    np.testing.assert_allclose(parameter, np.eye(4), atol=0)  # the parameter's array untouched
    assert not mounting.update('imu_link', 'cam_optical', warn, info)  # once
    assert buffer.lookups == 1
    assert 'from /tf_static' in mounting.describe()
    values = [float(v) for v in pose7_text(mounting.matrix).split()]
    np.testing.assert_allclose(pose7_to_matrix(values), mounting.matrix, atol=1e-6)


def test_garbage_keeps_the_parameter_with_one_warning() -> None:
    """Refused: one WARN, the parameter's mounting stays, the lookup is not tried again."""
    parameter = pose7_to_matrix(MOUNT7)
    buffer = _StaticBuffer(transform('imu_link', 'cam_optical', [0, 0, 40.0, 0, 0, 0, 1]))
    mounting = ImuMounting(parameter, buffer)
    assert 'until /tf_static' in mounting.describe()
    warn, info = _Log(), _Log()
    for _ in range(5):
        assert not mounting.update('imu_link', 'cam_optical', warn, info)
    assert len(warn.lines) == 1 and 'keeping imu.imu_from_camera' in warn.lines[0]
    assert mounting.source == 'parameter' and not info.lines and buffer.lookups == 1
    np.testing.assert_allclose(mounting.matrix, parameter, atol=0)


def test_not_there_yet_is_tried_again_at_the_next_image() -> None:
    """Before /tf_static holds the pair the parameter is used; the pair is taken once there."""
    buffer = _StaticBuffer()
    mounting = ImuMounting(np.eye(4), buffer)
    warn, info = _Log(), _Log()
    assert not mounting.update('imu_link', 'cam_optical', warn, info)
    assert mounting.source == 'parameter'
    buffer.transforms[('imu_link', 'cam_optical')] = transform('imu_link', 'cam_optical', MOUNT7)
    assert mounting.update('imu_link', 'cam_optical', warn, info)
    assert mounting.source == 'tf' and buffer.lookups == 2 and not warn.lines
