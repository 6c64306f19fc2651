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
"""A finished joint pass judged: the gates, the scale of each side, the relative Sim(3).

The pass (``model_verifier.py``) ran the candidate's side, then the query's side, as one scale
pass; its outputs are in the pass's own frame (the candidate's camera) and units. Here:

1. The views' agreement (``view_agreement.agreement``): the query's confident depth points
   onto the candidate's, fitted; the gates of :class:`VerifierConfig` on its inlier share,
   residual and the gap to the camera head's pose.
2. Scale. Each side's stretch of keyframes is seen both by the odometry and by the pass: the
   ratio of the spreads of their camera centres (``centre_spread_ratio``) is the factor ``k``
   from the pass's units to the odometry's there. A side whose cameras barely move
   (``min_baseline``) borrows the other side's factor (its log-scale information is then cut
   100-fold); a pair with neither is rejected ('scale_unobservable').
3. The answer ``D(k_c / s_c) @ F @ D(s_q / k_q)`` ~ ``inv(T_candidate) @ T_query``: ``F`` the
   fitted query-to-candidate camera similarity in pass units, ``s`` the odometry poses' own
   scales, ``D(x)`` a uniform scaling. Its scale part is the odometry's scale drift from the
   candidate to the query. With ``scale_fixed`` (metric scale locked by a depth camera) ``F``
   is rigid and both sides share one factor: SE(3).

Pure numpy (the pass's outputs are copied to the host here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lingbot_map_ros.config import LoopConfig
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.mapping.verify.verification import (information_from_fit,
                                                                KeyframeRecord, Verification)
from lingbot_map_ros.engine.mapping.verify.view_agreement import (agreement, centre_spread_ratio,
                                                                  scale_of, View)
import numpy as np

Sides = tuple[list[KeyframeRecord], list[KeyframeRecord]]
"""A pass's frames: (candidate and its neighbours, query and its neighbours)."""
_BORROWED_SCALE_WEIGHT = 1e-2
"""Information factor of the log-scale when one side's scale was borrowed from the other."""


@dataclass(frozen=True)
class VerifierConfig:
    """Thresholds and sizes of the model's loop check (docs/loop_closure.md)."""

    frames_per_side: int = 2
    """Frames of each side in the joint pass: the keyframe and its nearest stored keyframes
    (>= 1; 2 * frames_per_side at most ``cache.scale_frames``). One per side cannot measure
    the sides' scale: such pairs are rejected ('scale_unobservable')."""
    min_inlier_fraction: float = 0.3
    """Least share of the query's confident points that must agree with the candidate's
    depth after the fit."""
    max_residual: float = 0.05
    """Largest RMS distance of the inliers, relative to the candidate points' spread."""
    inlier_threshold: float = 0.05
    """Inlier distance, relative to the candidate points' spread."""
    max_rotation_gap_deg: float = 10.0
    """Largest angle between the fitted relative rotation and the camera head's."""
    pixel_stride: int = 4
    """Sample every n-th query pixel per direction."""
    confidence_quantile: float = 0.5
    """Share of each view's least confident depth pixels left out."""
    min_points: int = 64
    """Fewest associated points a pair is judged on."""
    min_baseline: float = 0.02
    """Least RMS spread of a side's camera centres, relative to its median depth, for the
    side's scale to count as measured."""
    scale_fixed: bool = False
    """Metric scale locked (depth camera): fit rigidly, answer SE(3)."""

    def __post_init__(self) -> None:
        """Reject out-of-range values."""
        if self.frames_per_side < 1:
            raise ValueError(f'frames_per_side={self.frames_per_side} must be >= 1')
        if self.pixel_stride < 1 or self.min_points < 3:
            raise ValueError(f'pixel_stride={self.pixel_stride} must be >= 1 and '
                             f'min_points={self.min_points} >= 3')
        if not 0.0 <= self.min_inlier_fraction <= 1.0:
            raise ValueError(f'min_inlier_fraction={self.min_inlier_fraction} must be in [0, 1]')
        if not 0.0 <= self.confidence_quantile < 1.0:
            raise ValueError(f'confidence_quantile={self.confidence_quantile} must be in [0, 1)')
        for name in ('max_residual', 'inlier_threshold', 'max_rotation_gap_deg',
                     'min_baseline'):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f'{name}={value} must be a finite number > 0')

    @classmethod
    def from_loop(cls, loop: LoopConfig, scale_fixed: bool = False) -> 'VerifierConfig':
        """Return the check the ``loop.*`` parameters ask for (the rest at their defaults).

        ``loop.verify_frames`` is ``frames_per_side``; ``loop.min_inlier_fraction`` and
        ``loop.inlier_threshold`` keep their names (``loop.max_residual`` is the pose graph's
        gate, not this residual's).
        """
        return cls(frames_per_side=loop.verify_frames,
                   min_inlier_fraction=loop.min_inlier_fraction,
                   inlier_threshold=loop.inlier_threshold, scale_fixed=scale_fixed)


def rejected(reason: str, relative: np.ndarray | None = None, inlier_fraction: float = 0.0,
             residual: float = float('inf')) -> Verification:
    """Return a refusal for ``reason`` (no information: it is no constraint)."""
    return Verification(False, reason, relative, inlier_fraction, residual, None)


def verdict(config: VerifierConfig, sides: Sides, out: dict) -> Verification:
    """Judge a finished joint pass and make the answer (module docstring).

    Args:
        config: thresholds.
        sides: the pass's frames, (candidate and its neighbours, query and its neighbours),
            in the pass's order.
        out: the pass's outputs (``forward_scale``'s with depth): 'pose_enc' [N, 9], 'depth'
            and 'depth_conf' [N, H, W].

    Returns:
        The answer; ``relative`` None when no fit was made.
    """
    pose_enc = out['pose_enc'].detach().double().cpu().numpy()
    if not np.isfinite(pose_enc).all():
        return rejected('non_finite')
    size_hw = tuple(out['depth'].shape[-2:])
    c2w = geometry.to_c2w_4x4(geometry.pose_encoding_to_extrinsics(pose_enc))
    k = geometry.pose_encoding_to_intrinsics(pose_enc, size_hw)
    depth = out['depth'].detach().float().cpu().numpy()
    conf = out['depth_conf'].detach().float().cpu().numpy()
    views = [View(c2w[i], k[i], depth[i], conf[i]) for i in range(len(pose_enc))]
    found = agreement(views[len(sides[0])], views[0], stride=config.pixel_stride,
                      confidence_quantile=config.confidence_quantile,
                      inlier_threshold=config.inlier_threshold,
                      with_scale=not config.scale_fixed, min_points=config.min_points)
    if found.fit is None:
        return rejected('too_few_points')
    factors = _factors(config, sides, views)
    if factors is None:
        return rejected('scale_unobservable', None, found.inlier_fraction, found.fit.residual)
    (k_c, k_q), borrowed = factors
    s_c, s_q = scale_of(sides[0][0].odom_pose), scale_of(sides[1][0].odom_pose)
    relative = _scaled(k_c / s_c) @ found.fit.matrix @ _scaled(s_q / k_q)
    reason = ('few_inliers' if found.inlier_fraction < config.min_inlier_fraction
              else 'residual' if found.fit.residual > config.max_residual
              else 'pose_disagrees' if found.rotation_gap_deg > config.max_rotation_gap_deg
              else 'ok')
    if reason != 'ok':
        return rejected(reason, relative, found.inlier_fraction, found.fit.residual)
    information = information_from_fit(found.fit, translation_extent=found.extent * k_c / s_c)
    if borrowed:
        information[6, 6] *= _BORROWED_SCALE_WEIGHT
    return Verification(True, 'ok', relative, found.inlier_fraction, found.fit.residual,
                        information)


def _factors(config: VerifierConfig, sides: Sides,
             views: Sequence[View]) -> tuple[tuple[float, float], bool] | None:
    """Each side's factor from pass units to odometry units, and whether one was borrowed.

    None when neither side's cameras spread enough to measure it.
    """
    factors: list[float | None] = []
    start = 0
    for side in sides:
        factors.append(_side_factor(config, side, views[start:start + len(side)]))
        start += len(side)
    measured = [f for f in factors if f is not None]
    if not measured:
        return None
    if config.scale_fixed:
        shared = float(np.exp(np.mean(np.log(measured))))
        return (shared, shared), len(measured) < 2
    k_c, k_q = (f if f is not None else measured[0] for f in factors)
    return (k_c, k_q), len(measured) < 2


def _side_factor(config: VerifierConfig, side: Sequence[KeyframeRecord],
                 views: Sequence[View]) -> float | None:
    """One side's factor, None when its cameras spread less than ``min_baseline``."""
    pass_c2w = np.stack([v.c2w for v in views])
    ratio = centre_spread_ratio(np.stack([r.odom_pose for r in side]), pass_c2w)
    if ratio is None or not ratio > 0:
        return None
    centres = pass_c2w[:, :3, 3]
    spread = float(np.sqrt(np.mean(np.sum((centres - centres.mean(0)) ** 2, axis=1))))
    valid = np.concatenate([v.depth[np.isfinite(v.depth) & (v.depth > 0)] for v in views])
    if valid.size == 0 or spread < config.min_baseline * float(np.median(valid)):
        return None
    return ratio


def _scaled(factor: float) -> np.ndarray:
    """Return the uniform scaling by ``factor`` as a [4, 4] Sim(3)."""
    out = np.eye(4)
    out[:3, :3] *= factor
    return out
