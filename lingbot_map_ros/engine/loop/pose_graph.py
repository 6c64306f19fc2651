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
"""The pose graph's pure contract: :func:`optimize_pose_graph` on GTSAM.

Nodes are keyframes, world-from-keyframe Sim(3) poses (``sim3.py``); edges measure
``inv(T_i) @ T_j`` with a ``[7, 7]`` information in the order (translation, rotation,
log-scale). Odometry edges chain consecutive keyframes (rollovers included); loop edges join a
revisited place to its earlier keyframe and carry a robust kernel (Huber by default).

Outlier loops (rtabmap's ``RGBD/OptimizeMaxError`` idea): after a solve, a loop edge whose
whitened residual ``sqrt(e^T Omega e / dim)`` (computed without the robust kernel) stays above
``max_residual`` is rejected; the worst one goes first and the rest is solved again, so a wrong
loop that bends the graph does not get the right ones rejected with it. The returned poses are
a fresh solve of the graph without the rejected edges from the given poses, so they equal what
the same call without those edges returns.

With ``scale_fixed`` (metric scale from a depth camera) the nodes are ``Pose3``: every node keeps
its scale, a measurement's translation is brought to the world's units (times ``s_i``) and its
log-scale row is dropped. Fixed nodes (the gauge) are held by a tight prior and returned as
given. Covariances are GTSAM's marginals in the node's own tangent space, reordered to ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
from typing import Any, Literal, Sequence

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.loop.dependencies import require_gtsam
from lingbot_map_ros.engine.loop.factors import FactorMaker, Robust
import numpy as np

logger = logging.getLogger(__name__)

EdgeKind = Literal['odometry', 'loop']
MAX_ITERATIONS = 100
"""Levenberg-Marquardt iteration cap of one solve."""


@dataclass(frozen=True)
class PoseGraphEdge:
    """One relative measurement between two nodes."""

    i: int
    """From node (index into the poses)."""
    j: int
    """To node."""
    measurement: np.ndarray
    """float64 [4, 4] Sim(3) ~ inv(T_i) @ T_j."""
    information: np.ndarray
    """[7, 7] information (translation, rotation, log-scale), symmetric positive definite."""
    kind: EdgeKind = 'odometry'
    """'odometry' (never rejected, no kernel) or 'loop' (robust, may be rejected)."""


@dataclass(frozen=True)
class PoseGraphResult:
    """What :func:`optimize_pose_graph` returns."""

    poses: np.ndarray
    """float64 [N, 4, 4] optimised world-from-keyframe Sim(3) poses."""
    rejected: tuple[int, ...]
    """Indices into ``edges`` of the loop edges rejected as outliers, in rejection order."""
    covariances: np.ndarray | None
    """float64 [N, 7, 7] marginal covariances (our tangent order; with ``scale_fixed`` the
    log-scale row and column are zero), or None when not computed."""
    residuals: dict[int, float] = field(default_factory=dict)
    """Whitened RMS residual of every loop edge kept, by edge index (after the final solve)."""
    error: float = 0.0
    """The final graph's total error (GTSAM's, robust kernels applied)."""


def optimize_pose_graph(poses: np.ndarray, edges: Sequence[Any], *,
                        fixed: Sequence[int] = (0,), scale_fixed: bool = False,
                        robust: Robust = 'huber', max_residual: float = 3.0,
                        covariances: bool = True) -> PoseGraphResult:
    """Optimise a Sim(3) (or, with ``scale_fixed``, SE(3)) pose graph, rejecting bad loops.

    Args:
        poses: float64 [N, 4, 4] initial world-from-keyframe Sim(3) poses.
        edges: objects with ``i``, ``j``, ``measurement`` ([4, 4] ~ inv(T_i) @ T_j),
            ``information`` ([7, 7]: translation, rotation, log-scale) and ``kind``
            ('odometry' or 'loop').
        fixed: nodes that do not move (at least one: the gauge).
        scale_fixed: every pose keeps its scale (SE(3) between nodes).
        robust: kernel of the loop edges.
        max_residual: a loop edge whose whitened RMS residual stays above this is rejected
            (> 0; ``inf`` rejects nothing).
        covariances: compute the marginals (an extra factorisation).

    Returns:
        The optimised poses, the rejected loop edges and the marginals.

    Raises:
        ValueError: bad shapes or values, an edge naming a missing node, an unknown kind or
            kernel, no fixed node.
        ImportError: gtsam is not installed.
    """
    gtsam = require_gtsam()
    arr = sim3.check_poses(poses)
    checked = [check_edge(e, len(arr), n) for n, e in enumerate(edges)]
    fixed = sorted({int(f) for f in fixed})
    if not fixed or fixed[0] < 0 or fixed[-1] >= len(arr):
        raise ValueError(f'fixed={fixed} must name at least one of the {len(arr)} nodes')
    if not max_residual > 0:
        raise ValueError(f'max_residual={max_residual} must be > 0')
    maker = FactorMaker(gtsam, scale_fixed, robust, sim3.scale_of(arr))
    rejected: list[int] = []
    while True:
        kept = [n for n in range(len(checked)) if n not in rejected]
        values, graph = _solve(gtsam, maker, arr, [checked[n] for n in kept], fixed)
        residuals = {n: maker.residual(values, checked[n]) for n in kept
                     if checked[n].kind == 'loop'}
        worst = max(residuals, key=residuals.get, default=None)
        if worst is None or residuals[worst] <= max_residual:
            break
        logger.info('loop edge %d (%d -> %d) rejected: residual %.3g > %.3g', worst,
                    checked[worst].i, checked[worst].j, residuals[worst], max_residual)
        rejected.append(worst)
    out = np.stack([maker.pose(values, n) for n in range(len(arr))])
    out[fixed] = arr[fixed]
    cov = None
    if covariances:
        marginals = gtsam.Marginals(graph, values)
        cov = np.stack([maker.covariance(marginals.marginalCovariance(n))
                        for n in range(len(arr))])
    return PoseGraphResult(poses=out, rejected=tuple(rejected), covariances=cov,
                           residuals=residuals, error=float(graph.error(values)))


def check_edge(edge: Any, num_nodes: int, n: int) -> PoseGraphEdge:
    """Return ``edge`` as a checked :class:`PoseGraphEdge` (``n`` names it in errors).

    Raises:
        ValueError: a missing field, a node out of range, an unknown kind, a measurement that
            is not a Sim(3), an information that is not symmetric positive definite [7, 7].
    """
    try:
        i, j, kind = int(edge.i), int(edge.j), str(edge.kind)
        measurement = np.asarray(edge.measurement, dtype=np.float64)
        info = np.asarray(edge.information, dtype=np.float64)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f'edge {n}: needs i, j, measurement, information, kind ({exc})') from exc
    if not (0 <= i < num_nodes and 0 <= j < num_nodes) or i == j:
        raise ValueError(f'edge {n}: nodes ({i}, {j}) must be two of the {num_nodes} nodes')
    if kind not in ('odometry', 'loop'):
        raise ValueError(f"edge {n}: kind {kind!r} must be 'odometry' or 'loop'")
    sim3.check_poses(measurement[None], f'edge {n} measurement')
    if info.shape != (7, 7) or not np.isfinite(info).all() or \
            not np.allclose(info, info.T, rtol=1e-9, atol=1e-12):
        raise ValueError(f'edge {n}: information must be a finite symmetric [7, 7]')
    if np.linalg.eigvalsh(info).min() <= 0:
        raise ValueError(f'edge {n}: information must be positive definite')
    return PoseGraphEdge(i, j, measurement, info, kind)  # type: ignore[arg-type]


def _solve(gtsam: Any, maker: FactorMaker, poses: np.ndarray, edges: list[PoseGraphEdge],
           fixed: list[int]) -> tuple[Any, Any]:
    """Levenberg-Marquardt from ``poses`` over ``edges``; returns (values, graph)."""
    graph = gtsam.NonlinearFactorGraph()
    for n in fixed:
        graph.add(maker.prior(n, poses[n]))
    for edge in edges:
        graph.add(maker.factor(edge))
    initial = gtsam.Values()
    for n, pose in enumerate(poses):
        initial.insert(n, maker.value(pose))
    params = gtsam.LevenbergMarquardtParams()
    params.setMaxIterations(MAX_ITERATIONS)
    params.setRelativeErrorTol(1e-10)
    params.setAbsoluteErrorTol(1e-12)
    return gtsam.LevenbergMarquardtOptimizer(graph, initial, params).optimize(), graph
