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
"""Do two views' depth maps agree under their relative pose? The geometry of a loop check.

A joint pass of the model over a query keyframe and a loop candidate (``model_verifier.py``)
gives each view a camera (pose in the pass's frame, intrinsics) and a depth map with its
confidence. A wrong candidate still gets *a* relative pose from the camera head; what it
cannot get is two depth maps that describe the same surfaces under that pose. So:

1. **Projective association** (as in KinectFusion's ICP): each confident query pixel (a grid
   of every ``stride``-th pixel) is unprojected with its depth, moved into the candidate's
   camera by the relative pose, and projected into the candidate's image; the candidate's
   depth at the nearest pixel, along the projected (sub-pixel) ray, gives the candidate's
   own 3-D point for that surface point. No descriptor matching: the pose proposes the
   correspondences, the depths test them.
2. **Robust similarity fit** of the query points onto the candidate points
   (``verification.relative_sim3_from_points``: Umeyama, refitted on its inliers): with a
   right pose and consistent depths it is the pose itself, with most points inliers and a
   residual at the depth noise. The points are associated again under the fitted pose and
   fitted once more (one ICP step), which also refines the camera head's pose.
3. **Gates** (the verifier's): enough associated points, the share of confident query points
   that are inliers (low for a wrong place, and for a right place seen with little overlap,
   where a constraint would be weak anyway), the inliers' residual, and the gap between the
   fitted pose and the camera head's (the two readings of the pass must agree).

Frames: cameras are OpenCV optical, poses world-from-camera; depth is z along the optical axis
and a pixel (u, v) is the column / row index without +0.5 (the model's convention, spec §7).

Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from lingbot_map_ros.engine.mapping.verify.verification import PointFit, relative_sim3_from_points
import numpy as np


@dataclass(frozen=True)
class View:
    """One view of a joint pass."""

    c2w: np.ndarray
    """float64 [4, 4] pass-world-from-camera (rotation normalised; the pass's units)."""
    intrinsics: np.ndarray
    """float64 [3, 3] pinhole matrix of the processed image."""
    depth: np.ndarray
    """float32 [H, W] z-depth in the pass's units (<= 0 or non-finite: no depth)."""
    confidence: np.ndarray
    """float32 [H, W] depth confidence (higher is better)."""


@dataclass(frozen=True)
class Agreement:
    """How well the candidate's depth explains the query's under the fitted relative pose."""

    fit: PointFit | None
    """The last fit, query camera -> candidate camera (None: too few associated points)."""
    num_query_points: int
    """Confident query points on the sampling grid (the denominator of ``inlier_fraction``)."""
    num_associated: int
    """Of those, the ones whose projection landed on a confident candidate depth."""
    inlier_fraction: float
    """Inliers of the last fit over ``num_query_points``, in [0, 1]."""
    rotation_gap_deg: float
    """Angle between the fitted relative rotation and the camera head's (degrees)."""
    translation_gap: float
    """Distance between the two relative translations over the candidate points' spread."""
    extent: float
    """RMS spread of the associated candidate points about their mean (pass units)."""


def confident_mask(view: View, quantile: float) -> np.ndarray:
    """Pixels with a finite positive depth and a confidence at or above the ``quantile``.

    Args:
        view: the view.
        quantile: share of the valid pixels to drop, the least confident (in [0, 1)).

    Returns:
        bool [H, W].
    """
    valid = np.isfinite(view.depth) & (view.depth > 0) & np.isfinite(view.confidence)
    if not valid.any():
        return valid
    floor = np.quantile(view.confidence[valid], quantile) if quantile > 0 else -np.inf
    return valid & (view.confidence >= floor)


def associate(query: View, candidate: View, cand_from_query: np.ndarray, *, stride: int,
              query_mask: np.ndarray, candidate_mask: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, int]:
    """Projective association of the query's grid pixels with the candidate's depth.

    Args:
        query: the query view.
        candidate: the candidate view.
        cand_from_query: float64 [4, 4] Sim(3) query camera -> candidate camera (pass units).
        stride: sample every ``stride``-th query row and column.
        query_mask: bool [H, W] confident query pixels.
        candidate_mask: bool [H, W] confident candidate pixels.

    Returns:
        ``(points_candidate [M, 3], points_query [M, 3], num_query_points)``: the associated
        pairs, each in its own camera frame, and the confident grid pixels of the query.
    """
    rows, cols = np.mgrid[0:query.depth.shape[0]:stride, 0:query.depth.shape[1]:stride]
    keep = query_mask[rows, cols]
    u, v = cols[keep].astype(np.float64), rows[keep].astype(np.float64)
    z = query.depth[rows[keep], cols[keep]].astype(np.float64)
    points_q = _unproject(query.intrinsics, u, v, z)
    moved = points_q @ cand_from_query[:3, :3].T + cand_from_query[:3, 3]
    k = candidate.intrinsics
    height, width = candidate.depth.shape
    in_front = moved[:, 2] > 1e-9
    safe_z = np.where(in_front, moved[:, 2], 1.0)
    pu = k[0, 0] * moved[:, 0] / safe_z + k[0, 2]
    pv = k[1, 1] * moved[:, 1] / safe_z + k[1, 2]
    iu, iv = np.rint(pu).astype(np.int64), np.rint(pv).astype(np.int64)
    inside = in_front & (iu >= 0) & (iu < width) & (iv >= 0) & (iv < height)
    hit = np.zeros(len(u), dtype=bool)
    hit[inside] = candidate_mask[iv[inside], iu[inside]]
    z_c = candidate.depth[iv[hit], iu[hit]].astype(np.float64)
    points_c = _unproject(k, pu[hit], pv[hit], z_c)
    return points_c, points_q[hit], int(keep.sum())


def agreement(query: View, candidate: View, *, stride: int = 4, confidence_quantile: float = 0.5,
              inlier_threshold: float = 0.05, with_scale: bool = True, min_points: int = 32,
              iterations: int = 2) -> Agreement:
    """Associate, fit and re-associate the two views (module docstring, steps 1 and 2).

    Args:
        query: the query view.
        candidate: the candidate view (the pass's reference).
        stride: query grid step in pixels (>= 1).
        confidence_quantile: share of each view's least confident pixels left out.
        inlier_threshold: inlier distance relative to the candidate points' spread.
        with_scale: fit a similarity (False: rigid, the pass's scale kept).
        min_points: fewest associated points a fit is made with.
        iterations: association + fit rounds (the first under the camera head's pose).

    Returns:
        The agreement; ``fit`` None when fewer than ``min_points`` were associated.
    """
    head = np.linalg.inv(candidate.c2w) @ query.c2w
    masks = (confident_mask(query, confidence_quantile),
             confident_mask(candidate, confidence_quantile))
    pose, fit = head, None
    num_query = num_associated = 0
    extent = 0.0
    for _ in range(max(1, iterations)):
        points_c, points_q, num_query = associate(query, candidate, pose, stride=stride,
                                                  query_mask=masks[0], candidate_mask=masks[1])
        num_associated = len(points_c)
        if num_associated < max(min_points, 3):
            fit = None
            break
        extent = float(np.sqrt(np.mean(np.sum((points_c - points_c.mean(0)) ** 2, axis=1))))
        if extent <= 0:
            fit = None
            break
        fit = relative_sim3_from_points(points_c, points_q, with_scale=with_scale,
                                        inlier_threshold=inlier_threshold)
        pose = fit.matrix
    if fit is None:
        return Agreement(None, num_query, num_associated, 0.0, float('inf'), float('inf'), 0.0)
    rotation_gap, translation_gap = _pose_gap(fit.matrix, head)
    return Agreement(fit, num_query, num_associated,
                     fit.num_inliers / max(num_query, 1), rotation_gap,
                     translation_gap / extent, extent)


def centre_spread_ratio(target_c2w: np.ndarray, source_c2w: np.ndarray) -> float | None:
    """Scale that maps the spread of ``source_c2w``'s camera centres onto ``target_c2w``'s.

    The ratio of the RMS distances of the centres from their mean: with two or more frames of
    one stretch of the trajectory, seen once by the odometry (target) and once by a pass
    (source), it is the factor from the pass's units to the odometry's.

    Args:
        target_c2w: float [N, 4, 4] poses (N >= 2).
        source_c2w: float [N, 4, 4] the same frames' poses in the other frame.

    Returns:
        The ratio, or None when N < 2 or the source centres do not spread.
    """
    if len(target_c2w) < 2 or len(target_c2w) != len(source_c2w):
        return None
    spreads = []
    for poses in (target_c2w, source_c2w):
        centres = np.asarray(poses, dtype=np.float64)[:, :3, 3]
        spreads.append(float(np.sqrt(np.mean(np.sum((centres - centres.mean(0)) ** 2, 1)))))
    if not (spreads[1] > 0 and np.isfinite(spreads).all()):
        return None
    return spreads[0] / spreads[1]


def scale_of(pose: np.ndarray) -> float:
    """Return s of a Sim(3) whose top-left block is s * R."""
    return float(np.cbrt(np.linalg.det(np.asarray(pose, dtype=np.float64)[:3, :3])))


def _unproject(k: np.ndarray, u: np.ndarray, v: np.ndarray, z: np.ndarray) -> np.ndarray:
    x = (u - k[0, 2]) / k[0, 0] * z
    y = (v - k[1, 2]) / k[1, 1] * z
    return np.stack([x, y, z], axis=1)


def _pose_gap(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Rotation angle (degrees) and translation distance between two Sim(3) poses."""
    ra = a[:3, :3] / scale_of(a)
    rb = b[:3, :3] / scale_of(b)
    cos = np.clip((np.trace(ra.T @ rb) - 1.0) / 2.0, -1.0, 1.0)
    return float(np.degrees(np.arccos(cos))), float(np.linalg.norm(a[:3, 3] - b[:3, 3]))
