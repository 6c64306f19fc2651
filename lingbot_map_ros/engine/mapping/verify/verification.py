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
"""What a loop candidate's check takes and gives, and the point fit both verifiers share.

A loop closure keeps one :class:`KeyframeRecord` per keyframe. A :class:`Verifier` compares a
query keyframe with a retrieved candidate and answers a :class:`Verification`: accepted or
not (with the reason), the relative Sim(3) ``inv(T_candidate) @ T_query`` and its weight in
the pose graph. The model's verifier (``model_verifier.py``) and the oracle of the tests both
implement it.

:func:`relative_sim3_from_points` is the weighted Umeyama fit of one point set onto another
(with or without scale), refitted on its inliers, with the inlier share and residual a
verifier gates on. Frames: a pose ``T`` is world-from-camera, its top-left block ``s * R``.

Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

_REFITS = 3
"""Inlier refits after the first fit over every point (each one drops the points the last
fit left outside the threshold)."""


@dataclass(frozen=True)
class KeyframeRecord:
    """What the loop closer keeps of one keyframe."""

    index: int
    """Keyframe number in this run (the pose graph's node id), from 0, increasing."""
    stamp_ns: int
    """The keyframe's image stamp in nanoseconds."""
    odom_pose: np.ndarray
    """float64 [4, 4] Sim(3) odom-from-camera at that keyframe (top-left block s * R)."""
    descriptor: np.ndarray
    """float32 [D] global place descriptor, L2-normalised."""
    image: bytes | None = None
    """JPEG of the processed RGB frame, None when not stored."""


@dataclass(frozen=True)
class Verification:
    """A verifier's answer for one (query, candidate) pair."""

    accepted: bool
    """The pair becomes a loop constraint."""
    reason: str
    """'ok' when accepted, else why not (a short stable word, counted in the stats)."""
    relative: np.ndarray | None
    """float64 [4, 4] Sim(3) ~ inv(T_candidate) @ T_query; None when no fit was made."""
    inlier_fraction: float
    """Share of the compared points that agree after the fit, in [0, 1]."""
    residual: float
    """RMS disagreement of the inliers, relative to the scene's extent (unitless)."""
    information: np.ndarray | None
    """[7, 7] information of ``relative`` (translation, rotation, log-scale); None when
    rejected."""


class Verifier(Protocol):
    """Decides whether a retrieved candidate is the same place as the query."""

    def verify(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Verification:
        """Compare ``query`` with ``candidate`` (runs on the loop closer's worker thread)."""
        ...


@dataclass(frozen=True)
class PointFit:
    """The similarity that maps one point set onto another, and how well it does."""

    matrix: np.ndarray
    """float64 [4, 4]: ``points_a ~ s * R @ points_b + t`` (top-left block s * R)."""
    scale: float
    """s (1.0 when fitted without scale)."""
    inlier_fraction: float
    """Share of the weighted points within the threshold after the last refit."""
    residual: float
    """RMS distance of the inliers, divided by the RMS spread of ``points_a`` (unitless)."""
    num_inliers: int
    """Number of inlier points."""


def umeyama(points_a: np.ndarray, points_b: np.ndarray, weights: np.ndarray | None = None, *,
            with_scale: bool = True) -> np.ndarray:
    """Weighted least-squares similarity mapping ``points_b`` onto ``points_a``.

    Args:
        points_a: float [N, 3] target points.
        points_b: float [N, 3] source points (the same N points in the other frame).
        weights: float [N] non-negative weights (None: all 1).
        with_scale: fit the scale; when False the result is a rigid transform.

    Returns:
        float64 [4, 4] ``T`` with ``points_a ~ T[:3, :3] @ points_b + T[:3, 3]``.

    Raises:
        ValueError: shapes differ, fewer than 3 weighted points, non-finite values, or the
            source points have no spread.
    """
    a, b, w = _check_points(points_a, points_b, weights)
    w = w / w.sum()
    mean_a, mean_b = w @ a, w @ b
    da, db = a - mean_a, b - mean_b
    cov = (da * w[:, None]).T @ db
    u, sing, vt = np.linalg.svd(cov)
    fix = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        fix[2, 2] = -1.0
    rotation = u @ fix @ vt
    var_b = float(w @ np.sum(db * db, axis=1))
    if var_b <= 1e-18:
        raise ValueError('umeyama: the source points have no spread')
    scale = float(np.sum(sing * np.diag(fix)) / var_b) if with_scale else 1.0
    if scale <= 0:
        raise ValueError(f'umeyama: fitted scale {scale} is not positive')
    out = np.eye(4)
    out[:3, :3] = scale * rotation
    out[:3, 3] = mean_a - scale * rotation @ mean_b
    return out


def relative_sim3_from_points(points_a: np.ndarray, points_b: np.ndarray,
                              weights: np.ndarray | None = None, *, with_scale: bool = True,
                              inlier_threshold: float = 0.05) -> PointFit:
    """Robust similarity ``points_b -> points_a`` and the points' agreement under it.

    Fits over every point (:func:`umeyama`), then refits on the inliers: the points whose
    distance after the fit is within ``inlier_threshold`` times the RMS spread of
    ``points_a`` about its weighted mean (so the threshold does not depend on the scene's
    units).

    Args:
        points_a: float [N, 3] points in frame a (e.g. the candidate's camera frame).
        points_b: float [N, 3] the same points in frame b (the query's).
        weights: float [N] confidences (None: all 1); zero-weight points never count.
        with_scale: fit the scale (Sim(3)); False for SE(3) (metric depth locked).
        inlier_threshold: inlier distance relative to the spread of ``points_a`` (> 0).

    Returns:
        The fit. With fewer than 3 inliers left the fit over every point is kept and
        ``inlier_fraction`` says how few agreed.

    Raises:
        ValueError: as :func:`umeyama`, or ``inlier_threshold`` not finite and > 0.
    """
    if not (np.isfinite(inlier_threshold) and inlier_threshold > 0):
        raise ValueError(f'inlier_threshold={inlier_threshold} must be a finite number > 0')
    a, b, w = _check_points(points_a, points_b, weights)
    mean_a = (w / w.sum()) @ a
    spread = float(np.sqrt((w / w.sum()) @ np.sum((a - mean_a) ** 2, axis=1)))
    if spread <= 0:
        raise ValueError('relative_sim3_from_points: points_a have no spread')
    matrix = umeyama(a, b, w, with_scale=with_scale)
    inliers = _inliers(matrix, a, b, w, inlier_threshold * spread)
    for _ in range(_REFITS):
        if inliers.sum() < 3:
            break
        refit = umeyama(a[inliers], b[inliers], w[inliers], with_scale=with_scale)
        refit_inliers = _inliers(refit, a, b, w, inlier_threshold * spread)
        if refit_inliers.sum() < 3:
            break
        matrix, inliers = refit, refit_inliers
    dist = _distances(matrix, a, b)
    fraction = float(w[inliers].sum() / w.sum())
    residual = (float(np.sqrt(np.average(dist[inliers] ** 2, weights=w[inliers]))) / spread
                if inliers.any() else float('inf'))
    scale = float(np.cbrt(np.linalg.det(matrix[:3, :3])))
    return PointFit(matrix=matrix, scale=scale, inlier_fraction=fraction, residual=residual,
                    num_inliers=int(inliers.sum()))


def information_from_fit(fit: PointFit, *, translation_extent: float,
                         min_sigma: float = 1e-3) -> np.ndarray:
    """Return a [7, 7] diagonal information for a verified relative pose.

    The standard deviations grow with the fit's residual and shrink with the square root of
    its inliers: translation in the units of ``translation_extent`` (the scene's spread in
    frame a), rotation in radians, log-scale unitless.

    Args:
        fit: the fit of :func:`relative_sim3_from_points`.
        translation_extent: the spread of the points the fit is in, in pose units (> 0).
        min_sigma: lower bound of every standard deviation (relative, > 0).

    Returns:
        float64 [7, 7] diagonal information (order: translation, rotation, log-scale).
    """
    if not (np.isfinite(translation_extent) and translation_extent > 0):
        raise ValueError(f'translation_extent={translation_extent} must be a finite number > 0')
    rel = max(fit.residual, min_sigma) / np.sqrt(max(fit.num_inliers, 1))
    sigmas = np.array([rel * translation_extent] * 3 + [rel] * 3 + [rel])
    return np.diag(1.0 / sigmas ** 2)


def _check_points(points_a: np.ndarray, points_b: np.ndarray, weights: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.asarray(points_a, dtype=np.float64)
    b = np.asarray(points_b, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 3 or a.shape != b.shape:
        raise ValueError(f'points must both be [N, 3], got {a.shape} and {b.shape}')
    w = np.ones(len(a)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(a),):
        raise ValueError(f'weights must be [{len(a)}], got {w.shape}')
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(w).all()):
        raise ValueError('points and weights must be finite')
    if (w < 0).any():
        raise ValueError('weights must be >= 0')
    if int((w > 0).sum()) < 3:
        raise ValueError(f'need at least 3 points of positive weight, got {int((w > 0).sum())}')
    return a, b, w


def _distances(matrix: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - (b @ matrix[:3, :3].T + matrix[:3, 3]), axis=1)


def _inliers(matrix: np.ndarray, a: np.ndarray, b: np.ndarray, w: np.ndarray,
             threshold: float) -> np.ndarray:
    return (_distances(matrix, a, b) <= threshold) & (w > 0)
