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
"""Sim(3) as float64 ``[4, 4]`` matrices, and their GTSAM forms.

A pose ``T`` is world-from-keyframe with top-left block ``s * R`` (s > 0) and translation
``t``: ``x_world = s * R @ x + t``. GTSAM's ``Similarity3(R, t_g, s)`` acts as
``s * (R @ x + t_g)``, so ``t_g = t / s``. Tangent orders: ours is (translation, rotation,
log-scale), GTSAM's (rotation, translation, log-scale); :data:`TO_GTSAM` swaps the first two
blocks (and is its own inverse).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TO_GTSAM = np.array([3, 4, 5, 0, 1, 2, 6])
"""Index map between our [7] tangent order and GTSAM's (an involution)."""


def check_poses(poses: np.ndarray, name: str = 'poses') -> np.ndarray:
    """Return ``poses`` as float64 ``[N, 4, 4]`` Sim(3) matrices.

    Raises:
        ValueError: wrong shape, non-finite values, a bottom row other than (0, 0, 0, 1), or
            a top-left block that is not a positive scale times a rotation.
    """
    arr = np.asarray(poses, dtype=np.float64)
    if arr.ndim != 3 or arr.shape[1:] != (4, 4):
        raise ValueError(f'{name} must be [N, 4, 4], got {arr.shape}')
    if not np.isfinite(arr).all():
        raise ValueError(f'{name}: non-finite values')
    if not np.allclose(arr[:, 3], [0.0, 0.0, 0.0, 1.0], atol=1e-9):
        raise ValueError(f'{name}: bottom row must be (0, 0, 0, 1)')
    scales = scale_of(arr)
    if (scales <= 0).any():
        raise ValueError(f'{name}: a top-left block has non-positive determinant')
    rot = arr[:, :3, :3] / scales[:, None, None]
    err = np.abs(rot @ np.swapaxes(rot, 1, 2) - np.eye(3)).max()
    if err > 1e-6:
        raise ValueError(f'{name}: a top-left block is not s * R (orthogonality error {err:.3g})')
    return arr


def scale_of(poses: np.ndarray) -> np.ndarray:
    """Scale ``s`` of ``[..., 4, 4]`` Sim(3) matrices (cube root of the block's determinant)."""
    return np.cbrt(np.linalg.det(np.asarray(poses)[..., :3, :3]))


def rotation_of(pose: np.ndarray) -> np.ndarray:
    """Return the nearest rotation to a ``[4, 4]`` Sim(3)'s top-left block divided by its scale."""
    u, _, vt = np.linalg.svd(pose[:3, :3] / scale_of(pose))
    fix = np.diag([1.0, 1.0, np.linalg.det(u @ vt)])
    return u @ fix @ vt


def inverse(pose: np.ndarray) -> np.ndarray:
    """Inverse of a ``[4, 4]`` Sim(3)."""
    s = float(scale_of(pose))
    rot = pose[:3, :3] / s
    out = np.eye(4)
    out[:3, :3] = rot.T / s
    out[:3, 3] = -rot.T @ pose[:3, 3] / s
    return out


def make(rotation: np.ndarray, translation: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``[4, 4]`` Sim(3) from a rotation, a translation and a scale."""
    out = np.eye(4)
    out[:3, :3] = scale * np.asarray(rotation, dtype=np.float64)
    out[:3, 3] = translation
    return out


def rotation_angle(rotation: np.ndarray) -> float:
    """Angle of a rotation matrix in radians."""
    return float(np.arccos(np.clip((np.trace(rotation) - 1.0) / 2.0, -1.0, 1.0)))


def to_similarity3(gtsam: Any, pose: np.ndarray) -> Any:
    """``[4, 4]`` Sim(3) -> ``gtsam.Similarity3``."""
    s = float(scale_of(pose))
    return gtsam.Similarity3(gtsam.Rot3(rotation_of(pose)), pose[:3, 3] / s, s)


def from_similarity3(sim: Any) -> np.ndarray:
    """``gtsam.Similarity3`` -> ``[4, 4]`` Sim(3) (its matrix divided by its last entry)."""
    m = np.asarray(sim.matrix(), dtype=np.float64)
    return m / m[3, 3]


def to_pose3(gtsam: Any, pose: np.ndarray) -> Any:
    """``[4, 4]`` Sim(3) -> ``gtsam.Pose3`` of its rotation and translation (scale dropped)."""
    return gtsam.Pose3(gtsam.Rot3(rotation_of(pose)), pose[:3, 3])


def from_pose3(pose3: Any, scale: float) -> np.ndarray:
    """``gtsam.Pose3`` with a kept scale -> ``[4, 4]`` Sim(3)."""
    return make(np.asarray(pose3.rotation().matrix()), np.asarray(pose3.translation()), scale)
