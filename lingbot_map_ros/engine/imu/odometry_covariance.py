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
"""Dead-reckoning covariance of the odometry: compounded frame to frame, reset at the anchor.

``~/odometry`` is a dead-reckoned pose: each frame's pose is the previous one times the model's
step, so its uncertainty grows with every step and never shrinks until ``odom`` is anchored
again (the first frame after start or a reset). With the perturbation on the right,
``T = T_est Exp(xi)``, ``xi = [rho, phi]`` (translation, rotation) in the body frame, one step
``dT`` with noise ``Q`` carries it as

    Sigma_k+1 = Ad(dT^-1) Sigma_k Ad(dT^-1)^T + Q_k,   Ad(T) = [[R, [t]x R], [0, R]].

``Q_k``'s rotation block is the gyroscope's: the preintegration's covariance of the rotation
between the two frames' stamps (``keyframe_rotation.ImuRotations``), brought into the body
frame by the mounting. A step the IMU does not cover (stream not ``ok``, readings missing) takes
:data:`GAP_ROTATION_SIGMA` per axis instead: nothing measured it, so it is uncertain by degrees,
not by the gyroscope's hundredths. The translation block is a per-distance random walk: a step
of length ``d`` adds ``sigma_t^2 d`` on each axis (``imu.odometry_translation_walk``, odom
units per square-root unit travelled), so after a distance ``D`` the standard deviation is about
``sigma_t sqrt(D)``, whatever the frame rate. The published matrix (:meth:`DeadReckoning.
published`) is rotated into the odom frame's axes (``blockdiag(R, R) Sigma blockdiag(R, R)^T``,
the frame of ``nav_msgs/Odometry``'s pose covariance) in ROS order (x y z roll pitch yaw), its
diagonal at least :data:`FLOOR_VARIANCE` (never all zero, which filters read as exact).
Nothing here imports ROS.
"""

from __future__ import annotations

import math

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.imu.keyframe_rotation import ImuRotations
import numpy as np

GAP_ROTATION_SIGMA = 0.05
"""rad per axis, the rotation noise of a step without IMU readings (about 3 degrees)."""
FLOOR_VARIANCE = 1e-9
"""Smallest published variance (the anchor itself is exact: odom is defined by it)."""


def adjoint(pose: np.ndarray) -> np.ndarray:
    """Return the [6, 6] adjoint of a rigid [4, 4] pose, tangent order (translation, rotation)."""
    rot, t = pose[:3, :3], pose[:3, 3]
    out = np.zeros((6, 6))
    out[:3, :3] = rot
    out[:3, 3:] = so3.hat(t) @ rot
    out[3:, 3:] = rot
    return out


def rigid_inverse(pose: np.ndarray) -> np.ndarray:
    """Return the inverse of a rigid [4, 4] pose."""
    out = np.eye(4)
    out[:3, :3] = pose[:3, :3].T
    out[:3, 3] = -pose[:3, :3].T @ pose[:3, 3]
    return out


class DeadReckoning:
    """The compounded covariance of a dead-reckoned pose (module docstring)."""

    def __init__(self, translation_sigma: float) -> None:
        """Start at the anchor (zero covariance).

        Args:
            translation_sigma: translation noise, odom units per square-root unit travelled.

        Raises:
            ValueError: a negative or non-finite ``translation_sigma``.
        """
        if not (math.isfinite(translation_sigma) and translation_sigma >= 0.0):
            raise ValueError(f'translation_sigma={translation_sigma} must be finite and >= 0')
        self.translation_sigma = float(translation_sigma)
        self.covariance = np.zeros((6, 6))
        """[6, 6] in the body frame of the latest pose, (translation, rotation)."""

    def reset(self) -> None:
        """Back to the anchor: zero covariance."""
        self.covariance = np.zeros((6, 6))

    def step(self, relative: np.ndarray, rotation_cov: np.ndarray) -> np.ndarray:
        """Compound one step and return the new body-frame covariance.

        Args:
            relative: [4, 4] rigid step ``inv(T_k) T_k+1``.
            rotation_cov: [3, 3] the step's rotation covariance in the body frame, rad^2.

        Raises:
            ValueError: a non-finite step or covariance (the state is unchanged).
        """
        relative = np.asarray(relative, dtype=np.float64)
        rotation_cov = np.asarray(rotation_cov, dtype=np.float64)
        if not (np.isfinite(relative).all() and np.isfinite(rotation_cov).all()):
            raise ValueError('dead reckoning: a non-finite step or covariance')
        carry = adjoint(rigid_inverse(relative))
        noise = np.zeros((6, 6))
        noise[:3, :3] = np.eye(3) * (self.translation_sigma ** 2
                                     * float(np.linalg.norm(relative[:3, 3])))
        noise[3:, 3:] = 0.5 * (rotation_cov + rotation_cov.T)
        cov = carry @ self.covariance @ carry.T + noise
        self.covariance = 0.5 * (cov + cov.T)
        return self.covariance

    def published(self, pose: np.ndarray) -> np.ndarray:
        """Return the covariance in the odom frame's axes at ``pose``, ROS order, floored."""
        rot = np.asarray(pose, dtype=np.float64)[:3, :3]
        turn = np.zeros((6, 6))
        turn[:3, :3] = turn[3:, 3:] = rot
        cov = turn @ self.covariance @ turn.T
        cov = 0.5 * (cov + cov.T)
        cov[np.diag_indices(6)] = np.maximum(np.diag(cov), FLOOR_VARIANCE)
        return cov


class OdometryCovariance:
    """``~/odometry``'s covariance from the IMU: one :class:`DeadReckoning` fed per frame."""

    def __init__(self, rotations: ImuRotations, translation_sigma: float) -> None:
        """Keep the gyroscope's rotations and the translation model.

        Raises:
            ValueError: a bad ``translation_sigma``.
        """
        self._rotations = rotations
        self._reckoning = DeadReckoning(translation_sigma)
        self._previous: tuple[int, np.ndarray] | None = None
        self.gaps = 0
        """Steps without IMU readings (:data:`GAP_ROTATION_SIGMA` used) since the start."""

    def reset(self) -> None:
        """Forget the anchor: the next frame is the new anchor (odom's origin)."""
        self._reckoning.reset()
        self._previous = None

    def step(self, stamp_ns: int, base_pose: np.ndarray,
             base_from_camera: np.ndarray) -> np.ndarray:
        """Compound the step to this frame; return its [6, 6] covariance (odom axes, ROS order).

        Args:
            stamp_ns: the frame's image stamp (camera clock).
            base_pose: [4, 4] the base's pose in odom.
            base_from_camera: [4, 4] the camera's (optical) mounting on the base.

        A frame not newer than the previous one changes nothing (its covariance is the last).
        """
        pose = np.asarray(base_pose, dtype=np.float64)
        previous = self._previous
        if previous is None:
            self._reckoning.reset()
            self._previous = (int(stamp_ns), pose)
        elif stamp_ns > previous[0]:
            rotation = self._rotations.between(previous[0] * 1e-9, stamp_ns * 1e-9)
            if rotation is None:
                self.gaps += 1
                cov = np.eye(3) * GAP_ROTATION_SIGMA ** 2
            else:
                mount = np.asarray(base_from_camera, dtype=np.float64)[:3, :3]
                cov = mount @ rotation[1] @ mount.T
            self._reckoning.step(rigid_inverse(previous[1]) @ pose, cov)
            self._previous = (int(stamp_ns), pose)
        return self._reckoning.published(pose)
