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
"""``~/odometry``'s dead-reckoning covariance: grows with time and distance, PSD, reset.

Run: ``python -m pytest test/engine/imu/test_odometry_covariance.py`` (a second).
"""

from __future__ import annotations

from imu_motion import pose, route
from lingbot_map_ros.engine.imu import ImuBuffer, so3
from lingbot_map_ros.engine.imu.keyframe_rotation import ImuRotations
from lingbot_map_ros.engine.imu.odometry_covariance import (DeadReckoning, FLOOR_VARIANCE,
                                                            GAP_ROTATION_SIGMA,
                                                            OdometryCovariance)
from lingbot_map_ros.imu_config import ImuConfig
from lingbot_map_ros.tools.synthetic_imu import ImuNoise
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
import numpy as np
import pytest

NOISE = ImuNoise()
SCENE = SceneConfig()


def _psd(cov: np.ndarray) -> None:
    np.testing.assert_allclose(cov, cov.T, atol=1e-15)
    assert np.linalg.eigvalsh(cov).min() > 0.0


def test_straight_line_translation_variance_grows_with_distance() -> None:
    sigma = 0.1
    reckoning = DeadReckoning(sigma)
    step = pose(np.eye(3), [0.5, 0.0, 0.0])
    for _ in range(20):  # 10 units travelled, no rotation noise
        cov = reckoning.step(step, np.zeros((3, 3)))
    np.testing.assert_allclose(np.diag(cov)[:3], [sigma ** 2 * 10.0] * 3, rtol=1e-9)
    np.testing.assert_allclose(np.diag(cov)[3:], 0.0)
    # Frame-rate independent: the same 10 units in 100 steps give the same variance.
    fine = DeadReckoning(sigma)
    for _ in range(100):
        cov_fine = fine.step(pose(np.eye(3), [0.1, 0.0, 0.0]), np.zeros((3, 3)))
    np.testing.assert_allclose(np.diag(cov_fine)[:3], np.diag(cov)[:3], rtol=1e-9)


def test_rotation_noise_grows_the_lever_arm() -> None:
    # A heading uncertainty makes the position uncertain sideways, growing with the distance
    # travelled after it (the adjoint's [t]x R block).
    reckoning = DeadReckoning(0.0)
    reckoning.step(pose(np.eye(3), [0.0, 0.0, 0.0]), np.diag([0.0, 0.0, 1e-4]))
    for _ in range(10):
        cov = reckoning.step(pose(np.eye(3), [1.0, 0.0, 0.0]), np.zeros((3, 3)))
    # Yaw variance 1e-4 over a 10-unit lever: sideways variance 1e-2, along the path none.
    assert cov[1, 1] == pytest.approx(1e-4 * 100.0, rel=1e-6)
    assert cov[0, 0] == pytest.approx(0.0, abs=1e-15)
    assert cov[5, 5] == pytest.approx(1e-4, rel=1e-9)


def test_published_in_odom_axes_ros_order_and_floored() -> None:
    reckoning = DeadReckoning(0.1)
    reckoning.step(pose(np.eye(3), [1.0, 0.0, 0.0]), np.diag([4e-6, 0.0, 0.0]))
    yawed = pose(so3.exp(np.array([0.0, 0.0, np.pi / 2])), [1.0, 0.0, 0.0])
    out = reckoning.published(yawed)
    # Body x (roll) is odom y after a quarter turn: the roll variance shows as pitch.
    assert out[4, 4] == pytest.approx(4e-6, rel=1e-9)
    assert out[3, 3] == pytest.approx(FLOOR_VARIANCE)
    np.testing.assert_allclose(np.diag(out)[:3], [0.01] * 3, rtol=1e-9)
    _psd(out)
    assert np.diag(DeadReckoning(0.1).published(np.eye(4))).tolist() == [FLOOR_VARIANCE] * 6


def test_bad_settings_and_steps_raise() -> None:
    with pytest.raises(ValueError, match='translation_sigma'):
        DeadReckoning(-1.0)
    reckoning = DeadReckoning(0.1)
    with pytest.raises(ValueError, match='non-finite'):
        reckoning.step(np.full((4, 4), np.nan), np.zeros((3, 3)))
    np.testing.assert_allclose(reckoning.covariance, 0.0)


@pytest.fixture(scope='module')
def imu():
    """Return the synthetic route in model units and a buffer with its IMU."""
    win = route(slice(0, SCENE.total_frames), noise=NOISE, scene=SCENE)
    buffer = ImuBuffer(ImuConfig(buffer_s=3600.0))
    for t, g, a in zip(win.imu_stamps, win.gyro, win.accel):
        buffer.add(float(t), g, a)
    return win, buffer


def test_the_route_covariance_grows_frame_to_frame_and_resets_at_the_anchor(imu) -> None:
    win, buffer = imu
    rotations = ImuRotations(buffer.window, NOISE.gyro_noise_density, win.mount,
                             gyro_bias=lambda: win.gyro_bias)
    odometry = OdometryCovariance(rotations, 0.1)
    mount = np.eye(4)  # base = camera
    stamps = (win.stamps * 1e9).round().astype(np.int64)
    out = [odometry.step(int(t), p, mount) for t, p in zip(stamps[:30], win.poses[:30])]
    assert np.diag(out[0]).tolist() == [FLOOR_VARIANCE] * 6  # the anchor
    for cov in out[1:]:
        _psd(cov)
        assert np.isfinite(cov).all()
    traces = [np.trace(c[:3, :3]) for c in out]
    rot = [np.trace(c[3:, 3:]) for c in out]
    assert all(b > a for a, b in zip(traces[1:], traces[2:]))  # grows with distance
    assert all(b > a for a, b in zip(rot[1:], rot[2:]))  # and with time
    # The rotation variance is the gyroscope's white noise over the 2.9 s (per axis n^2 t).
    assert rot[-1] == pytest.approx(3 * NOISE.gyro_noise_density ** 2 * 2.9, rel=0.05)
    assert odometry.gaps == 0
    # The same frame again changes nothing; a reset makes the next frame the anchor.
    np.testing.assert_allclose(odometry.step(int(stamps[29]), win.poses[29], mount), out[-1])
    odometry.reset()
    again = odometry.step(int(stamps[30]), win.poses[30], mount)
    assert np.diag(again).tolist() == [FLOOR_VARIANCE] * 6
    after = odometry.step(int(stamps[31]), win.poses[31], mount)
    assert np.trace(after) < np.trace(out[2])


def test_a_step_without_readings_takes_the_gap_noise(imu) -> None:
    win, buffer = imu
    rotations = ImuRotations(buffer.window, NOISE.gyro_noise_density, win.mount,
                             healthy=lambda t: False)
    odometry = OdometryCovariance(rotations, 0.0)
    odometry.step(1_000, np.eye(4), np.eye(4))
    cov = odometry.step(2_000, np.eye(4), np.eye(4))
    assert odometry.gaps == 1
    np.testing.assert_allclose(np.diag(cov)[3:], [GAP_ROTATION_SIGMA ** 2] * 3, rtol=1e-9)
