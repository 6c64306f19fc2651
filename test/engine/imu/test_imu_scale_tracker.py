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
"""ImuScaleTracker: per-session scale with model scale drift between sessions, lock, degenerate.

The keyframes are those of an oracle model: the route's exact poses, each session in its own
world (its first keyframe) and its own units (the scale drifts from session to session, as the
model's does), with small pose noise. Run: ``python -m pytest
test/engine/imu/test_imu_scale_tracker.py`` (seconds).
"""

from __future__ import annotations

from imu_motion import along, gravity_error_deg, pose
from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import (
    ImuBuffer, ImuScaleTracker, scale_disagreement, so3, TrackerConfig)
from lingbot_map_ros.tools.synthetic_imu import frame_poses, ImuNoise, synthetic_imu
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
import numpy as np
import pytest

SCENE = SceneConfig(laps=2)


def _buffer(imu_stamps: np.ndarray, gyro: np.ndarray, accel: np.ndarray) -> ImuBuffer:
    buf = ImuBuffer(ImuConfig(topic='imu', buffer_s=60.0))
    for t, g, a in zip(imu_stamps, gyro, accel):
        assert buf.add(t, g, a) is None
    return buf


@pytest.fixture(scope='module')
def route_imu():
    """Return the two-lap route's IMU in a buffer, its frame poses (metres) and stamps."""
    imu = synthetic_imu(SCENE, noise=ImuNoise(), seed=7)
    stamps = (imu.stamps_ns - SCENE.start_ns) * 1e-9
    buf = _buffer(stamps, imu.gyro, imu.accel)
    world_from_room_gravity = imu.gravity
    return buf, frame_poses(SCENE), np.arange(SCENE.total_frames) / SCENE.fps, imu, \
        world_from_room_gravity


def _session(poses_m: np.ndarray, units: float, rng: np.random.Generator) -> np.ndarray:
    """Return the keyframes as a session gives them: own world, own units, small noise.

    The noise: 0.05 deg of rotation and 1 mm of position on every keyframe, independent.
    """
    world = np.linalg.inv(poses_m[0])
    out = world @ poses_m
    for p in out[1:]:
        p[:3, :3] = p[:3, :3] @ so3.exp(rng.normal(0.0, np.radians(0.05), 3))
        p[:3, 3] += rng.normal(0.0, 0.001, 3)
    out[:, :3, 3] /= units
    return out


def test_each_session_gets_its_own_scale_and_gravity(route_imu) -> None:
    """Scale drift between sessions: each session locks to its own units within 2 %."""
    buf, poses, stamps, imu, gravity0 = route_imu
    tracker = ImuScaleTracker(buf.window, imu_from_camera=imu.imu_from_camera,
                              healthy=lambda t: True)
    rng = np.random.default_rng(1)
    for (lo, hi), units in (((0, 60), 0.37), ((50, 120), 0.55)):
        if lo:
            tracker.start_session()
            assert tracker.state() == 'waiting' and tracker.scale() is None
        session = _session(poses[lo:hi], units, rng)
        for t, c2w in zip(stamps[lo:hi], session):
            tracker.add_keyframe(t, c2w)
        stats = tracker.stats()
        assert stats.state == 'locked', stats.reason
        assert abs(stats.scale / units - 1.0) <= 0.02
        # Gravity in the session's world (its first camera).
        truth = np.linalg.inv(poses[lo])[:3, :3] @ np.linalg.inv(poses[0])[:3, :3].T @ gravity0
        assert gravity_error_deg(stats.gravity, truth) <= 1.0
        assert stats.samples >= 3 and stats.gravity_residual_deg < 1.0
        np.testing.assert_allclose(stats.gyro_bias, imu.gyro_bias.mean(axis=0), atol=2e-3)
    assert tracker.stats().degenerate_sessions == 0


def test_locked_scale_is_held(route_imu) -> None:
    """After the lock, later windows are not aligned and the scale does not move."""
    buf, poses, stamps, imu, _ = route_imu
    tracker = ImuScaleTracker(buf.window, imu_from_camera=imu.imu_from_camera)
    session = _session(poses[:100], 0.4, np.random.default_rng(2))
    for t, c2w in zip(stamps[:60], session[:60]):
        tracker.add_keyframe(t, c2w)
    assert tracker.state() == 'locked'
    scale, windows = tracker.scale(), tracker.stats().windows
    for t, c2w in zip(stamps[60:100], session[60:100]):
        assert tracker.add_keyframe(t, c2w) is None
    assert tracker.scale() == pytest.approx(scale, rel=1e-12)
    assert tracker.stats().windows == windows


def test_constant_velocity_is_degenerate_and_gives_no_scale() -> None:
    """Constant velocity: no sample, state degenerate with the alignment's reason."""
    win = along(lambda t: pose(np.eye(3), [0.5 * t, 0.2 * t, 1.0]), 6.0)
    tracker = ImuScaleTracker(_buffer(win.imu_stamps, win.gyro, win.accel).window,
                              TrackerConfig(window_keyframes=8, align_every=2,
                                            degenerate_after=3),
                              imu_from_camera=win.mount)
    for t, c2w in zip(win.stamps, win.poses):
        tracker.add_keyframe(t, c2w)
    stats = tracker.stats()
    assert stats.state == 'degenerate'
    assert stats.scale is None and stats.gravity is None
    assert 'degenerate' in stats.reason
    assert stats.degenerate_sessions == 1
    tracker.reset()
    assert tracker.state() == 'waiting'


def test_unhealthy_or_stopped_imu_pauses_the_tracker(route_imu) -> None:
    """An IMU not healthy, or one whose readings stopped, pauses the tracker and says why."""
    buf, poses, stamps, imu, _ = route_imu
    session = _session(poses[:60], 0.4, np.random.default_rng(3))
    sick = ImuScaleTracker(buf.window, TrackerConfig(degenerate_after=1),
                           imu_from_camera=imu.imu_from_camera, healthy=lambda t: False)
    stopped = ImuScaleTracker(lambda t0, t1: None, imu_from_camera=imu.imu_from_camera)
    for t, c2w in zip(stamps[:60], session):
        sick.add_keyframe(t, c2w)
        stopped.add_keyframe(t, c2w)
    # Paused, not degenerate: the motion was never judged.
    assert sick.state() == 'waiting' and 'not healthy' in sick.stats().reason
    assert stopped.state() == 'waiting' and 'do not cover' in stopped.stats().reason
    assert sick.stats().windows == stopped.stats().windows == 0
    assert sick.scale() is None and stopped.scale() is None


def test_off_without_imu_and_repeated_keyframes_ignored(route_imu) -> None:
    """No IMU: state off, nothing kept; a keyframe given twice counts once."""
    off = ImuScaleTracker(None)
    assert off.add_keyframe(0.0, np.eye(4)) is None
    assert off.stats().state == 'off' and off.stats().session_keyframes == 0
    buf, _, _, _, _ = route_imu
    tracker = ImuScaleTracker(buf.window)
    tracker.add_keyframe(1.0, np.eye(4))
    tracker.add_keyframe(1.0, np.eye(4))
    tracker.add_keyframe(0.5, np.eye(4))
    assert tracker.stats().session_keyframes == 1
    # Closer than min_spacing_s: seen, not kept in the window.
    tracker.add_keyframe(1.1, np.eye(4))
    assert tracker.stats().session_keyframes == 2


def test_scale_disagreement() -> None:
    """IMU against depth: the relative difference, None when either is missing."""
    assert scale_disagreement(1.03, 1.0) == pytest.approx(0.03)
    assert scale_disagreement(None, 1.0) is None
    assert scale_disagreement(1.0, None) is None
    assert scale_disagreement(1.0, 0.0) is None


def test_tracker_config_checks() -> None:
    """Bad tracker settings raise."""
    with pytest.raises(ValueError, match='window_keyframes'):
        TrackerConfig(window_keyframes=2)
    with pytest.raises(ValueError, match='lock_spread'):
        TrackerConfig(lock_spread=0.0)
