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
"""``ImuConfig`` (the ``imu.*`` settings): the IMU beside the camera (docs/imu.md).

Kept apart from :mod:`lingbot_map_ros.config` (which re-exports ``ImuConfig``) as
``metric_config.py`` is. The defaults are those of a consumer MEMS IMU of a depth camera, with
the white noise inflated about five times over the datasheet for vibration and temperature, as
calibration tools advise; ``docs/imu.md`` lists the datasheet values of two common cameras.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any

from lingbot_map_ros.metric_config import section_from_flat


@dataclass(frozen=True)
class ImuConfig:
    """The IMU's topic, mounting, clock, noise and the checks of its readings."""

    topic: str = ''
    """sensor_msgs/Imu topic (ROS parameter ``input.imu_topic``); empty: no IMU (default)."""
    frame_id: str = ''
    """Frame the readings must carry; empty: take the first message's (a message naming
    another frame is dropped and counted)."""
    imu_from_camera: tuple[float, ...] = ()
    """Mounting as x y z qx qy qz qw (camera optical frame into the IMU frame, metres); empty:
    the identity. The node defaults to the identity (the IMU at the camera) and replaces it by
    ``frame_id`` <- the camera's optical frame from /tf_static when tf2_ros finds it there."""
    time_offset_s: float = 0.0
    """IMU clock minus camera clock, seconds: subtracted from every IMU stamp."""
    gyro_noise_density: float = 1.5e-3
    """Gyroscope white noise, rad/s/sqrt(Hz)."""
    accel_noise_density: float = 1.0e-2
    """Accelerometer white noise, m/s^2/sqrt(Hz)."""
    gyro_random_walk: float = 2.0e-5
    """Gyroscope bias random walk, rad/s^2/sqrt(Hz)."""
    accel_random_walk: float = 3.0e-4
    """Accelerometer bias random walk, m/s^3/sqrt(Hz)."""
    gyro_range: float = 34.9
    """rad/s full scale of the gyroscope (2000 deg/s); a component at 98 % of it is saturated
    and the reading dropped (0: no check)."""
    accel_range: float = 156.9
    """m/s^2 full scale of the accelerometer (16 g); checked as ``gyro_range`` (0: no check)."""
    min_rate_hz: float = 50.0
    """Below this reading rate the fusion pauses (a WARN): preintegration needs dense readings
    (0: no rate floor; ``max_gap_s`` still refuses windows with gaps)."""
    max_gap_s: float = 0.05
    """A window with a longer stretch without readings is not aligned."""
    max_future_s: float = 0.5
    """Readings stamped this far past the newest image (or the clock) are dropped."""
    buffer_s: float = 30.0
    """Seconds of readings kept for the alignment window."""
    odometry_translation_walk: float = 0.1
    """``~/odometry``'s translation noise, odom units per square-root unit travelled: its
    covariance grows by this squared times each step's length (``odometry_covariance.py``)."""

    def __post_init__(self) -> None:
        """Reject out-of-range values."""
        for name in ('time_offset_s', 'gyro_noise_density', 'accel_noise_density',
                     'gyro_random_walk', 'accel_random_walk', 'gyro_range', 'accel_range',
                     'min_rate_hz', 'max_gap_s', 'max_future_s', 'buffer_s',
                     'odometry_translation_walk'):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f'imu.{name}={value} must be finite')
            if name != 'time_offset_s' and value < 0.0:
                raise ValueError(f'imu.{name}={value} must be >= 0')
        if abs(self.time_offset_s) > 1.0:
            raise ValueError(f'imu.time_offset_s={self.time_offset_s} must be within 1 s')
        # Noise of zero is an infinitely certain reading, a zero horizon drops every reading
        # newer than the latest image: neither is a setting.
        for name in ('max_gap_s', 'buffer_s', 'max_future_s', 'gyro_noise_density',
                     'accel_noise_density', 'gyro_random_walk', 'accel_random_walk',
                     'odometry_translation_walk'):
            if getattr(self, name) <= 0.0:
                raise ValueError(f'imu.{name}={getattr(self, name)} must be > 0')
        if self.imu_from_camera:
            mount = tuple(float(v) for v in self.imu_from_camera)
            if len(mount) != 7 or not all(math.isfinite(v) for v in mount):
                raise ValueError('imu.imu_from_camera must be 7 finite numbers '
                                 '(x y z qx qy qz qw) or empty')
            if abs(math.sqrt(sum(v * v for v in mount[3:])) - 1.0) > 1e-3:
                raise ValueError('imu.imu_from_camera quaternion must have unit norm')
            object.__setattr__(self, 'imu_from_camera', mount)

    @property
    def enabled(self) -> bool:
        """Return True when an IMU topic is set."""
        return bool(self.topic)

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> 'ImuConfig':
        """Build from the ``imu.*`` keys of flat parameter values (other keys are ignored).

        Raises:
            ValueError: unknown ``imu.*`` key or bad value.
        """
        return section_from_flat(cls, 'imu', values)
