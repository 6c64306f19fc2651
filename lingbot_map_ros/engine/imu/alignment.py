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
"""Visual-inertial alignment: metric scale, gravity, velocities and gyroscope bias of a window.

The initialisation published with VINS-Mono (Qin et al., T-RO 2018) and refined in ORB-SLAM3
(Campos et al., T-RO 2021), written here for the model's keyframes:

1. **Gyroscope bias.** The model's rotations are taken as exact; the bias is the one that makes
   the preintegrated gyroscope rotation between consecutive keyframes equal the model's
   relative rotation (Gauss-Newton on the bias Jacobian, integrating again each round).
2. **Scale, gravity, velocities.** With the bias fixed, each pair of consecutive keyframes gives
   six equations linear in the per-keyframe velocities, the gravity vector and the scale:
   ``s dp_c - v_k dt - g dt^2 / 2 = R_k dp_imu - (R_k+1 - R_k) p_cb`` and
   ``v_k+1 - v_k - g dt = R_k dv_imu`` (world frame of the poses). Solved by least squares, the
   free gravity's magnitude is a first sanity check.
3. **Gravity refinement.** Gravity's magnitude is known, so it is re-solved on the tangent plane
   of its direction (two unknowns) with the scale, the velocities and an accelerometer bias
   held near zero by a prior, a few rounds.
4. **Degenerate motion.** The scale is observable only if no other unknown can take its role:
   the solved system's scale column is projected out of the span of the other columns; what is
   left, times the scale, against the fit residual gives the scale's relative standard error.
   Constant velocity (velocities absorb a scale change) and pure rotation (no translation to
   scale) both leave it near zero, so ``ok`` is False. Gaps in the IMU, a rotation the gyroscope
   does not confirm and an implausible gravity also give ``ok`` False, with a ``reason``.

numpy only; the pure contract is :func:`align_visual_inertial`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.imu.preintegration import preintegrate, Preintegrated
import numpy as np

STANDARD_GRAVITY = 9.80665
"""m/s^2, the magnitude the refinement holds gravity to."""


@dataclass(frozen=True)
class AlignmentOptions:
    """Thresholds of :func:`align`; the defaults are those of :func:`align_visual_inertial`."""

    gravity_magnitude: float = STANDARD_GRAVITY
    """m/s^2, gravity's magnitude in the refinement."""
    max_gravity_error: float = 0.15
    """Relative error of the free gravity's magnitude above which the window is rejected."""
    max_scale_rel_std: float = 0.01
    """Relative standard error of the scale above which the motion is called degenerate."""
    min_residual: float = 0.001
    """m/s, floor of the fit residual in the standard error (an exact fit proves nothing)."""
    max_imu_gap_s: float = 0.05
    """Seconds between IMU readings above which the window is not used (a silent or slow IMU)."""
    max_rotation_residual: float = 0.008
    """rad, RMS disagreement of gyroscope and model rotations between keyframes, after the bias
    is removed, above which the window is rejected (wrong mounting, time offset or readings)."""
    accel_bias_prior: float = 0.05
    """Weight, (m/s) per (m/s^2), pulling the accelerometer bias to zero in the refinement."""
    refine_rounds: int = 4
    """Rounds of the gravity refinement."""
    gyro_bias_rounds: int = 5
    """Most Gauss-Newton rounds of the gyroscope bias."""

    def __post_init__(self) -> None:
        """Reject out-of-range values."""
        for name in ('gravity_magnitude', 'max_gravity_error', 'max_scale_rel_std',
                     'max_imu_gap_s', 'max_rotation_residual'):
            if not getattr(self, name) > 0.0:
                raise ValueError(f'alignment option {name} must be > 0')
        if self.min_residual < 0.0 or self.accel_bias_prior < 0.0:
            raise ValueError('alignment options min_residual and accel_bias_prior must be >= 0')
        if self.refine_rounds < 1 or self.gyro_bias_rounds < 1:
            raise ValueError('alignment rounds must be >= 1')


@dataclass(frozen=True)
class Alignment:
    """Result of a visual-inertial alignment."""

    ok: bool
    """True when the motion determined the scale and every check passed."""
    scale: float
    """Metres per model unit (NaN when no solution was reached)."""
    gravity: np.ndarray
    """[3] unit vector, the direction gravity pulls, in the poses' world frame."""
    gyro_bias: np.ndarray
    """[3] gyroscope bias, rad/s, IMU frame."""
    accel_bias: np.ndarray = field(default_factory=lambda: np.zeros(3))
    """[3] accelerometer bias, m/s^2, IMU frame (weakly held to zero)."""
    velocities: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    """[N, 3] IMU velocities in the poses' world frame at the keyframes, m/s."""
    reason: str = ''
    """Why ``ok`` is False ('' when ok)."""
    scale_rel_std: float = float('inf')
    """Relative standard error of the scale (the degeneracy measure)."""
    free_gravity_norm: float = float('nan')
    """m/s^2, magnitude of gravity when solved freely (step 2)."""
    rotation_residual: float = float('nan')
    """rad, RMS gyroscope-versus-model rotation disagreement between keyframes after the bias."""
    residual: float = float('nan')
    """m/s, RMS residual of the refined linear fit."""


def _check_rotation(rotation: np.ndarray, what: str) -> None:
    """Raise ValueError unless ``rotation`` is a proper rotation to 1e-3."""
    if (np.abs(rotation.T @ rotation - np.eye(3)).max() > 1e-3
            or abs(np.linalg.det(rotation) - 1.0) > 1e-3):
        raise ValueError(f'{what} has no rotation part (not orthonormal with det 1)')


def _as_array(value: object, shape: tuple[int | None, ...], name: str) -> np.ndarray:
    """Return ``value`` as finite float64 of ``shape`` (None: any length), or raise ValueError."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, arr.shape)):
        want = 'x'.join('N' if s is None else str(s) for s in shape)
        raise ValueError(f'{name} must have shape [{want}], got {list(arr.shape)}')
    if not np.isfinite(arr).all():
        raise ValueError(f'{name} has NaN or infinite values')
    return arr


def _check_inputs(poses: object, stamps: object, imu_stamps: object, gyro: object,
                  accel: object, imu_from_camera: object | None
                  ) -> tuple[np.ndarray, ...]:
    """Validate and convert the contract's arrays (ValueError on any problem)."""
    poses = _as_array(poses, (None, 4, 4), 'poses')
    n = poses.shape[0]
    if n < 3:
        raise ValueError(f'alignment needs at least 3 keyframes, got {n}')
    for i in range(n):
        _check_rotation(poses[i, :3, :3], f'poses[{i}]')
    stamps = _as_array(stamps, (n,), 'stamps')
    imu_stamps = _as_array(imu_stamps, (None,), 'imu_stamps')
    m = imu_stamps.shape[0]
    if m < 2:
        raise ValueError(f'alignment needs at least 2 IMU readings, got {m}')
    gyro = _as_array(gyro, (m, 3), 'gyro')
    accel = _as_array(accel, (m, 3), 'accel')
    if not (np.diff(stamps) > 0.0).all():
        raise ValueError('stamps must be strictly increasing')
    if not (np.diff(imu_stamps) > 0.0).all():
        raise ValueError('imu_stamps must be strictly increasing')
    if imu_stamps[0] > stamps[0] or imu_stamps[-1] < stamps[-1]:
        raise ValueError(f'IMU readings [{imu_stamps[0]:.6f}, {imu_stamps[-1]:.6f}] s do not '
                         f'cover the keyframes [{stamps[0]:.6f}, {stamps[-1]:.6f}] s')
    if imu_from_camera is None:
        mount = np.eye(4)
    else:
        mount = _as_array(imu_from_camera, (4, 4), 'imu_from_camera')
        _check_rotation(mount[:3, :3], 'imu_from_camera')
    return poses, stamps, imu_stamps, gyro, accel, mount


def _largest_gap(imu_stamps: np.ndarray, t0: float, t1: float) -> float:
    """Return the longest stretch of ``[t0, t1]`` without an IMU reading, seconds."""
    inside = imu_stamps[(imu_stamps > t0) & (imu_stamps < t1)]
    edges = np.concatenate([[t0], inside, [t1]])
    before = imu_stamps[imu_stamps <= t0]
    after = imu_stamps[imu_stamps >= t1]
    edges[0] = before[-1]
    edges[-1] = after[0]
    return float(np.diff(edges).max())


def _gyro_bias(rotations: np.ndarray, stamps: np.ndarray, imu_stamps: np.ndarray,
               gyro: np.ndarray, accel: np.ndarray, rounds: int
               ) -> tuple[np.ndarray, list[Preintegrated], float]:
    """Solve the gyroscope bias; return it, the intervals integrated with it, the RMS residual."""
    bias = np.zeros(3)
    relative = [rotations[k].T @ rotations[k + 1] for k in range(len(stamps) - 1)]
    for _ in range(rounds):
        pre = [preintegrate(imu_stamps, gyro, accel, stamps[k], stamps[k + 1], bias)
               for k in range(len(stamps) - 1)]
        jac = np.vstack([p.jr_bg for p in pre])
        res = np.concatenate([so3.log(p.delta_r.T @ r) for p, r in zip(pre, relative)])
        step = np.linalg.lstsq(jac, res, rcond=None)[0]
        bias = bias + step
        if np.linalg.norm(step) < 1e-9:
            break
    pre = [preintegrate(imu_stamps, gyro, accel, stamps[k], stamps[k + 1], bias)
           for k in range(len(stamps) - 1)]
    res = np.array([so3.log(p.delta_r.T @ r) for p, r in zip(pre, relative)])
    return bias, pre, float(np.sqrt(np.mean(np.sum(res ** 2, axis=1))))


def _tangent_basis(direction: np.ndarray) -> np.ndarray:
    """Return [3, 2] orthonormal columns perpendicular to the unit ``direction``."""
    helper = np.array([1.0, 0.0, 0.0]) if abs(direction[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    b1 = np.cross(direction, helper)
    b1 /= np.linalg.norm(b1)
    return np.stack([b1, np.cross(direction, b1)], axis=1)


class _System:
    """Rows of the linear alignment: unknowns [v_0..v_N-1, extra..., s] (see the module doc)."""

    def __init__(self, n: int, extra: int) -> None:
        """Prepare ``6 (n - 1)`` rows for ``3 n`` velocities, ``extra`` unknowns and the scale."""
        self.cols = 3 * n + extra + 1
        self.a = np.zeros((6 * (n - 1), self.cols))
        self.b = np.zeros(6 * (n - 1))

    @property
    def scale_col(self) -> int:
        """Column of the scale."""
        return self.cols - 1


def _pair_rows(sys: _System, k: int, dt: float, dpc: np.ndarray, rhs_p: np.ndarray,
               rhs_v: np.ndarray) -> tuple[slice, slice]:
    """Fill the velocity and scale terms of pair ``k``; return its position and velocity rows.

    The position rows are divided by ``dt`` so both kinds of rows are in m/s.
    """
    rp = slice(6 * k, 6 * k + 3)
    rv = slice(6 * k + 3, 6 * k + 6)
    eye = np.eye(3)
    sys.a[rp, 3 * k:3 * k + 3] = -eye
    sys.a[rp, sys.scale_col] = dpc / dt
    sys.b[rp] = rhs_p / dt
    sys.a[rv, 3 * k:3 * k + 3] = -eye
    sys.a[rv, 3 * k + 3:3 * k + 6] = eye
    sys.b[rv] = rhs_v
    return rp, rv


def _scale_rel_std(a: np.ndarray, residual: float, scale: float, scale_col: int,
                   floor: float) -> float:
    """Return the relative standard error of the scale of the least-squares system ``a``."""
    others = np.delete(a, scale_col, axis=1)
    col = a[:, scale_col]
    coef = np.linalg.lstsq(others, col, rcond=None)[0]
    leftover = float(np.linalg.norm(col - others @ coef))
    if leftover * abs(scale) <= 0.0:
        return float('inf')
    return max(residual, floor) / (leftover * abs(scale))


def align(poses: np.ndarray, stamps: np.ndarray, imu_stamps: np.ndarray, gyro: np.ndarray,
          accel: np.ndarray, imu_from_camera: np.ndarray | None = None,
          options: AlignmentOptions = AlignmentOptions()) -> Alignment:
    """Align keyframes with the IMU (the module doc); see :func:`align_visual_inertial`.

    Args:
        poses: [N, 4, 4] world-from-camera, translation in model units.
        stamps: [N] seconds, strictly increasing.
        imu_stamps: [M] seconds, strictly increasing, covering ``stamps``.
        gyro: [M, 3] rad/s, IMU frame.
        accel: [M, 3] m/s^2 specific force, IMU frame.
        imu_from_camera: [4, 4] camera-to-IMU transform in metres (None: identity).
        options: the thresholds.

    Returns:
        The alignment; ``ok`` False (with ``reason``) when the window cannot give a scale.

    Raises:
        ValueError: bad shapes, non-finite values, non-increasing stamps, IMU not covering.
    """
    poses, stamps, imu_stamps, gyro, accel, mount = _check_inputs(
        poses, stamps, imu_stamps, gyro, accel, imu_from_camera)
    n = poses.shape[0]
    nan3 = np.full(3, np.nan)
    gap = max(_largest_gap(imu_stamps, stamps[k], stamps[k + 1]) for k in range(n - 1))
    if gap > options.max_imu_gap_s:
        return Alignment(False, float('nan'), nan3, np.zeros(3),
                         reason=f'IMU gap of {gap:.3f} s (max {options.max_imu_gap_s} s)')
    r_ic = mount[:3, :3]
    p_cb = -r_ic.T @ mount[:3, 3]  # IMU origin in the camera frame, metres
    r_wc = poses[:, :3, :3]
    r_wb = r_wc @ r_ic.T
    p_wc = poses[:, :3, 3]

    bg, pre, rot_res = _gyro_bias(r_wb, stamps, imu_stamps, gyro, accel,
                                  options.gyro_bias_rounds)
    if rot_res > options.max_rotation_residual:
        return Alignment(False, float('nan'), nan3, bg, rotation_residual=rot_res,
                         reason=f'gyroscope and model rotations disagree by {rot_res:.4f} rad '
                                '(mounting, time offset or readings)')

    # Step 2: free gravity, scale and velocities.
    free = _System(n, 3)
    g_cols = slice(3 * n, 3 * n + 3)
    for k, p in enumerate(pre):
        lever = (r_wc[k + 1] - r_wc[k]) @ p_cb
        rp, rv = _pair_rows(free, k, p.dt, p_wc[k + 1] - p_wc[k],
                            r_wb[k] @ p.delta_p - lever, r_wb[k] @ p.delta_v)
        free.a[rp, g_cols] = -0.5 * p.dt * np.eye(3)
        free.a[rv, g_cols] = -p.dt * np.eye(3)
    x = np.linalg.lstsq(free.a, free.b, rcond=None)[0]
    g_free = x[g_cols]
    g_norm = float(np.linalg.norm(g_free))
    base = {'gyro_bias': bg, 'rotation_residual': rot_res, 'free_gravity_norm': g_norm}
    if not np.isfinite(g_norm) or g_norm <= 0.0:
        return Alignment(False, float('nan'), nan3, reason='no gravity solution', **base)
    direction = g_free / g_norm

    # Step 3: gravity on its tangent plane, with an accelerometer bias held near zero.
    g_mag = options.gravity_magnitude
    rows = 6 * (n - 1)
    for _ in range(options.refine_rounds):
        basis = _tangent_basis(direction) * g_mag
        ref = _System(n, 5)
        w_cols = slice(3 * n, 3 * n + 2)
        ba_cols = slice(3 * n + 2, 3 * n + 5)
        g0 = direction * g_mag
        for k, p in enumerate(pre):
            lever = (r_wc[k + 1] - r_wc[k]) @ p_cb
            rp, rv = _pair_rows(ref, k, p.dt, p_wc[k + 1] - p_wc[k],
                                r_wb[k] @ p.delta_p - lever + 0.5 * g0 * p.dt ** 2,
                                r_wb[k] @ p.delta_v + g0 * p.dt)
            ref.a[rp, w_cols] = -0.5 * p.dt * basis
            ref.a[rv, w_cols] = -p.dt * basis
            ref.a[rp, ba_cols] = -(r_wb[k] @ p.jp_ba) / p.dt
            ref.a[rv, ba_cols] = -(r_wb[k] @ p.jv_ba)
        prior = np.zeros((3, ref.cols))
        prior[:, ba_cols] = options.accel_bias_prior * np.eye(3)
        a = np.vstack([ref.a, prior])
        b = np.concatenate([ref.b, np.zeros(3)])
        x = np.linalg.lstsq(a, b, rcond=None)[0]
        g_vec = g0 + basis @ x[w_cols]
        direction = g_vec / np.linalg.norm(g_vec)
    scale = float(x[ref.scale_col])
    fit = a @ x - b
    residual = float(np.sqrt(np.mean(fit[:rows] ** 2)))
    rel_std = _scale_rel_std(a, residual, scale, ref.scale_col, options.min_residual)
    result = {'scale': scale, 'gravity': direction, 'accel_bias': x[ba_cols],
              'velocities': x[:3 * n].reshape(n, 3), 'scale_rel_std': rel_std,
              'residual': residual, **base}
    if abs(g_norm - g_mag) > options.max_gravity_error * g_mag:
        return Alignment(False, reason=f'free gravity {g_norm:.2f} m/s^2 is not {g_mag:.2f}',
                         **result)
    if not scale > 0.0 or rel_std > options.max_scale_rel_std:
        return Alignment(False, reason=f'degenerate motion: scale {scale:.4g} with relative '
                                       f'standard error {rel_std:.3g}', **result)
    return Alignment(True, **result)


def align_visual_inertial(poses: np.ndarray, stamps: np.ndarray, imu_stamps: np.ndarray,
                          gyro: np.ndarray, accel: np.ndarray, *,
                          imu_from_camera: np.ndarray | None = None) -> Alignment:
    """Return the metric scale, gravity and gyroscope bias of keyframes against IMU readings.

    Args:
        poses: float64 [N, 4, 4] world-from-camera of N keyframes as the model gives them
            (rotation exact, translation in the model's unknown units, any world frame).
        stamps: [N] seconds, strictly increasing.
        imu_stamps: [M] seconds on the same clock, strictly increasing, covering ``stamps``.
        gyro: [M, 3] angular rate, rad/s, IMU frame.
        accel: [M, 3] specific force, m/s^2 (+9.81 up at rest), IMU frame.
        imu_from_camera: [4, 4] maps camera-frame points into the IMU frame, metres
            (None: identity).

    Returns:
        An :class:`Alignment`: ``ok`` (False when the motion cannot determine the scale),
        ``scale`` (metres per model unit), ``gravity`` (unit [3] in the poses' world frame, the
        direction gravity pulls), ``gyro_bias`` ([3] rad/s, IMU frame), and diagnostics.

    Raises:
        ValueError: bad shapes, NaN or infinite values, stamps not strictly increasing, IMU
            readings not covering the keyframes, fewer than 3 keyframes.
    """
    return align(poses, stamps, imu_stamps, gyro, accel, imu_from_camera)
