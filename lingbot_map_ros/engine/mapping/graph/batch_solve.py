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

Outlier loops are judged as the live graph (``incremental_graph.py``) judges them, so a batch
run over the same edges accepts and rejects the same loops: the graph of the edges that are not
loops is solved first, then every loop in edge order is judged by the gate (``loop_gate.py``:
a chi-square test against the graph's prediction and the joint marginal of its two nodes,
from iSAM2 over the graph so far) and, when it passes, added and solved again; a loop whose
whitened residual ``sqrt(e^T Omega e / dim)`` (without the robust kernel) then stays above
``max_residual`` is taken out again (rtabmap's ``RGBD/OptimizeMaxError`` idea); a loop's
trial solve is the live graph's (:func:`settled_solve`). Refused loops re-judge the accepted
ones as in the live graph (``loop_rejudge.py``): a wrong first loop is removed when enough
later loops disagree with it, and they go in. The returned
poses are a fresh solve of the graph without the rejected edges from the given poses, so they
equal what the same call without those edges returns. Every node must be reached from a fixed
node through the edges (a disconnected part has no gauge: refused with a ValueError).

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
from lingbot_map_ros.engine.mapping.graph.factors import FACTORIZATION, FactorMaker, Robust
from lingbot_map_ros.engine.mapping.graph.loop_gate import (joint_covariance, LoopGate,
                                                            StepVariances)
from lingbot_map_ros.engine.mapping.graph.loop_rejudge import MAX_CHALLENGERS, rejudge
from lingbot_map_ros.engine.optional_dependencies import require_gtsam
import numpy as np

logger = logging.getLogger(__name__)

EdgeKind = Literal['odometry', 'loop']
MAX_ITERATIONS = 100
"""Levenberg-Marquardt iteration cap of one solve."""
RELINEARIZE_THRESHOLD = 0.01
"""iSAM2 relinearises a variable whose update exceeds this (tangent units; both graphs)."""
SETTLE_UPDATES = 40
"""Most iSAM2 updates of one loop's solve (both graphs; see :func:`settled_solve`)."""


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
                        covariances: bool = True, gate: LoopGate | None = None
                        ) -> PoseGraphResult:
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
        gate: the loop gate (a default :class:`~.loop_gate.LoopGate`, the live graph's, when
            None).

    Returns:
        The optimised poses, the rejected loop edges and the marginals.

    Raises:
        ValueError: bad shapes or values, an edge naming a missing node, an unknown kind or
            kernel, no fixed node, a node no fixed node reaches through the edges.
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
    check_connected(len(arr), checked, fixed)
    gate = gate if gate is not None else LoopGate()
    scales = sim3.scale_of(arr)
    maker = FactorMaker(gtsam, scale_fixed, robust, scales)
    kept = [n for n, e in enumerate(checked) if e.kind != 'loop']
    values, graph = _solve(gtsam, maker, arr, [checked[n] for n in kept], fixed)
    steps = StepVariances()
    for n in kept:
        steps.add(maker, checked[n])
    base = graph
    rejected: list[int] = []
    challengers: list[int] = []
    for n in (n for n, e in enumerate(checked) if e.kind == 'loop'):
        edge = checked[n]
        joint = joint_covariance(isam_over(gtsam, graph, values), edge.i, edge.j)
        verdict = gate.judge(maker, values, joint, edge, (scales[edge.i], scales[edge.j]),
                             steps.unit(max(edge.i, edge.j)))
        if verdict.accepted:
            trial_graph = gtsam.NonlinearFactorGraph()
            trial_graph.push_back(graph)
            trial_graph.add(maker.factor(edge))
            trial_values = settled_solve(gtsam, trial_graph, values)
            residual = maker.residual(trial_values, edge)
            if residual <= max_residual:
                kept.append(n)
                values, graph = trial_values, trial_graph
                continue
            logger.info('loop edge %d (%d -> %d) rejected: residual %.3g > %.3g', n, edge.i,
                        edge.j, residual, max_residual)
        else:
            logger.info('loop edge %d (%d -> %d) rejected by the gate (%s, d2 %.3g > %.3g)', n,
                        edge.i, edge.j, verdict.reason, verdict.distance, verdict.bound)
        rejected.append(n)
        if verdict.reason not in ('inconsistent', 'ok') and (verdict.reason != 'scale'
                                                             or scale_fixed):
            continue  # 'ok': refused for its residual
        challengers = (challengers + [n])[-MAX_CHALLENGERS:]
        loops = [m for m in kept if checked[m].kind == 'loop']
        decision = rejudge(gtsam, maker, gate, base, values, [checked[m] for m in loops],
                           [checked[m] for m in challengers], scales, steps.unit,
                           lambda g, v: levenberg_marquardt(gtsam, g, v),
                           lambda g, v: isam_over(gtsam, g, v))
        if decision is None:
            continue
        out = {loops[k] for k in decision.removed}
        into = [challengers[k] for k in decision.adopted]
        logger.info('loop edges %s removed, %s adopted: the later loops disagree', sorted(out),
                    into)
        kept = [m for m in kept if m not in out] + into
        rejected = [m for m in rejected if m not in into] + sorted(out)
        challengers = [m for m in challengers if m not in into]
        graph = gtsam.NonlinearFactorGraph()
        graph.push_back(base)
        for m in kept:
            if checked[m].kind == 'loop':
                graph.add(maker.factor(checked[m]))
        values = levenberg_marquardt(gtsam, graph, decision.values)
    kept.sort()
    values, graph = _solve(gtsam, maker, arr, [checked[n] for n in kept], fixed)
    residuals = {n: maker.residual(values, checked[n]) for n in kept
                 if checked[n].kind == 'loop'}
    out = np.stack([maker.pose(values, n) for n in range(len(arr))])
    out[fixed] = arr[fixed]
    cov = None
    if covariances:
        marginals = isam_over(gtsam, graph, values)  # QR: a long chain's marginals too
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


def check_connected(num_nodes: int, edges: Sequence[PoseGraphEdge],
                    fixed: Sequence[int]) -> None:
    """Refuse a graph in which some node is not reached from a fixed node through the edges.

    Raises:
        ValueError: such a node (its part of the graph has no gauge: no determinate solve,
            no marginals).
    """
    parent = list(range(num_nodes))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for edge in edges:
        parent[root(edge.i)] = root(edge.j)
    gauged = {root(int(n)) for n in fixed}
    loose = [n for n in range(num_nodes) if root(n) not in gauged]
    if loose:
        raise ValueError(f'the graph is disconnected: {len(loose)} node(s) (first {loose[0]}) '
                         'are reached from no fixed node through the edges')


def isam_over(gtsam: Any, graph: Any, values: Any) -> Any:
    """Return iSAM2 over ``graph`` linearised at ``values`` (QR, as the live graph).

    Its marginals are the gate's.
    """
    params = gtsam.ISAM2Params()
    params.setFactorization(FACTORIZATION)
    isam = gtsam.ISAM2(params)
    isam.update(graph, values)
    return isam


def settled_solve(gtsam: Any, graph: Any, initial: Any) -> Any:
    """Solve ``graph`` from ``initial`` as the live graph solves a loop; returns the values.

    iSAM2 (QR, the live graph's relinearisation) updated until an update relinearises no
    variable (at most :data:`SETTLE_UPDATES`): after a long drifting route a loop moves the
    trajectory by a scale factor of several, where Levenberg-Marquardt and Gauss-Newton over
    the whole graph stall, and the live graph's partial relinearisation converges.
    """
    params = gtsam.ISAM2Params()
    params.setRelinearizeThreshold(RELINEARIZE_THRESHOLD)
    params.relinearizeSkip = 1
    params.setFactorization(FACTORIZATION)
    isam = gtsam.ISAM2(params)
    isam.update(graph, initial)
    for count in range(1, SETTLE_UPDATES + 1):
        if isam.update().getVariablesRelinearized() == 0 and count >= 2:
            break
    return isam.calculateEstimate()


def levenberg_marquardt(gtsam: Any, graph: Any, initial: Any) -> Any:
    """Levenberg-Marquardt over ``graph`` from ``initial`` (QR); returns the values."""
    params = gtsam.LevenbergMarquardtParams()
    params.setMaxIterations(MAX_ITERATIONS)
    params.setRelativeErrorTol(1e-10)
    params.setAbsoluteErrorTol(1e-12)
    params.setLinearSolverType('MULTIFRONTAL_QR')
    return gtsam.LevenbergMarquardtOptimizer(graph, initial, params).optimize()


def _solve(gtsam: Any, maker: FactorMaker, poses: Any, edges: list[PoseGraphEdge],
           fixed: list[int], graph: Any = None) -> tuple[Any, Any]:
    """Levenberg-Marquardt over ``edges`` (QR); returns (values, graph).

    ``poses`` is the start: [N, 4, 4] poses, or GTSAM Values (a warm start, then ``graph`` may
    hold the priors and every edge but the last, which is added to a copy).
    """
    if graph is not None:
        new_graph = gtsam.NonlinearFactorGraph()
        new_graph.push_back(graph)
        new_graph.add(maker.factor(edges[-1]))
        graph = new_graph
    else:
        graph = gtsam.NonlinearFactorGraph()
        for n in fixed:
            graph.add(maker.prior(n, poses[n]))
        for edge in edges:
            graph.add(maker.factor(edge))
    if isinstance(poses, np.ndarray):
        initial = gtsam.Values()
        for n, pose in enumerate(poses):
            initial.insert(n, maker.value(pose))
    else:
        initial = poses
    return levenberg_marquardt(gtsam, graph, initial), graph
