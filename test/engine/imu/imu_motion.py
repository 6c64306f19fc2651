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
"""Motions for the IMU tests: keyframes and IMU readings of any smooth trajectory, or the route.

Imported by the IMU tests beside it (pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import functools

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.tools.synthetic_imu import (
    DEFAULT_IMU_FROM_CAMERA, frame_poses, imu_readings, ImuNoise, synthetic_imu)
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
import numpy as np

MODEL_UNITS = 0.37
"""Metres per model unit the test keyframes are expressed in (the scale to recover)."""


@dataclass(frozen=True)
class Window:
    """Inputs of an alignment with the truth."""

    poses: np.ndarray
    stamps: np.ndarray
    imu_stamps: np.ndarray
    gyro: np.ndarray
    accel: np.ndarray
    mount: np.ndarray
    gravity: np.ndarray
    gyro_bias: np.ndarray

    def args(self) -> tuple[np.ndarray, ...]:
        """Return the positional arguments of an alignment (poses to accel)."""
        return self.poses, self.stamps, self.imu_stamps, self.gyro, self.accel


def pose(rotation: np.ndarray, position: object) -> np.ndarray:
    """Return the [4, 4] transform of a rotation and a position."""
    out = np.eye(4)
    out[:3, :3] = rotation
    out[:3, 3] = position
    return out


def along(room_from_imu: Callable[[float], np.ndarray], duration: float,
          noise: ImuNoise = ImuNoise(), rate_hz: float = 200.0, fps: float = 10.0,
          seed: int = 1) -> Window:
    """Return keyframes at ``fps`` (model units) and readings of an IMU moving as given.

    ``room_from_imu(t)`` is the IMU's pose at ``t`` seconds in a z-up frame; the camera is the
    synthetic mounting's; the keyframes' world is the first camera.
    """
    h = 1.0 / rate_hz / 4.0
    count = int(round(duration * rate_hz)) + 1
    dense = np.stack([room_from_imu(i * h) for i in range(4 * count + 1)])
    gyro, accel, bias, _ = imu_readings(dense, 1.0 / rate_hz, noise, seed)
    stamps = np.arange(0.0, duration - 1e-9, 1.0 / fps)
    cams = np.stack([room_from_imu(t) @ DEFAULT_IMU_FROM_CAMERA for t in stamps])
    world = np.linalg.inv(cams[0])
    poses = world @ cams
    poses[:, :3, 3] /= MODEL_UNITS
    return Window(poses, stamps, np.arange(count) / rate_hz, gyro, accel,
                  DEFAULT_IMU_FROM_CAMERA, world[:3, :3] @ np.array([0.0, 0.0, -1.0]),
                  bias.mean(axis=0))


@functools.lru_cache(maxsize=8)
def _route_imu(scene: SceneConfig, noise: ImuNoise, seed: int) -> object:
    """Return the route's IMU (cached: the tests share a few)."""
    return synthetic_imu(scene, noise=noise, seed=seed)


def route(frames: slice, noise: ImuNoise = ImuNoise(), seed: int = 0,
          scene: SceneConfig = SceneConfig()) -> Window:
    """Return the chosen keyframes of the synthetic loop in model units, with its IMU."""
    imu = _route_imu(scene, noise, seed)
    poses = frame_poses(scene)
    poses[:, :3, 3] /= MODEL_UNITS
    stamps = np.arange(scene.total_frames) / scene.fps
    return Window(poses[frames], stamps[frames], (imu.stamps_ns - scene.start_ns) * 1e-9,
                  imu.gyro, imu.accel, imu.imu_from_camera, imu.gravity,
                  imu.gyro_bias.mean(axis=0))


def gravity_error_deg(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Return the angle between two gravity directions in degrees."""
    return float(np.degrees(so3.angle_between(estimate, truth)))
