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
"""Levelling odom at its anchor or map later (engine/imu/leveling.py), and gravity in the world.

A camera on the synthetic route (tilted: it looks down), a base it is mounted on with a pitch
and a roll, an IMU mounted on the camera with a turn of its own; still readings come from the
synthetic IMU's noise model (white noise and turn-on biases) at the first pose.
Run: ``python -m pytest test/engine/imu/test_leveling.py`` (seconds).
"""

from __future__ import annotations

import math

from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import ImuBuffer, ImuScaleTracker, so3
from lingbot_map_ros.engine.imu.leveling import (
    anchor_level, gravity_in_base, GravityLevel, level_matrix, map_level, tilt_deg)
from lingbot_map_ros.engine.session.imu_session import ImuSession
from lingbot_map_ros.engine.session.stitching import Sim3Alignment
from lingbot_map_ros.tools.synthetic_imu import (
    DEFAULT_IMU_FROM_CAMERA, frame_poses, imu_readings, ImuNoise, synthetic_imu)
from lingbot_map_ros.tools.synthetic_scene import camera_path, SceneConfig
import numpy as np
import pytest

DOWN = np.array([0.0, 0.0, -1.0])
SCENE = SceneConfig(laps=2)


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(so3.angle_between(np.asarray(a, float), np.asarray(b, float)))


def _tilted_mounts() -> tuple[np.ndarray, np.ndarray]:
    """Return (B: optical in base, imu_from_camera), both with turns of their own."""
    base_from_body = np.eye(4)
    base_from_body[:3, :3] = so3.exp(np.array([0.12, -0.25, 0.4]))
    base_from_body[:3, 3] = [0.2, 0.0, 0.3]
    optical_in_body = np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0],
                                [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    imu_from_camera = DEFAULT_IMU_FROM_CAMERA.copy()
    imu_from_camera[:3, :3] = so3.exp(np.array([0.3, 0.1, -0.2])) @ imu_from_camera[:3, :3]
    return base_from_body @ optical_in_body, imu_from_camera


def _still_readings(room_from_camera: np.ndarray, imu_from_camera: np.ndarray,
                    seconds: float = 0.5, rate: float = 200.0, seed: int = 0):
    """Return (stamps, gyro, accel) of the IMU standing still at ``room_from_camera``."""
    count = int(seconds * rate) + 1
    room_from_imu = room_from_camera @ np.linalg.inv(imu_from_camera)
    dense = np.repeat(room_from_imu[None], 4 * count + 1, axis=0)
    gyro, accel, _, _ = imu_readings(dense, 1.0 / rate, ImuNoise(), seed)
    return np.arange(count) / rate, gyro, accel


def test_level_matrix_takes_gravity_down_and_turns_about_a_level_axis():
    for gravity in ([0.1, -0.2, -0.95], [0.7, 0.0, -0.7], [0.0, 0.0, -1.0], [0.3, 0.4, 0.2]):
        g = np.asarray(gravity) / np.linalg.norm(gravity)
        level = level_matrix(g)
        np.testing.assert_allclose(level[:3, :3] @ g, DOWN, atol=1e-12)
        np.testing.assert_allclose(level[:3, 3], 0.0, atol=0.0)
        # The smallest rotation: about an axis in the plane normal to both (no heading turn
        # beyond what the tilt needs), by exactly the angle between gravity and down.
        assert tilt_deg(level) == pytest.approx(_angle_deg(g, DOWN), abs=1e-9)
        axis = so3.log(level[:3, :3])
        assert abs(float(axis @ g)) < 1e-9 and abs(float(axis @ DOWN)) < 1e-9
    with pytest.raises(ValueError):
        level_matrix(np.array([0.0, 0.0, 0.0]))


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_odom_levelled_at_the_anchor_agrees_with_gravity_along_the_route(seed):
    mount, imu_from_camera = _tilted_mounts()
    room = camera_path(SCENE.num_frames, SCENE.laps)  # z-up room, the camera looks down
    readings = _still_readings(room[0], imu_from_camera, seed=seed)
    level = anchor_level(readings, imu_from_camera, mount)
    assert level is not None
    # The engine's world is any frame: the first camera's, turned by the model's whims.
    world_from_room = np.eye(4)
    world_from_room[:3, :3] = so3.exp(np.array([0.5, -0.3, 1.1]))
    c2w = world_from_room @ room
    odom_from_world = level @ mount @ np.linalg.inv(c2w[0])
    for k in range(0, len(room), 7):
        base_in_odom = odom_from_world @ c2w[k] @ np.linalg.inv(mount)
        room_from_base = room[k] @ np.linalg.inv(mount)
        # Gravity seen from the base: odom's -z against the room's -z (the truth).
        assert _angle_deg(base_in_odom[:3, :3].T @ DOWN, room_from_base[:3, :3].T @ DOWN) < 0.5
    # The anchor pose is the tilt alone: odom's origin is the base's first position.
    first = odom_from_world @ c2w[0] @ np.linalg.inv(mount)
    np.testing.assert_allclose(first[:3, 3], 0.0, atol=1e-9)
    truth_tilt = _angle_deg((room[0] @ np.linalg.inv(mount))[:3, :3].T @ DOWN, DOWN)
    assert tilt_deg(level) == pytest.approx(truth_tilt, abs=0.5)
    assert truth_tilt > 10.0  # the case is not level to begin with


def test_gravity_in_base_goes_through_both_mountings():
    mount, imu_from_camera = _tilted_mounts()
    room = camera_path(SCENE.num_frames, SCENE.laps)[0]
    room_from_imu = room @ np.linalg.inv(imu_from_camera)
    gravity_imu = room_from_imu[:3, :3].T @ DOWN
    truth = (room @ np.linalg.inv(mount))[:3, :3].T @ DOWN
    np.testing.assert_allclose(gravity_in_base(gravity_imu, imu_from_camera, mount), truth,
                               atol=1e-12)


def test_no_level_at_the_anchor_without_readings_or_while_moving():
    mount, imu_from_camera = _tilted_mounts()
    assert anchor_level(None, imu_from_camera, mount) is None
    imu = synthetic_imu(SCENE, seed=1)  # the route: moving from its first frame
    moving = (imu.stamps_ns[:100] * 1e-9, imu.gyro[:100], imu.accel[:100])
    assert anchor_level(moving, imu_from_camera, mount) is None


def test_map_level_takes_gravity_in_odom_down():
    odom_from_world = np.eye(4)
    odom_from_world[:3, :3] = so3.exp(np.array([0.2, 0.7, -0.4]))
    odom_from_world[:3, 3] = [1.0, 2.0, 3.0]
    gravity = np.array([0.2, -0.1, 0.97])
    gravity /= np.linalg.norm(gravity)
    level = map_level(gravity, odom_from_world)
    np.testing.assert_allclose(level[:3, :3] @ odom_from_world[:3, :3] @ gravity, DOWN,
                               atol=1e-12)
    # A similarity's scale does not change the direction.
    scaled = odom_from_world.copy()
    scaled[:3, :3] *= 3.0
    np.testing.assert_allclose(map_level(gravity, scaled), level, atol=1e-12)


class _Readings:
    """A buffer of still readings on the camera clock, as ``ImuBuffer.window`` answers."""

    def __init__(self, stamps, gyro, accel):
        self.buffer = ImuBuffer(ImuConfig(topic='imu', buffer_s=60.0))
        for t, g, a in zip(stamps, gyro, accel):
            assert self.buffer.add(float(t), g, a) is None


def test_gravity_level_odom_case_then_reset():
    mount, imu_from_camera = _tilted_mounts()
    room = camera_path(SCENE.num_frames, SCENE.laps)
    stamps, gyro, accel = _still_readings(room[0], imu_from_camera, seconds=1.0)
    stamps = stamps + 100.0
    buf = _Readings(stamps, gyro, accel).buffer
    world = {'gravity': None}
    level = GravityLevel(buf.window, lambda: world['gravity'], imu_from_camera)
    assert level.state() == ('none', None)
    anchor = float(stamps[-1])
    odom_level = level.at_anchor(anchor, mount)
    assert odom_level is not None
    frame, tilt = level.state()
    assert frame == 'odom' and tilt == pytest.approx(tilt_deg(odom_level), abs=1e-9)
    # Levelled at the anchor: map is not levelled again, even once gravity is known.
    world['gravity'] = np.array([0.0, 0.0, -1.0])
    assert not level.after_anchor(np.eye(4))
    np.testing.assert_allclose(level.map_from_odom(), np.eye(4), atol=0.0)
    assert level.version == 0
    # A reset: the next anchor, with no readings before it, cannot level odom.
    level.clear()
    assert level.state() == ('none', None)
    assert level.at_anchor(anchor + 50.0, mount) is None
    # A window starting before the buffer: the shorter one is tried.
    level.clear()
    assert level.at_anchor(float(stamps[0]) + 0.3, mount) is not None


def test_gravity_level_map_case_fixed_once_until_reset():
    mount, imu_from_camera = _tilted_mounts()
    world = {'gravity': None}
    level = GravityLevel(lambda t0, t1: None, lambda: world['gravity'], imu_from_camera)
    assert level.at_anchor(10.0, mount) is None
    odom_from_world = np.eye(4)
    odom_from_world[:3, :3] = so3.exp(np.array([0.3, -0.2, 0.5]))
    assert not level.after_anchor(odom_from_world)  # gravity not known yet
    assert level.state() == ('none', None) and level.version == 0
    world['gravity'] = np.array([0.1, 0.2, -0.97]) / np.linalg.norm([0.1, 0.2, -0.97])
    assert level.after_anchor(odom_from_world)
    expected = map_level(world['gravity'], odom_from_world)
    np.testing.assert_allclose(level.map_from_odom(), expected, atol=1e-12)
    assert level.state()[0] == 'map' and level.version == 1
    # Fixed once: a later estimate does not move map.
    world['gravity'] = np.array([0.0, 0.0, -1.0])
    assert not level.after_anchor(odom_from_world)
    np.testing.assert_allclose(level.map_from_odom(), expected, atol=1e-12)
    level.clear()  # map -> odom back to the identity, counted as a change
    assert level.version == 2 and level.state() == ('none', None)
    np.testing.assert_allclose(level.map_from_odom(), np.eye(4), atol=0.0)
    # Before any anchor nothing is levelled.
    assert not level.after_anchor(odom_from_world)


def test_imu_session_keeps_gravity_in_the_continuous_frame_across_a_rollover():
    imu = synthetic_imu(SCENE, noise=ImuNoise(), seed=7)
    buf = ImuBuffer(ImuConfig(topic='imu', buffer_s=60.0))
    for t, g, a in zip((imu.stamps_ns - SCENE.start_ns) * 1e-9, imu.gyro, imu.accel):
        assert buf.add(t, g, a) is None
    stamps = np.arange(SCENE.total_frames) * (1_000_000_000 // int(SCENE.fps))
    poses = frame_poses(SCENE)  # world = the first camera: gravity there is imu.gravity

    class _Pred:
        def __init__(self, stamp_ns, c2w):
            self.stamp_ns, self.c2w, self.is_keyframe = int(stamp_ns), c2w, True

    session = ImuSession(ImuScaleTracker(buf.window, imu_from_camera=imu.imu_from_camera))
    assert session.gravity_world() is None
    session.observe([_Pred(t, c) for t, c in zip(stamps[:60], poses[:60])])
    first = session.gravity_world()
    assert first is not None and _angle_deg(first, imu.gravity) < 0.2
    # A rollover: the next session's world is its first overlap keyframe's camera; the fit
    # maps it back (its true rotation). The old estimate stays as it was.
    lo = 52
    turn = np.eye(4)
    turn[:3, :3] = so3.exp(np.array([0.6, -0.4, 0.2]))  # the new session's world, turned
    own_from_world = turn @ np.linalg.inv(poses[lo])
    own = own_from_world @ poses[lo:120]
    back = np.linalg.inv(own_from_world)
    fit = Sim3Alignment(1.0, back[:3, :3].copy(), back[:3, 3].copy(), 0.0, False)
    session.start_session([_Pred(t, c) for t, c in zip(stamps[lo:60], own[:8])],
                          poses[lo:60], own[:8], fit)
    np.testing.assert_allclose(session.gravity_world(), first, atol=1e-12)
    session.observe([_Pred(t, c) for t, c in zip(stamps[60:120], own[8:])])
    assert session.stats().gravity is not None
    assert _angle_deg(session.stats().gravity, imu.gravity) > 20.0  # its own world's
    assert _angle_deg(session.gravity_world(), imu.gravity) < 0.2  # back in the first's
    session.reset()
    assert session.gravity_world() is None
