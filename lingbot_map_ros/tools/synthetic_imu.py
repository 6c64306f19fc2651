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
"""IMU readings of the synthetic route: gyroscope and accelerometer from its exact trajectory.

The camera of :mod:`synthetic_scene` follows a smooth closed curve; sampling
:func:`synthetic_scene.camera_path` at a multiple of the frame rate gives poses on the very same
curve between the frames, so the IMU's ground truth is that curve's angular rate and specific
force (central differences at four times the IMU rate), in an IMU frame mounted on the camera by
``imu_from_camera``. Noise as an IMU datasheet gives it is then added: white noise from the noise
densities, a constant turn-on bias plus a random walk for each sensor. Gravity is -z of the
z-up room; ``gravity`` gives it in the sequence's world frame (the first camera).

The stamps are on the IMU's clock: ``camera time + time_offset_s`` (so a consumer subtracts the
offset to bring them to the camera clock).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
import json
from pathlib import Path
from typing import Any

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.imu.alignment import STANDARD_GRAVITY
from lingbot_map_ros.ros.messages.conversions import ns_to_sec_nanosec
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.synthetic_scene import camera_path, SceneConfig
import numpy as np

_OVERSAMPLE = 4
IMU_TYPE = 'sensor_msgs/msg/Imu'
DEFAULT_FRAME_ID = 'imu_link'


def _default_mount() -> np.ndarray:
    """IMU axes x forward, y left, z up (ROS body axes) 2 cm beside the optical centre."""
    mount = np.eye(4)
    # Rows: IMU axes in camera optical coordinates (x right, y down, z forward).
    mount[:3, :3] = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    mount[:3, 3] = [0.005, -0.02, 0.004]
    return mount


DEFAULT_IMU_FROM_CAMERA = _default_mount()
"""[4, 4] maps camera optical points into the synthetic IMU frame (metres)."""


@dataclass(frozen=True)
class ImuNoise:
    """Noise of the synthetic IMU (continuous-time densities, as datasheets and Kalibr give)."""

    gyro_noise_density: float = 3e-4
    """rad/s/sqrt(Hz) white noise of the gyroscope."""
    accel_noise_density: float = 2e-3
    """m/s^2/sqrt(Hz) white noise of the accelerometer."""
    gyro_random_walk: float = 2e-5
    """rad/s^2/sqrt(Hz) of the gyroscope bias."""
    accel_random_walk: float = 3e-4
    """m/s^3/sqrt(Hz) of the accelerometer bias."""
    gyro_bias: tuple[float, float, float] = (0.012, -0.008, 0.005)
    """rad/s turn-on bias of the gyroscope."""
    accel_bias: tuple[float, float, float] = (0.04, -0.06, 0.03)
    """m/s^2 turn-on bias of the accelerometer."""

    def __post_init__(self) -> None:
        """Reject negative densities."""
        for name in ('gyro_noise_density', 'accel_noise_density', 'gyro_random_walk',
                     'accel_random_walk'):
            if getattr(self, name) < 0.0:
                raise ValueError(f'IMU noise {name} must be >= 0')


NOISELESS = ImuNoise(0.0, 0.0, 0.0, 0.0, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
"""No noise and no bias: the exact readings."""


@dataclass(frozen=True)
class SyntheticImu:
    """IMU readings of a synthetic sequence with their truth."""

    stamps_ns: np.ndarray
    """[M] int64, IMU clock (camera clock + ``time_offset_s``)."""
    gyro: np.ndarray
    """[M, 3] rad/s, IMU frame."""
    accel: np.ndarray
    """[M, 3] m/s^2 specific force, IMU frame."""
    gravity: np.ndarray
    """[3] unit vector gravity pulls along, in the sequence's world frame (the first camera)."""
    imu_from_camera: np.ndarray
    """[4, 4] the mounting used."""
    gyro_bias: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    """[M, 3] true gyroscope bias at each reading, rad/s."""
    accel_bias: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    """[M, 3] true accelerometer bias at each reading, m/s^2."""
    time_offset_s: float = 0.0
    """IMU clock minus camera clock, seconds."""


def imu_readings(room_from_imu: np.ndarray, dt: float, noise: ImuNoise = ImuNoise(),
                 seed: int = 0) -> tuple[np.ndarray, ...]:
    """Return the readings of an IMU moving along densely sampled poses in a z-up frame.

    Args:
        room_from_imu: [K * 4 + 1, 4, 4] poses of the IMU, ``dt / 4`` s apart, metres, in a
            frame whose +z is up (gravity along -z).
        dt: seconds between readings (every fourth pose is a reading).
        noise: white noise and biases.
        seed: seed of the noise.

    Returns:
        ``(gyro, accel, gyro_bias, accel_bias)``, each [K, 3] (rad/s, m/s^2).
    """
    h = dt / _OVERSAMPLE
    count = (room_from_imu.shape[0] - 1) // _OVERSAMPLE
    rot = room_from_imu[:, :3, :3]
    acc_room = np.gradient(np.gradient(room_from_imu[:, :3, 3], h, axis=0), h, axis=0)
    g_room = np.array([0.0, 0.0, -STANDARD_GRAVITY])
    gyro = np.zeros((count, 3))
    accel = np.zeros((count, 3))
    for j in range(count):
        i = j * _OVERSAMPLE
        lo = max(i - 1, 0)
        gyro[j] = so3.log(rot[lo].T @ rot[i + 1]) / (h * (i + 1 - lo))
        accel[j] = rot[i].T @ (acc_room[i] - g_room)
    rng = np.random.default_rng(seed)
    walk = rng.standard_normal((2, count, 3)) * np.sqrt(dt)
    white = rng.standard_normal((2, count, 3)) / np.sqrt(dt)
    bg = np.asarray(noise.gyro_bias, np.float64) + np.cumsum(walk[0], 0) * noise.gyro_random_walk
    ba = (np.asarray(noise.accel_bias, np.float64)
          + np.cumsum(walk[1], 0) * noise.accel_random_walk)
    gyro = gyro + bg + white[0] * noise.gyro_noise_density
    accel = accel + ba + white[1] * noise.accel_noise_density
    return gyro, accel, bg, ba


def frame_poses(scene: SceneConfig) -> np.ndarray:
    """Return the exact ``c2w`` of the frames (world = first camera) without rendering them."""
    path = camera_path(scene.num_frames, scene.laps)
    return np.linalg.inv(path[0]) @ path


def _dense_path(scene: SceneConfig, per_frame: int, count: int) -> np.ndarray:
    """Return ``count`` room poses ``1 / (fps * per_frame)`` s apart from the first frame on."""
    lap = scene.num_frames * per_frame
    if scene.laps == 1:
        return camera_path(lap, 1)[np.arange(count) % lap]
    # Later laps keep rising: drive as many as needed (at least one more than the scene's).
    laps = max(scene.laps + 1, -(-count // lap))
    return camera_path(lap, laps)[:count]


def synthetic_imu(scene: SceneConfig = SceneConfig(), rate_hz: float = 200.0,
                  noise: ImuNoise = ImuNoise(), seed: int = 0, time_offset_s: float = 0.0,
                  imu_from_camera: np.ndarray | None = None,
                  tail_s: float = 0.25) -> SyntheticImu:
    """Return IMU readings along the scene's route, from its first frame to ``tail_s`` past it.

    Args:
        scene: the route (frame rate, frames, laps); the stamps start at ``scene.start_ns``.
        rate_hz: IMU rate; must be a whole multiple of ``scene.fps``.
        noise: white noise and biases (:data:`NOISELESS` for the exact readings).
        seed: seed of the noise.
        time_offset_s: added to every IMU stamp (IMU clock minus camera clock).
        imu_from_camera: [4, 4] mounting (default :data:`DEFAULT_IMU_FROM_CAMERA`).
        tail_s: seconds of readings after the last frame.

    Returns:
        The readings with their truth.

    Raises:
        ValueError: ``rate_hz`` not a whole multiple of the frame rate, or ``tail_s < 0``.
    """
    ratio = rate_hz / scene.fps
    per_frame = int(round(ratio))
    if per_frame < 1 or abs(ratio - per_frame) > 1e-9:
        raise ValueError(f'IMU rate {rate_hz} Hz is not a whole multiple of {scene.fps} fps')
    if tail_s < 0.0:
        raise ValueError(f'tail_s={tail_s} must be >= 0')
    mount = DEFAULT_IMU_FROM_CAMERA if imu_from_camera is None else np.asarray(imu_from_camera)
    dt = 1.0 / rate_hz
    count = (scene.total_frames - 1) * per_frame + int(np.ceil(tail_s * rate_hz)) + 1
    dense = _dense_path(scene, per_frame * _OVERSAMPLE, count * _OVERSAMPLE + 1)
    gyro, accel, bg, ba = imu_readings(dense @ np.linalg.inv(mount), dt, noise, seed)
    # Whole nanoseconds first: start_ns (about 1.7e18) does not survive float64.
    stamps = scene.start_ns + np.rint((np.arange(count) * dt + time_offset_s) * 1e9
                                      ).astype(np.int64)
    world_from_room = np.linalg.inv(dense[0])  # the first camera
    gravity = world_from_room[:3, :3] @ np.array([0.0, 0.0, -1.0])
    return SyntheticImu(stamps_ns=stamps, gyro=gyro, accel=accel, gravity=gravity,
                        imu_from_camera=mount, gyro_bias=bg, accel_bias=ba,
                        time_offset_s=float(time_offset_s))


def imu_message(stamp_ns: int, gyro: np.ndarray, accel: np.ndarray, frame_id: str,
                noise: ImuNoise = ImuNoise(), rate_hz: float = 200.0) -> Any:
    """Build a ``sensor_msgs/Imu`` (``rosbags`` dataclass) of one reading, no orientation.

    The covariances are the white noise's per-reading variances (density^2 * rate); the
    orientation covariance's first element is -1: no orientation estimate (REP 145).
    """
    types = bag_io.TYPESTORE.types
    sec, nanosec = ns_to_sec_nanosec(int(stamp_ns))
    header = types['std_msgs/msg/Header'](
        stamp=types['builtin_interfaces/msg/Time'](sec=sec, nanosec=nanosec), frame_id=frame_id)
    vector = types['geometry_msgs/msg/Vector3']
    no_orientation = np.zeros(9)
    no_orientation[0] = -1.0
    identity = types['geometry_msgs/msg/Quaternion'](x=0.0, y=0.0, z=0.0, w=1.0)
    return types[IMU_TYPE](
        header=header, orientation=identity,
        orientation_covariance=no_orientation,
        angular_velocity=vector(x=float(gyro[0]), y=float(gyro[1]), z=float(gyro[2])),
        angular_velocity_covariance=np.eye(3).reshape(-1) * noise.gyro_noise_density ** 2
        * rate_hz,
        linear_acceleration=vector(x=float(accel[0]), y=float(accel[1]), z=float(accel[2])),
        linear_acceleration_covariance=np.eye(3).reshape(-1) * noise.accel_noise_density ** 2
        * rate_hz)


def bag_messages(imu: SyntheticImu, topic: str, frame_id: str = DEFAULT_FRAME_ID,
                 noise: ImuNoise = ImuNoise(), rate_hz: float = 200.0
                 ) -> list[tuple[str, int, Any]]:
    """Return ``(topic, stamp_ns, message)`` of every reading, recorded at its stamp."""
    return [(topic, int(t), imu_message(int(t), g, a, frame_id, noise, rate_hz))
            for t, g, a in zip(imu.stamps_ns, imu.gyro, imu.accel)]


def write_truth(path: str | Path, imu: SyntheticImu, map_from_world: np.ndarray, topic: str,
                frame_id: str, noise: ImuNoise, rate_hz: float) -> None:
    """Write the IMU's truth beside the bag: mounting, gravity in the map axes, offset, noise.

    Args:
        path: output JSON file.
        imu: the readings written.
        map_from_world: [4, 4] map axes of the ground truth (``map_axes_transform``).
        topic: the IMU topic.
        frame_id: its frame.
        noise: the noise added.
        rate_hz: the reading rate.
    """
    gravity_map = np.asarray(map_from_world)[:3, :3] @ imu.gravity
    Path(path).write_text(json.dumps({
        'topic': topic, 'frame_id': frame_id, 'rate_hz': rate_hz,
        'imu_from_camera': imu.imu_from_camera.tolist(),
        'gravity_map': gravity_map.tolist(), 'time_offset_s': imu.time_offset_s,
        'noise': asdict(noise),
        'mean_gyro_bias': imu.gyro_bias.mean(axis=0).tolist(),
        'mean_accel_bias': imu.accel_bias.mean(axis=0).tolist()}, indent=2) + '\n')
