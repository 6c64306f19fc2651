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
"""REP-105 frame math (odom anchor, mounting) and the odometry diagnostic status.

Run: ``python -m pytest test/ros/test_odom_frames.py`` (instant).
"""

from __future__ import annotations

from lingbot_map_ros.engine.stats import RolloverStats
from lingbot_map_ros.ros.publishers.odom_frames import OdomFrames, OPTICAL_IN_BODY, pose7_to_matrix
from lingbot_map_ros.ros.publishers.odometry_status import ODOMETRY_KEYS, odometry_status
import numpy as np
import pytest

IDENTITY7 = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def _optical_pose(centre, rotation=np.eye(3)) -> np.ndarray:
    c2w = np.eye(4)
    c2w[:3, :3], c2w[:3, 3] = rotation, centre
    return c2w


def test_first_pose_is_the_origin_and_forward_motion_is_plus_x():
    frames = OdomFrames(IDENTITY7)
    start = _optical_pose([1.0, 2.0, 3.0])
    assert np.allclose(frames.base_in_odom(start), np.eye(4), atol=1e-12)
    # The camera moves 0.5 along its optical z (forward): base_link moves along +x.
    moved = frames.base_in_odom(_optical_pose([1.0, 2.0, 3.5]))
    assert np.allclose(moved[:3, 3], [0.5, 0.0, 0.0], atol=1e-12)
    assert np.allclose(moved[:3, :3], np.eye(3), atol=1e-12)
    # Down in the image (optical +y) is -z of base_link.
    down = frames.base_in_odom(_optical_pose([1.0, 2.5, 3.0]))
    assert np.allclose(down[:3, 3], [0.0, 0.0, -0.5], atol=1e-12)


def test_clear_starts_a_new_origin():
    frames = OdomFrames(IDENTITY7)
    frames.base_in_odom(_optical_pose([0.0, 0.0, 0.0]))
    frames.clear()
    assert not frames.anchored
    assert np.allclose(frames.base_in_odom(_optical_pose([5.0, 0.0, 0.0])), np.eye(4))


def test_a_pitched_mounting_keeps_base_link_level():
    # Camera pitched down 30 deg about base_link's y: moving the camera along its own optical
    # axis moves the base forward and down, as a level base would see it.
    half = np.radians(30) / 2
    frames = OdomFrames([0.2, 0.0, 0.5, 0.0, np.sin(half), 0.0, np.cos(half)])
    assert np.allclose(frames.mount[:3, 3], [0.2, 0.0, 0.5])
    frames.base_in_odom(_optical_pose([0.0, 0.0, 0.0]))
    moved = frames.base_in_odom(_optical_pose([0.0, 0.0, 1.0]))
    assert np.allclose(moved[:3, 3], [np.cos(np.radians(30)), 0.0, -0.5], atol=1e-12)
    assert np.allclose(moved[:3, :3], np.eye(3), atol=1e-12)


def test_optical_rotation_and_bad_mountings():
    # Exact: the identity quaternion gives 1 - 2 * 0 and products of zeros, no round-off.
    assert np.array_equal(pose7_to_matrix(IDENTITY7), np.eye(4))
    assert np.allclose(OPTICAL_IN_BODY[:3, :3] @ [0, 0, 1], [1, 0, 0])  # optical z = forward
    for bad, match in (([0.0] * 6, '7 finite'), ([0.0] * 6 + [float('nan')], '7 finite'),
                       ([0.0] * 7, 'quaternion')):
        with pytest.raises(ValueError, match=match):
            OdomFrames(bad)


def test_odometry_status_has_every_key_in_every_state():
    frames = {'odom_frame': 'odom', 'base_frame': 'base_link', 'mounting': 'parameter'}
    fresh = odometry_status('n', RolloverStats(), frames, 320)
    assert [kv.key for kv in fresh.values] == list(ODOMETRY_KEYS)
    assert fresh.level == b'\x00' and fresh.name == 'n: odometry'
    still = RolloverStats(rollovers=3, sessions=4, last_degenerate=True,
                          degenerate_alignments=1, last_scale=0.5)
    warn = odometry_status('n', still, frames, 320)
    assert [kv.key for kv in warn.values] == list(ODOMETRY_KEYS)
    values = {kv.key: kv.value for kv in warn.values}
    assert warn.level == b'\x01' and values['last_alignment_scale'] == '0.5'
    assert values['rollovers'] == '3' and values['last_alignment_degenerate'] == 'True'
    fresh_values = {kv.key: kv.value for kv in fresh.values}
    assert (fresh_values['preparation'], fresh_values['last_switch_ms']) == ('idle', '0.0')
    ready = odometry_status('n', RolloverStats(rollovers=2, sessions=3, preparation='ready',
                                               last_rollover_ms=8.54, last_switch_units=0),
                            frames, 320)
    values = {kv.key: kv.value for kv in ready.values}
    assert (values['preparation'], values['last_switch_ms'], values['last_switch_units'],
            values['unprepared_switches']) == ('ready', '8.5', '0', '0')
    assert ready.level == b'\x00' and 'next session ready' in ready.message


def test_the_anchoring_pose_is_the_identity_exactly_whatever_the_blas():
    # A rotated, translated camera and mounting: B @ inv(C) @ C @ inv(B) would carry round-off
    # that differs between CPUs. The contract is REP 105's "odom starts at the robot", exactly.
    half = np.radians(17) / 2
    frames = OdomFrames([0.13, -0.07, 0.41, np.sin(half), 0.0, 0.0, np.cos(half)])
    rot = np.array([[0.36, 0.48, -0.8], [-0.8, 0.6, 0.0], [0.48, 0.64, 0.6]])
    pose = np.eye(4)
    pose[:3, :3], pose[:3, 3] = rot, [1.1, -2.3, 0.7]
    first = frames.base_in_odom(pose)
    assert first.tolist() == np.eye(4).tolist()
    assert np.allclose(frames.base_in_odom(pose), np.eye(4), atol=1e-12)
