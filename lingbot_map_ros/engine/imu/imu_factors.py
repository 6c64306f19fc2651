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
"""IMU factors for the pose graph: keyframe rotations constrained by the gyroscope.

Between two keyframes the gyroscope's preintegrated rotation (bias removed) is the camera's
relative rotation up to the mounting: ``R_ci^T R_cj = R_ic^T dR R_ic``, with the preintegration's
covariance rotated the same way. :func:`rotation_factor` turns that into a GTSAM between factor on
the graph's nodes (``Pose3``, or ``Similarity3`` when the graph keeps per-node scales) whose noise
is the gyroscope's on rotation and loose on everything else, so only the rotation is constrained:
the translation and scale stay the model's and the loop closures'. The module does not import
GTSAM; the caller passes it (as ``engine/mapping/graph/factors.py`` is given it).

How it plugs into the graph: for each new keyframe ``j`` after ``i`` (same clock, IMU readings
covering both), ``preintegrate`` the readings between their stamps with the gyroscope bias the
alignment found, then ``graph.add(rotation_factor(gtsam, key_i, key_j, *camera_rotation(...)))``
beside the odometry edge. A full ``ImuFactor`` (velocity and bias states per keyframe) needs the
metric scale first; it is not built here.
"""

from __future__ import annotations

from typing import Any, Literal

from lingbot_map_ros.engine.imu.preintegration import Preintegrated
import numpy as np

LOOSE_SIGMA = 1e4
"""Standard deviation of the unconstrained parts (translation, log-scale): effectively free."""
MIN_SIGMA = 1e-5
"""rad, floor of the rotation sigmas (a noiseless gyroscope would make the factor rigid)."""
NodeType = Literal['pose3', 'sim3']


def camera_rotation(pre: Preintegrated, gyro_bias: np.ndarray,
                    imu_from_camera: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Return the camera's relative rotation between the interval's ends and its covariance.

    Args:
        pre: the interval's preintegration (its ``rotation_cov`` from the gyroscope noise).
        gyro_bias: [3] rad/s, the bias to remove (first-order correction of ``pre``).
        imu_from_camera: [4, 4] mounting (None: identity).

    Returns:
        ``(R [3, 3], cov [3, 3])``: ``R_ci^T R_cj`` and the covariance of its right perturbation.
    """
    r_ic = np.eye(3) if imu_from_camera is None else np.asarray(imu_from_camera)[:3, :3]
    rotation = r_ic.T @ pre.rotation(np.asarray(gyro_bias, dtype=np.float64)) @ r_ic
    return rotation, r_ic.T @ pre.rotation_cov @ r_ic


def rotation_factor(gtsam: Any, key_i: int, key_j: int, rotation: np.ndarray, cov: np.ndarray,
                    node_type: NodeType = 'pose3') -> Any:
    """Return a between factor that constrains only the relative rotation of two nodes.

    Args:
        gtsam: the gtsam module.
        key_i: the earlier keyframe's key.
        key_j: the later keyframe's key.
        rotation: [3, 3] relative rotation ``R_i^T R_j`` (:func:`camera_rotation`).
        cov: [3, 3] its covariance, rad^2; only the diagonal is used (per-axis sigmas, floored at
            :data:`MIN_SIGMA`).
        node_type: 'pose3' (tangent: rotation, translation) or 'sim3' (rotation, translation,
            log-scale).

    Raises:
        ValueError: an unknown node type or a covariance that is not finite and non-negative.
    """
    diag = np.diag(np.asarray(cov, dtype=np.float64))
    if not (np.isfinite(diag).all() and (diag >= 0.0).all()):
        raise ValueError('rotation covariance must be finite and non-negative')
    sigmas = np.maximum(np.sqrt(diag), MIN_SIGMA)
    rot3 = gtsam.Rot3(np.asarray(rotation, dtype=np.float64))
    if node_type == 'pose3':
        noise = gtsam.noiseModel.Diagonal.Sigmas(np.concatenate([sigmas, np.full(3, LOOSE_SIGMA)]))
        return gtsam.BetweenFactorPose3(key_i, key_j, gtsam.Pose3(rot3, np.zeros(3)), noise)
    if node_type == 'sim3':
        noise = gtsam.noiseModel.Diagonal.Sigmas(np.concatenate([sigmas, np.full(4, LOOSE_SIGMA)]))
        return gtsam.BetweenFactorSimilarity3(
            key_i, key_j, gtsam.Similarity3(rot3, np.zeros(3), 1.0), noise)
    raise ValueError(f"node_type '{node_type}' is not 'pose3' or 'sim3'")
