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
"""IMU rotation factors: the gyroscope pulls a drifting pose graph's rotations back to the truth.

Run: ``python -m pytest test/engine/imu/test_imu_factors.py`` (seconds; needs gtsam).
"""

from __future__ import annotations

from imu_motion import along, pose
from lingbot_map_ros.engine.imu import align_visual_inertial, preintegrate, so3
from lingbot_map_ros.engine.imu.imu_factors import camera_rotation, rotation_factor
from lingbot_map_ros.tools.synthetic_imu import ImuNoise
import numpy as np
import pytest

gtsam = pytest.importorskip('gtsam')
NOISE = ImuNoise()


def _wavy(t: float) -> np.ndarray:
    rot = so3.exp(np.array([0.3 * np.sin(2.0 * t), 0.2 * np.sin(1.3 * t), 0.8 * t]))
    return pose(rot, [0.6 * np.sin(1.5 * t), 0.4 * np.sin(2.1 * t), 1.0 + 0.2 * np.sin(t)])


@pytest.fixture(scope='module')
def window():
    """Return keyframes of a hand-held motion with the IMU and the aligned gyroscope bias."""
    win = along(_wavy, 4.0, noise=NOISE)
    result = align_visual_inertial(*win.args(), imu_from_camera=win.mount)
    assert result.ok, result.reason
    return win, result.gyro_bias


def _imu_rotations(win, bias):
    out = []
    for k in range(len(win.stamps) - 1):
        pre = preintegrate(win.imu_stamps, win.gyro, win.accel, win.stamps[k],
                           win.stamps[k + 1], gyro_noise_density=NOISE.gyro_noise_density)
        out.append(camera_rotation(pre, bias, win.mount))
    return out


def test_camera_rotation_is_the_keyframes_relative_rotation(window) -> None:
    """Gyroscope rotation, bias removed, through the mounting: the camera's, within 0.05 deg."""
    win, bias = window
    for k, (rotation, cov) in enumerate(_imu_rotations(win, bias)):
        truth = win.poses[k, :3, :3].T @ win.poses[k + 1, :3, :3]
        assert np.degrees(np.linalg.norm(so3.log(rotation.T @ truth))) < 0.05
        # Gyroscope white noise over 0.1 s: about n^2 * 0.1 per axis.
        assert np.trace(cov) == pytest.approx(3 * NOISE.gyro_noise_density ** 2 * 0.1, rel=0.05)


def _optimise(win, edges, bias: np.ndarray | None, node_type: str = 'pose3'):
    """Return the optimised poses of the odometry chain, with IMU factors unless bias is None."""
    graph = gtsam.NonlinearFactorGraph()
    values = gtsam.Values()
    chain = [win.poses[0]]
    for rel in edges:
        chain.append(chain[-1] @ rel)
    if node_type == 'pose3':
        prior = gtsam.noiseModel.Isotropic.Sigma(6, 1e-6)
        graph.add(gtsam.PriorFactorPose3(0, gtsam.Pose3(win.poses[0]), prior))
        odo = gtsam.noiseModel.Diagonal.Sigmas(np.r_[np.full(3, 0.02), np.full(3, 0.01)])
        for k, rel in enumerate(edges):
            graph.add(gtsam.BetweenFactorPose3(k, k + 1, gtsam.Pose3(rel), odo))
        for k, c2w in enumerate(chain):
            values.insert(k, gtsam.Pose3(c2w))
    else:
        prior = gtsam.noiseModel.Isotropic.Sigma(7, 1e-6)
        graph.add(gtsam.PriorFactorSimilarity3(0, gtsam.Similarity3(win.poses[0]), prior))
        odo = gtsam.noiseModel.Diagonal.Sigmas(np.r_[np.full(3, 0.02), np.full(3, 0.01), 1e-3])
        for k, rel in enumerate(edges):
            graph.add(gtsam.BetweenFactorSimilarity3(k, k + 1, gtsam.Similarity3(rel), odo))
        for k, c2w in enumerate(chain):
            values.insert(k, gtsam.Similarity3(c2w))
    if bias is not None:
        for k, (rotation, cov) in enumerate(_imu_rotations(win, bias)):
            graph.add(rotation_factor(gtsam, k, k + 1, rotation, cov, node_type))
    result = gtsam.LevenbergMarquardtOptimizer(graph, values).optimize()
    get = result.atPose3 if node_type == 'pose3' else result.atSimilarity3
    return np.stack([get(k).matrix() for k in range(len(chain))])


@pytest.mark.parametrize('node_type', ['pose3', 'sim3'])
def test_rotation_factors_remove_the_odometry_rotation_drift(window, node_type: str) -> None:
    """Odometry rotations drift 0.5 deg a keyframe; with the IMU factors the drift is gone."""
    win, bias = window
    drift = so3.exp(np.radians(np.array([0.5, -0.3, 0.4])))
    edges = []
    for k in range(len(win.poses) - 1):
        rel = np.linalg.inv(win.poses[k]) @ win.poses[k + 1]
        rel[:3, :3] = rel[:3, :3] @ drift
        edges.append(rel)
    plain = _optimise(win, edges, None, node_type)
    fused = _optimise(win, edges, bias, node_type)

    def worst_deg(poses: np.ndarray) -> float:
        return max(np.degrees(np.linalg.norm(so3.log(p[:3, :3].T @ t[:3, :3])))
                   for p, t in zip(poses, win.poses))

    assert worst_deg(plain) > 10.0  # the test can fail: without the IMU the drift stays
    assert worst_deg(fused) < 0.3
    # Only rotation is constrained: each edge's translation stays the odometry's.
    for k, rel in enumerate(edges):
        fused_rel = np.linalg.inv(fused[k]) @ fused[k + 1]
        np.testing.assert_allclose(fused_rel[:3, 3], rel[:3, 3], atol=1e-3)


def test_rotation_factor_checks() -> None:
    """A bad covariance or node type raises."""
    with pytest.raises(ValueError, match='covariance'):
        rotation_factor(gtsam, 0, 1, np.eye(3), -np.eye(3))
    with pytest.raises(ValueError, match='node_type'):
        rotation_factor(gtsam, 0, 1, np.eye(3), np.eye(3), 'se2')
