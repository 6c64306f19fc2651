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
"""IMU preintegration between two instants: relative rotation, velocity and position increments.

The increments are those of the on-manifold preintegration published by Forster et al.
(RSS 2015 / T-RO 2017), in the body (IMU) frame of the first instant, gravity left out:

    dR(t1) = prod exp((w - bg) dt),  dv(t1) = sum dR (a - ba) dt,
    dp(t1) = sum dv dt + 1/2 dR (a - ba) dt^2,

with their first-order Jacobians with respect to the gyroscope and accelerometer biases, so a
new bias estimate corrects them without integrating again, and the rotation's covariance from
the gyroscope's white noise (for a rotation factor between keyframes). Readings are held
linearly between samples; the two ends are interpolated at ``t0`` and ``t1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lingbot_map_ros.engine.imu import so3
import numpy as np


@dataclass(frozen=True)
class Preintegrated:
    """Increments of one interval between two instants, at the biases they were integrated with."""

    dt: float
    """Length of the interval, seconds."""
    delta_r: np.ndarray
    """[3, 3] rotation of the body at ``t1`` in the body frame at ``t0``."""
    delta_v: np.ndarray
    """[3] velocity increment (specific force only), body frame at ``t0``, m/s."""
    delta_p: np.ndarray
    """[3] position increment (specific force only), body frame at ``t0``, metres."""
    gyro_bias: np.ndarray
    """[3] gyroscope bias the readings were corrected with, rad/s."""
    accel_bias: np.ndarray
    """[3] accelerometer bias the readings were corrected with, m/s^2."""
    jr_bg: np.ndarray
    """[3, 3] d log(delta_r) / d gyro bias (right perturbation)."""
    jv_bg: np.ndarray
    """[3, 3] d delta_v / d gyro bias."""
    jv_ba: np.ndarray
    """[3, 3] d delta_v / d accel bias."""
    jp_bg: np.ndarray
    """[3, 3] d delta_p / d gyro bias."""
    jp_ba: np.ndarray
    """[3, 3] d delta_p / d accel bias."""
    rotation_cov: np.ndarray
    """[3, 3] covariance of log(delta_r) from the gyroscope's white noise, rad^2."""
    samples: int
    """IMU readings strictly inside the interval (the two ends are interpolated)."""

    def rotation(self, gyro_bias: np.ndarray) -> np.ndarray:
        """Return ``delta_r`` corrected to first order for another gyroscope bias."""
        return self.delta_r @ so3.exp(self.jr_bg @ (gyro_bias - self.gyro_bias))

    def velocity(self, gyro_bias: np.ndarray, accel_bias: np.ndarray) -> np.ndarray:
        """Return ``delta_v`` corrected to first order for other biases."""
        return (self.delta_v + self.jv_bg @ (gyro_bias - self.gyro_bias)
                + self.jv_ba @ (accel_bias - self.accel_bias))

    def position(self, gyro_bias: np.ndarray, accel_bias: np.ndarray) -> np.ndarray:
        """Return ``delta_p`` corrected to first order for other biases."""
        return (self.delta_p + self.jp_bg @ (gyro_bias - self.gyro_bias)
                + self.jp_ba @ (accel_bias - self.accel_bias))


def _reading_at(stamps: np.ndarray, values: np.ndarray, t: float) -> np.ndarray:
    """Return the reading linearly interpolated at ``t`` (held at the ends)."""
    return np.array([np.interp(t, stamps, values[:, i]) for i in range(3)])


def preintegrate(imu_stamps: np.ndarray, gyro: np.ndarray, accel: np.ndarray, t0: float,
                 t1: float, gyro_bias: np.ndarray | None = None,
                 accel_bias: np.ndarray | None = None,
                 gyro_noise_density: float = 0.0) -> Preintegrated:
    """Integrate the readings between ``t0`` and ``t1`` (midpoint rule).

    Args:
        imu_stamps: [M] increasing seconds; must cover ``[t0, t1]``.
        gyro: [M, 3] angular rate, rad/s, IMU frame.
        accel: [M, 3] specific force, m/s^2, IMU frame.
        t0: start of the interval, seconds (same clock).
        t1: end, seconds, > ``t0``.
        gyro_bias: [3] subtracted from ``gyro`` (default zero).
        accel_bias: [3] subtracted from ``accel`` (default zero).
        gyro_noise_density: gyroscope white noise, rad/s/sqrt(Hz), for ``rotation_cov``.

    Returns:
        The increments with their bias Jacobians.

    Raises:
        ValueError: ``t1 <= t0`` or the readings do not cover the interval.
    """
    if not t1 > t0:
        raise ValueError(f'preintegration interval [{t0}, {t1}] is empty')
    if imu_stamps[0] > t0 or imu_stamps[-1] < t1:
        raise ValueError(f'IMU readings [{imu_stamps[0]:.6f}, {imu_stamps[-1]:.6f}] s do not '
                         f'cover the interval [{t0:.6f}, {t1:.6f}] s')
    bg = np.zeros(3) if gyro_bias is None else np.asarray(gyro_bias, dtype=np.float64)
    ba = np.zeros(3) if accel_bias is None else np.asarray(accel_bias, dtype=np.float64)
    inside = np.flatnonzero((imu_stamps > t0) & (imu_stamps < t1))
    times = np.concatenate([[t0], imu_stamps[inside], [t1]])
    w = np.vstack([_reading_at(imu_stamps, gyro, t0), gyro[inside],
                   _reading_at(imu_stamps, gyro, t1)]) - bg
    a = np.vstack([_reading_at(imu_stamps, accel, t0), accel[inside],
                   _reading_at(imu_stamps, accel, t1)]) - ba
    d_r = np.eye(3)
    d_v = np.zeros(3)
    d_p = np.zeros(3)
    jr_bg = np.zeros((3, 3))
    jv_bg = np.zeros((3, 3))
    jv_ba = np.zeros((3, 3))
    jp_bg = np.zeros((3, 3))
    jp_ba = np.zeros((3, 3))
    cov = np.zeros((3, 3))
    for k in range(len(times) - 1):
        h = times[k + 1] - times[k]
        if h <= 0.0:
            continue
        w_mid = 0.5 * (w[k] + w[k + 1])
        a_mid = 0.5 * (a[k] + a[k + 1])
        step = w_mid * h
        step_r = so3.exp(step)
        # The specific force acts over the step; rotate it by the attitude halfway through.
        half_r = so3.exp(0.5 * step)
        r_half = d_r @ half_r
        acc = r_half @ a_mid
        acc_hat = r_half @ so3.hat(a_mid)
        # The halfway attitude's own bias Jacobian (the half step depends on the bias too).
        jr_half = half_r.T @ jr_bg - so3.right_jacobian(0.5 * step) * (0.5 * h)
        # Jacobians before the state moves (they use the state at the step's start).
        jp_ba = jp_ba + jv_ba * h - 0.5 * r_half * h * h
        jp_bg = jp_bg + jv_bg * h - 0.5 * acc_hat @ jr_half * h * h
        jv_ba = jv_ba - r_half * h
        jv_bg = jv_bg - acc_hat @ jr_half * h
        jr = so3.right_jacobian(step)
        jr_bg = step_r.T @ jr_bg - jr * h
        if gyro_noise_density > 0.0:
            cov = step_r.T @ cov @ step_r + jr @ jr.T * (gyro_noise_density ** 2 * h)
        d_p = d_p + d_v * h + 0.5 * acc * h * h
        d_v = d_v + acc * h
        d_r = d_r @ step_r
    return Preintegrated(dt=float(t1 - t0), delta_r=d_r, delta_v=d_v, delta_p=d_p,
                         gyro_bias=bg, accel_bias=ba, jr_bg=jr_bg, jv_bg=jv_bg, jv_ba=jv_ba,
                         jp_bg=jp_bg, jp_ba=jp_ba, rotation_cov=cov, samples=int(inside.size))
