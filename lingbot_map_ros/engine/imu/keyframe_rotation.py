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
"""The gyroscope's rotation between two camera stamps: what the pose graph and ``~/odometry`` fuse.

:class:`ImuRotations` sits over the IMU reading buffer (its ``window(t0, t1)``, on the camera
clock: ``imu.time_offset_s`` is already applied there), the stream's health and the scale
tracker's gyroscope bias. :meth:`ImuRotations.between` preintegrates the readings between two
stamps (``preintegration.py``) and returns the camera's relative rotation with its covariance
from the gyroscope's white noise (``imu_factors.camera_rotation``), or None with the reason when
the stream is not ``ok`` or the readings do not cover the interval.
:meth:`ImuRotations.keyframe` is the same for consecutive keyframes, counted: the mapping back
end puts each one it gets beside the keyframe's odometry edge as a rotation factor
(``PoseGraph.add_node``), and the ``loop`` status shows the factors added and skipped.

The bias is the latest one the tracker's alignments found (kept across its sessions: the
sensor's bias does not change with them), applied as the first-order correction of the
preintegration (``Preintegrated.rotation``). Until one is known the gyroscope's turn-on bias
(tenths of a degree per second on consumer parts) is a drift the white noise does not describe:
:meth:`ImuRotations.keyframe` gives no graph factor then (skipped as ``no_bias``: a factor that
tight would pull the graph's rotations along the bias), and :meth:`ImuRotations.between` adds
the rotation that bias could make (:data:`UNKNOWN_BIAS_SIGMA` times the interval) to the
covariance. Nothing here imports ROS.
"""

from __future__ import annotations

import math
from typing import Callable

from lingbot_map_ros.engine.imu.imu_factors import camera_rotation
from lingbot_map_ros.engine.imu.preintegration import preintegrate
import numpy as np

ImuWindow = Callable[[float, float], 'tuple[np.ndarray, np.ndarray, np.ndarray] | None']
"""``(t0, t1) -> (stamps, gyro, accel)`` covering ``[t0, t1]`` on the camera clock, or None."""
STAMP_TOLERANCE_S = 1e-6
"""Readings that stop this close to an end still cover it: one instant converted twice (the
image's nanoseconds, the IMU message's seconds) differs in the last bits."""
SKIP_REASONS: tuple[str, ...] = ('not_ok', 'not_covered', 'bad_interval', 'no_bias')
"""Why a keyframe got no rotation: the stream not ``ok``, readings short of the interval,
stamps not increasing / not finite, or no gyroscope bias estimated yet."""
UNKNOWN_BIAS_SIGMA = 0.01
"""rad/s per axis: the gyroscope bias before an alignment estimated it (about 0.6 deg/s, the
order of a consumer MEMS gyroscope's zero-rate offset)."""


class ImuRotations:
    """Gyroscope rotations between camera stamps, with the keyframes' counts (module docstring)."""

    def __init__(self, window: ImuWindow, gyro_noise_density: float,
                 imu_from_camera: np.ndarray | None = None,
                 healthy: Callable[[float], bool] = lambda t: True,
                 gyro_bias: Callable[[], np.ndarray | None] = lambda: None) -> None:
        """Keep the sources.

        Args:
            window: the readings covering an interval (``ImuInput.window``).
            gyro_noise_density: gyroscope white noise, rad/s/sqrt(Hz) (``imu.gyro_noise_density``).
            imu_from_camera: [4, 4] mounting (None: identity).
            healthy: ``t -> bool``, whether the stream is ``ok`` at camera time ``t``.
            gyro_bias: the current gyroscope bias estimate [3] rad/s, or None (zero is used).

        Raises:
            ValueError: a negative or non-finite noise density.
        """
        if not (math.isfinite(gyro_noise_density) and gyro_noise_density >= 0.0):
            raise ValueError(f'gyro_noise_density={gyro_noise_density} must be finite and >= 0')
        self._window = window
        self._noise = float(gyro_noise_density)
        self._mount = None if imu_from_camera is None else np.asarray(imu_from_camera, np.float64)
        self._healthy = healthy
        self._gyro_bias = gyro_bias
        self._known_bias: np.ndarray | None = None
        self.added = 0
        """Keyframe rotations handed out (:meth:`keyframe`) since the start."""
        self.skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        """Keyframes without a rotation since the start, by reason."""
        self.last_reason = ''
        """Why the latest :meth:`between` gave None ('' when it gave a rotation)."""

    @property
    def num_skipped(self) -> int:
        """Return the keyframes without a rotation since the start, all reasons."""
        return sum(self.skipped.values())

    def bias(self) -> np.ndarray | None:
        """Return the gyroscope bias in use: the latest finite one the tracker gave, or None."""
        bias = self._gyro_bias()
        if bias is not None:
            bias = np.asarray(bias, dtype=np.float64).reshape(-1)
            if bias.shape == (3,) and np.isfinite(bias).all():
                self._known_bias = bias
        return self._known_bias

    def between(self, t0_s: float, t1_s: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Return the camera's rotation from ``t0_s`` to ``t1_s`` and its covariance, or None.

        Returns:
            ``(R [3, 3], cov [3, 3])`` (``R_c0^T R_c1``, rad^2) or None; then
            :attr:`last_reason` says why (one of :data:`SKIP_REASONS`).
        """
        t0, t1 = float(t0_s), float(t1_s)
        if not (math.isfinite(t0) and math.isfinite(t1) and t1 > t0):
            return self._none('bad_interval')
        if not self._healthy(t1):
            return self._none('not_ok')
        readings = self._window(t0, t1)
        if readings is None and t1 - t0 > 2.0 * STAMP_TOLERANCE_S:
            readings = self._window(t0 + STAMP_TOLERANCE_S, t1 - STAMP_TOLERANCE_S)
        if readings is None or len(readings[0]) < 2:
            return self._none('not_covered')
        stamps, gyro, accel = readings
        t0, t1 = max(t0, float(stamps[0])), min(t1, float(stamps[-1]))
        try:
            pre = preintegrate(stamps, gyro, accel, t0, t1, gyro_noise_density=self._noise)
        except ValueError:
            return self._none('not_covered')
        self.last_reason = ''
        bias = self.bias()
        rotation, cov = camera_rotation(pre, np.zeros(3) if bias is None else bias, self._mount)
        if bias is None:  # what an unknown bias could turn over the interval
            cov = cov + np.eye(3) * (UNKNOWN_BIAS_SIGMA * (t1 - t0)) ** 2
        return rotation, cov

    def keyframe(self, t0_s: float, t1_s: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Return :meth:`between` for two consecutive keyframes, counted (added or skipped).

        None (``no_bias``) until a gyroscope bias is known (module docstring).
        """
        result = self.between(t0_s, t1_s)
        if result is not None and self._known_bias is None:
            result = self._none('no_bias')
        if result is None:
            self.skipped[self.last_reason] += 1
        else:
            self.added += 1
        return result

    def _none(self, reason: str) -> None:
        self.last_reason = reason
        return None
