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
"""The IMU parts: preintegration, gravity alignment, the reading buffer and its drops, the config.

Run: ``python -m pytest test/engine/imu/test_imu_parts.py`` (a second).
"""

from __future__ import annotations

from imu_motion import pose
from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import (
    aligned_from_world, DROP_REASONS, ImuBuffer, preintegrate, so3, still_gravity)
import numpy as np
import pytest

REST = np.array([0.0, 0.0, 9.80665])


def test_constant_rate_rotation_is_exact() -> None:
    """A constant angular rate integrates to exp(w T), whatever the sample spacing."""
    stamps = np.cumsum(np.r_[0.0, np.full(99, 0.005) + np.linspace(0.0, 0.002, 99)])
    w = np.array([0.3, -0.2, 0.5])
    pre = preintegrate(stamps, np.tile(w, (100, 1)), np.tile(REST, (100, 1)), 0.013, 0.4)
    np.testing.assert_allclose(pre.delta_r, so3.exp(w * (0.4 - 0.013)), atol=1e-12)
    assert pre.dt == pytest.approx(0.387)


def test_still_reading_integrates_to_free_fall_increments() -> None:
    """At rest the specific force is +g up: dv = g_up T, dp = g_up T^2 / 2."""
    stamps = np.arange(0.0, 1.001, 0.005)
    pre = preintegrate(stamps, np.zeros((len(stamps), 3)), np.tile(REST, (len(stamps), 1)),
                       0.0, 1.0)
    np.testing.assert_allclose(pre.delta_v, REST, atol=1e-9)
    np.testing.assert_allclose(pre.delta_p, REST / 2.0, atol=1e-9)


def test_bias_jacobians_predict_reintegration() -> None:
    """The first-order bias correction matches integrating again; its error is second order."""
    stamps = np.arange(0.0, 0.3001, 0.005)
    t = stamps[:, None]
    gyro = np.hstack([0.8 * np.sin(3 * t), 0.5 * np.cos(2 * t), 0.3 + 0.0 * t])
    accel = REST + np.hstack([2.0 * np.sin(4 * t), np.cos(5 * t), 0.5 * t])
    pre = preintegrate(stamps, gyro, accel, 0.0, 0.3)
    errors = []
    for size in (1.0, 0.1):
        bg = size * np.array([0.01, -0.02, 0.015])
        ba = size * np.array([0.1, -0.05, 0.08])
        again = preintegrate(stamps, gyro, accel, 0.0, 0.3, bg, ba)
        change = np.linalg.norm(again.delta_v - pre.delta_v)
        error = np.array([np.linalg.norm(so3.log(pre.rotation(bg).T @ again.delta_r)),
                          np.linalg.norm(pre.velocity(bg, ba) - again.delta_v),
                          np.linalg.norm(pre.position(bg, ba) - again.delta_p)])
        # Corrected: within 0.5 % of what the bias changed (the test can fail: change is big).
        assert change > 1e-3
        assert error[1] < 5e-3 * change
        errors.append(error)
    # Ten times less bias, a hundred times less error: the Jacobians are exact to first order.
    np.testing.assert_array_less(errors[1], errors[0] / 50.0)


def test_rotation_covariance_grows_with_time_and_noise() -> None:
    """Gyroscope white noise n over T gives about n^2 T of rotation variance per axis."""
    stamps = np.arange(0.0, 2.0001, 0.005)
    zeros = np.zeros((len(stamps), 3))
    pre = preintegrate(stamps, zeros, zeros + REST, 0.0, 2.0, gyro_noise_density=1e-3)
    np.testing.assert_allclose(np.diag(pre.rotation_cov), 1e-6 * 2.0, rtol=1e-6)


def test_preintegration_needs_coverage() -> None:
    """An interval outside the readings or empty raises."""
    stamps = np.arange(0.0, 1.0, 0.005)
    readings = np.zeros((len(stamps), 3))
    with pytest.raises(ValueError, match='do not cover'):
        preintegrate(stamps, readings, readings, 0.5, 1.5)
    with pytest.raises(ValueError, match='empty'):
        preintegrate(stamps, readings, readings, 0.5, 0.5)


@pytest.mark.parametrize('gravity', [[0.0, 0.0, -1.0], [0.3, -0.2, -0.9], [0.0, 1.0, 0.0],
                                     [0.1, 0.0, 0.99], [0.0, 0.0, 1.0]])
def test_aligned_from_world_puts_gravity_down(gravity: list[float]) -> None:
    """The rotation takes gravity to -z, is a rotation, and is identity for a level frame."""
    g = np.array(gravity) / np.linalg.norm(gravity)
    rot = aligned_from_world(g)
    np.testing.assert_allclose(rot @ g, [0.0, 0.0, -1.0], atol=1e-12)
    np.testing.assert_allclose(rot.T @ rot, np.eye(3), atol=1e-12)
    assert np.linalg.det(rot) == pytest.approx(1.0)
    if gravity == [0.0, 0.0, -1.0]:
        np.testing.assert_allclose(rot, np.eye(3), atol=1e-15)


def test_aligned_from_world_keeps_heading_of_a_small_tilt() -> None:
    """A small tilt is undone by a rotation about a horizontal axis: no yaw added."""
    tilt = so3.exp(np.array([0.05, -0.03, 0.0]))
    rot = aligned_from_world(tilt.T @ np.array([0.0, 0.0, -1.0]))
    assert abs(so3.log(rot @ tilt.T)[2]) < 1e-3
    with pytest.raises(ValueError, match='gravity'):
        aligned_from_world(np.zeros(3))


def test_still_gravity_gives_roll_and_pitch_at_once() -> None:
    """Readings of a tilted IMU at rest give gravity in its frame; motion gives nothing."""
    rng = np.random.default_rng(0)
    tilt = so3.exp(np.array([0.2, -0.1, 0.7]))  # world-from-IMU
    accel = tilt.T @ REST + rng.normal(0.0, 0.02, (200, 3))
    gyro = rng.normal(0.0, 0.002, (200, 3))
    still = still_gravity(gyro, accel)
    assert still.still
    truth = tilt.T @ np.array([0.0, 0.0, -1.0])
    assert np.degrees(so3.angle_between(still.gravity, truth)) < 0.2
    assert not still_gravity(gyro + [0.0, 0.0, 0.5], accel).still
    assert not still_gravity(gyro, accel + rng.normal(0.0, 1.0, (200, 3))).still
    assert not still_gravity(gyro, accel * 0.5).still


def _fill(buffer: ImuBuffer, start: float, stop: float, rate: float) -> None:
    for t in np.arange(start, stop, 1.0 / rate):
        assert buffer.add(t, [0.0, 0.0, 0.1], REST) is None


def test_buffer_drops_and_counts_each_bad_reading() -> None:
    """NaN/inf, out of order, duplicate, future, saturated, bad shape: dropped and counted."""
    buf = ImuBuffer(ImuConfig(topic='imu'))
    _fill(buf, 0.0, 1.0, 200.0)
    kept = len(buf)
    assert buf.add(1.0, [np.nan, 0.0, 0.0], REST) == 'non_finite'
    assert buf.add(1.0, [0.0, 0.0, 0.0], [np.inf, 0.0, 0.0]) == 'non_finite'
    assert buf.add(float('nan'), [0.0, 0.0, 0.0], REST) == 'non_finite'
    assert buf.add(0.5, [0.0, 0.0, 0.0], REST) == 'out_of_order'
    assert buf.add(buf.last_stamp, [0.0, 0.0, 0.0], REST) == 'out_of_order'
    assert buf.add(5.0, [0.0, 0.0, 0.0], REST, reference_s=1.0) == 'future'
    assert buf.add(1.0, [0.0, 35.0, 0.0], REST) == 'saturated'
    assert buf.add(1.0, [0.0, 0.0, 0.0], [0.0, -156.0, 0.0]) == 'saturated'
    assert buf.add(1.0, [0.0, 0.0], REST) == 'bad_message'
    buf.drop('wrong_frame')
    assert buf.drops == {'non_finite': 3, 'out_of_order': 2, 'future': 1, 'saturated': 2,
                         'wrong_frame': 1, 'bad_message': 1}
    assert set(buf.drops) == set(DROP_REASONS)
    assert len(buf) == kept
    assert buf.add(1.0, [0.0, 0.0, 0.0], REST, reference_s=1.0) is None
    with pytest.raises(ValueError, match='unknown IMU drop reason'):
        buf.drop('tired')


def test_buffer_time_offset_and_window() -> None:
    """Stamps move to the camera clock; a window spans its interval or is None."""
    buf = ImuBuffer(ImuConfig(topic='imu', time_offset_s=0.02))
    _fill(buf, 0.0, 2.0, 200.0)
    assert buf.last_stamp == pytest.approx(1.995 - 0.02)
    stamps, gyro, accel = buf.window(0.5, 1.0)
    assert stamps[0] <= 0.5 < stamps[1] and stamps[-2] < 1.0 <= stamps[-1]
    assert gyro.shape == accel.shape == (len(stamps), 3)
    assert buf.window(-0.1, 1.0) is None
    assert buf.window(0.5, 2.5) is None


def test_buffer_state_slow_silent_late() -> None:
    """Waiting before any reading, ok at 200 Hz, slow at 5 Hz, silent when stopped."""
    buf = ImuBuffer(ImuConfig(topic='imu'))
    assert buf.state(0.0) == 'waiting'
    _fill(buf, 0.0, 2.0, 200.0)
    assert buf.rate_hz() == pytest.approx(200.0, rel=1e-6)
    assert buf.state(2.0) == 'ok'
    assert buf.state(10.0) == 'silent'
    slow = ImuBuffer(ImuConfig(topic='imu'))
    _fill(slow, 0.0, 3.0, 5.0)
    assert slow.rate_hz() == pytest.approx(5.0, rel=1e-6)
    assert slow.state(3.0) == 'slow'
    assert slow.largest_gap_s == pytest.approx(0.2)


def test_buffer_keeps_buffer_s() -> None:
    """Readings older than buffer_s are let go."""
    buf = ImuBuffer(ImuConfig(topic='imu', buffer_s=1.0))
    _fill(buf, 0.0, 3.0, 100.0)
    assert buf.window(1.0, 2.9) is None
    assert buf.window(2.0, 2.9) is not None
    assert buf.accepted == 300


@pytest.mark.parametrize(('values', 'message'), [
    ({'time_offset_s': 2.0}, 'time_offset_s'),
    ({'gyro_noise_density': -1.0}, 'gyro_noise_density'),
    ({'accel_range': float('nan')}, 'accel_range'),
    ({'max_gap_s': 0.0}, 'max_gap_s'),
    ({'imu_from_camera': (0.0, 0.0, 0.0)}, '7 finite numbers'),
    ({'imu_from_camera': (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0)}, 'unit norm'),
])
def test_config_rejects_bad_values(values: dict, message: str) -> None:
    """Bad settings raise ValueError naming the setting."""
    with pytest.raises(ValueError, match=message):
        ImuConfig(**values)


def test_config_from_flat() -> None:
    """``imu.*`` keys build the config; it is off without a topic; unknown keys raise."""
    cfg = ImuConfig.from_flat({'imu.topic': '/imu', 'imu.time_offset_s': -0.01, 'x.y': 1})
    assert cfg.enabled and cfg.time_offset_s == pytest.approx(-0.01)
    assert not ImuConfig().enabled
    with pytest.raises(ValueError, match='imu.bogus'):
        ImuConfig.from_flat({'imu.bogus': 1})
    mount = ImuConfig(imu_from_camera=[0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 1]).imu_from_camera
    assert mount == pytest.approx((0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0))
    assert pose(np.eye(3), mount[:3])[0, 3] == pytest.approx(0.1)
