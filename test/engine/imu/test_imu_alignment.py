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
"""The contract of ``align_visual_inertial``: accuracy on the route, degenerate motion, bad arrays.

Run: ``python -m pytest test/engine/imu/test_imu_alignment.py`` (a few seconds on one core).
"""

from __future__ import annotations

import imu_motion
from imu_motion import along, gravity_error_deg, MODEL_UNITS, pose, route
from lingbot_map_ros.engine.imu import align, align_visual_inertial, AlignmentOptions, so3
from lingbot_map_ros.tools.synthetic_imu import ImuNoise, NOISELESS
import numpy as np
import pytest


@pytest.mark.parametrize(('frames', 'seed'), [
    (slice(0, 30), 0), (slice(0, 60, 2), 1), (slice(20, 50), 2), (slice(30, 60), 3)])
def test_route_with_noise_and_bias_gives_scale_and_gravity(frames: slice, seed: int) -> None:
    """Realistic noise and turn-on biases: scale within 2 %, gravity within 1 deg, bias found."""
    win = route(frames, seed=seed)
    result = align_visual_inertial(*win.args(), imu_from_camera=win.mount)
    assert result.ok, result.reason
    assert abs(result.scale / MODEL_UNITS - 1.0) <= 0.02
    assert gravity_error_deg(result.gravity, win.gravity) <= 1.0
    assert np.linalg.norm(result.gravity) == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(result.gyro_bias, win.gyro_bias, atol=1e-3)


def test_route_exact_readings_give_exact_scale() -> None:
    """Without noise the alignment is exact up to the integration error."""
    win = route(slice(0, 30), noise=NOISELESS)
    result = align_visual_inertial(*win.args(), imu_from_camera=win.mount)
    assert result.ok, result.reason
    assert result.scale == pytest.approx(MODEL_UNITS, rel=1e-3)
    assert gravity_error_deg(result.gravity, win.gravity) <= 0.01
    np.testing.assert_allclose(result.gyro_bias, 0.0, atol=1e-5)
    assert result.velocities.shape == (30, 3)
    # The route drives at about 2 m/s: the solved velocities are metric.
    assert 1.0 < float(np.median(np.linalg.norm(result.velocities, axis=1))) < 3.5


def test_any_world_frame_moves_gravity_with_it() -> None:
    """A world frame rotated and shifted arbitrarily: same scale, gravity rotated along."""
    win = route(slice(0, 30), seed=4)
    other = pose(so3.exp(np.array([0.7, -1.9, 0.4])), [3.0, -2.0, 5.0])
    poses = other @ win.poses
    result = align_visual_inertial(poses, *win.args()[1:], imu_from_camera=win.mount)
    assert result.ok, result.reason
    assert abs(result.scale / MODEL_UNITS - 1.0) <= 0.02
    assert gravity_error_deg(result.gravity, other[:3, :3] @ win.gravity) <= 1.0


def test_identity_mounting_when_imu_is_the_camera() -> None:
    """``imu_from_camera=None`` means the IMU frame is the camera frame."""
    win = along(_wavy, 3.0, noise=NOISELESS)
    cams = win.poses.copy()
    # Readings of an IMU at the camera: re-derive them with the camera as the body.
    mounted = along(lambda t: _wavy(t) @ win.mount, 3.0, noise=NOISELESS)
    result = align_visual_inertial(cams, win.stamps, mounted.imu_stamps, mounted.gyro,
                                   mounted.accel)
    assert result.ok, result.reason
    assert result.scale == pytest.approx(MODEL_UNITS, rel=1e-3)
    assert gravity_error_deg(result.gravity, win.gravity) <= 0.05


def _wavy(t: float) -> np.ndarray:
    """Return a hand-held motion: swaying in three axes while turning."""
    rot = so3.exp(np.array([0.3 * np.sin(2.0 * t), 0.2 * np.sin(1.3 * t), 0.8 * t]))
    return pose(rot, [0.6 * np.sin(1.5 * t), 0.4 * np.sin(2.1 * t), 1.0 + 0.2 * np.sin(t)])


def _constant_velocity(t: float) -> np.ndarray:
    return pose(np.eye(3), [0.5 * t, 0.2 * t, 1.0])


def _constant_velocity_turning(t: float) -> np.ndarray:
    rot = so3.exp(np.array([0.1 * np.sin(t), 0.2 * np.sin(0.7 * t), 0.5 * t]))
    return pose(rot, [0.5 * t, 0.2 * t, 1.0])


def _pure_rotation(t: float) -> np.ndarray:
    rot = so3.exp(np.array([0.3 * np.sin(2.0 * t), 0.2 * np.sin(1.3 * t), 0.8 * t]))
    return pose(rot, [0.0, 0.0, 1.0])


def _still(t: float) -> np.ndarray:
    return pose(so3.exp(np.array([0.1, -0.2, 0.3])), [0.0, 0.0, 1.0])


@pytest.mark.parametrize('noise', [NOISELESS, ImuNoise()], ids=['exact', 'noisy'])
def test_wavy_hand_held_motion_is_aligned(noise: ImuNoise) -> None:
    """A general motion determines the scale (the counterpart of the degenerate cases)."""
    win = along(_wavy, 3.0, noise=noise)
    result = align_visual_inertial(*win.args(), imu_from_camera=win.mount)
    assert result.ok, result.reason
    assert abs(result.scale / MODEL_UNITS - 1.0) <= 0.02
    assert gravity_error_deg(result.gravity, win.gravity) <= 1.0


@pytest.mark.parametrize('motion', [_constant_velocity, _constant_velocity_turning,
                                    _pure_rotation, _still])
@pytest.mark.parametrize('noise', [NOISELESS, ImuNoise()], ids=['exact', 'noisy'])
def test_degenerate_motion_gives_no_scale(motion: object, noise: ImuNoise) -> None:
    """Constant velocity (turning or not), pure rotation and standing still: ok False."""
    win = along(motion, 3.0, noise=noise)
    result = align_visual_inertial(*win.args(), imu_from_camera=win.mount)
    assert not result.ok
    assert 'degenerate' in result.reason
    assert result.scale_rel_std > AlignmentOptions().max_scale_rel_std


def test_slow_imu_is_not_used() -> None:
    """A 5 Hz IMU leaves gaps longer than the integration can bridge: ok False."""
    win = route(slice(0, 30))
    keep = slice(None, None, 40)
    result = align_visual_inertial(win.poses, win.stamps, win.imu_stamps[keep], win.gyro[keep],
                                   win.accel[keep], imu_from_camera=win.mount)
    assert not result.ok
    assert 'gap' in result.reason
    assert np.isnan(result.scale)


def test_silent_stretch_is_not_used() -> None:
    """The IMU stops for half a second inside the window: ok False."""
    win = route(slice(0, 30))
    keep = (win.imu_stamps < 1.0) | (win.imu_stamps > 1.5)
    result = align_visual_inertial(win.poses, win.stamps, win.imu_stamps[keep], win.gyro[keep],
                                   win.accel[keep], imu_from_camera=win.mount)
    assert not result.ok
    assert 'gap' in result.reason


def test_wrong_mounting_is_rejected() -> None:
    """An IMU turned 90 deg from what is declared: rotations disagree, ok False."""
    win = route(slice(0, 30))
    wrong = win.mount @ pose(so3.exp(np.array([0.0, np.pi / 2, 0.0])), [0.0, 0.0, 0.0])
    result = align_visual_inertial(*win.args(), imu_from_camera=wrong)
    assert not result.ok
    assert 'disagree' in result.reason


def test_garbage_accelerometer_gives_no_scale() -> None:
    """Random specific force (a broken sensor): never a scale."""
    win = route(slice(0, 30))
    rng = np.random.default_rng(5)
    accel = rng.normal(0.0, 20.0, win.accel.shape)
    result = align_visual_inertial(win.poses, win.stamps, win.imu_stamps, win.gyro, accel,
                                   imu_from_camera=win.mount)
    assert not result.ok


def test_options_are_checked() -> None:
    """Out-of-range thresholds raise."""
    with pytest.raises(ValueError, match='max_scale_rel_std'):
        AlignmentOptions(max_scale_rel_std=0.0)
    with pytest.raises(ValueError, match='rounds'):
        AlignmentOptions(refine_rounds=0)


def test_stricter_threshold_rejects_the_same_window() -> None:
    """The degeneracy threshold is what decides: a tiny one rejects a good window."""
    win = route(slice(0, 30))
    loose = align(*win.args(), win.mount)
    strict = align(*win.args(), win.mount, AlignmentOptions(max_scale_rel_std=1e-6))
    assert loose.ok and not strict.ok
    assert strict.scale == pytest.approx(loose.scale, rel=1e-12)


def _bad(win: imu_motion.Window, **changes: object) -> tuple[object, ...]:
    args = {'poses': win.poses, 'stamps': win.stamps, 'imu_stamps': win.imu_stamps,
            'gyro': win.gyro, 'accel': win.accel}
    args.update(changes)
    return tuple(args.values())


def _with(arr: np.ndarray, index: tuple, value: float) -> np.ndarray:
    out = np.array(arr, dtype=np.float64)
    out[index] = value
    return out


@pytest.mark.parametrize(('change', 'message'), [
    (lambda w: {'poses': w.poses[:, :3]}, 'poses must have shape'),
    (lambda w: {'poses': w.poses[:2], 'stamps': w.stamps[:2]}, 'at least 3 keyframes'),
    (lambda w: {'stamps': w.stamps[:-1]}, 'stamps must have shape'),
    (lambda w: {'gyro': w.gyro[:, :2]}, 'gyro must have shape'),
    (lambda w: {'accel': w.accel[:-1]}, 'accel must have shape'),
    (lambda w: {'imu_stamps': w.imu_stamps[:1], 'gyro': w.gyro[:1], 'accel': w.accel[:1]},
     'at least 2 IMU'),
    (lambda w: {'poses': _with(w.poses, (3, 0, 3), np.nan)}, 'poses has NaN'),
    (lambda w: {'poses': _with(w.poses, (3, 0, 0), 2.0)}, 'no rotation'),
    (lambda w: {'stamps': _with(w.stamps, (4,), np.inf)}, 'stamps has NaN'),
    (lambda w: {'gyro': _with(w.gyro, (10, 1), np.nan)}, 'gyro has NaN'),
    (lambda w: {'accel': _with(w.accel, (10, 2), -np.inf)}, 'accel has NaN'),
    (lambda w: {'stamps': w.stamps[::-1].copy()}, 'stamps must be strictly increasing'),
    (lambda w: {'stamps': _with(w.stamps, (5,), w.stamps[4])},
     'stamps must be strictly increasing'),
    (lambda w: {'imu_stamps': _with(w.imu_stamps, (50,), w.imu_stamps[49])},
     'imu_stamps must be strictly increasing'),
    (lambda w: {'imu_stamps': w.imu_stamps + 0.5}, 'do not cover'),
])
def test_bad_arrays_raise(change: object, message: str) -> None:
    """Shapes, NaN/inf, stamps not increasing, IMU not covering: ValueError naming the array."""
    win = route(slice(0, 10), noise=NOISELESS)
    with pytest.raises(ValueError, match=message):
        align_visual_inertial(*_bad(win, **change(win)), imu_from_camera=win.mount)


@pytest.mark.parametrize('mount', [np.eye(3), np.full((4, 4), np.nan),
                                   pose(2.0 * np.eye(3), [0.0, 0.0, 0.0])])
def test_bad_mounting_raises(mount: np.ndarray) -> None:
    """A mounting of the wrong shape, with NaN or without a rotation raises."""
    win = route(slice(0, 10), noise=NOISELESS)
    with pytest.raises(ValueError, match='imu_from_camera'):
        align_visual_inertial(*win.args(), imu_from_camera=mount)
