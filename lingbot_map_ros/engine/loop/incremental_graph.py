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
"""The node's pose graph, grown one keyframe at a time and solved incrementally (iSAM2).

:class:`PoseGraph` holds what :func:`~lingbot_map_ros.engine.loop.pose_graph.optimize_pose_graph`
takes as a whole: keyframe nodes, odometry edges, robust loop edges. A keyframe costs one
iSAM2 update; a loop costs a few (iSAM2 takes one Gauss-Newton step per update, a loop that
moves the trajectory far needs several: :data:`LOOP_UPDATES`). A loop whose whitened residual
stays above ``max_residual`` after them is removed from the graph again (its factor taken out,
the graph updated) and reported rejected. Node 0 is the gauge.

Not thread-safe: one thread (the loop closer's worker) owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.loop.dependencies import require_gtsam
from lingbot_map_ros.engine.loop.factors import FactorMaker, Robust
from lingbot_map_ros.engine.loop.pose_graph import check_edge, PoseGraphEdge
import numpy as np

logger = logging.getLogger(__name__)

LOOP_UPDATES = 6
"""iSAM2 updates after a loop is added (and again after one is removed)."""
RELINEARIZE_THRESHOLD = 0.01
"""iSAM2 relinearises a variable whose update exceeds this (tangent units)."""


@dataclass(frozen=True)
class LoopOutcome:
    """What happened to one loop edge."""

    accepted: bool
    """The edge stays in the graph."""
    residual: float
    """Its whitened RMS residual after the updates (before removal when rejected)."""


class PoseGraph:
    """Keyframe pose graph on iSAM2 (see the module docstring)."""

    def __init__(self, *, scale_fixed: bool = False, robust: Robust = 'huber',
                 max_residual: float = 3.0) -> None:
        """Start an empty graph.

        Args:
            scale_fixed: Pose3 nodes that keep their scale (metric scale locked).
            robust: kernel of the loop edges.
            max_residual: whitened RMS residual above which a loop is rejected (> 0).

        Raises:
            ImportError: gtsam is not installed.
            ValueError: a bad ``robust`` or ``max_residual``.
        """
        if not max_residual > 0:
            raise ValueError(f'max_residual={max_residual} must be > 0')
        self._g = require_gtsam()
        self._scales: list[float] = []
        self._maker = FactorMaker(self._g, scale_fixed, robust, self._scales)
        self._max_residual = float(max_residual)
        params = self._g.ISAM2Params()
        params.setRelinearizeThreshold(RELINEARIZE_THRESHOLD)
        params.relinearizeSkip = 1
        self._isam = self._g.ISAM2(params)
        self._estimate: Any = self._g.Values()
        self._num_loops = 0
        self._edges: list[PoseGraphEdge] = []
        """Every edge in the graph (odometry and kept loops), for :meth:`edges`."""

    @property
    def num_nodes(self) -> int:
        """Return the number of keyframe nodes."""
        return len(self._scales)

    @property
    def num_loops(self) -> int:
        """Return the number of loop edges in the graph (accepted ones)."""
        return self._num_loops

    def add_node(self, pose: np.ndarray, odometry: PoseGraphEdge | None = None) -> int:
        """Add the next keyframe.

        The first node is held at ``pose`` (the gauge). Every later one needs its odometry
        edge from an earlier node; it starts at that node's estimate times the measurement,
        so a new keyframe follows the corrected trajectory.

        Args:
            pose: float64 [4, 4] Sim(3) odometry pose (its scale is the node's scale).
            odometry: edge ``i -> num_nodes`` of kind 'odometry' (None only for node 0).

        Returns:
            The node's index.

        Raises:
            ValueError: a bad pose or edge, or a missing odometry edge.
        """
        pose = sim3.check_poses(np.asarray(pose)[None], 'pose')[0]
        n = self.num_nodes
        graph, values = self._g.NonlinearFactorGraph(), self._g.Values()
        if n == 0:
            if odometry is not None:
                raise ValueError('the first node takes no odometry edge')
            self._scales.append(float(sim3.scale_of(pose)))
            graph.add(self._maker.prior(0, pose))
            values.insert(0, self._maker.value(pose))
        else:
            if odometry is None or odometry.kind != 'odometry' or odometry.j != n:
                raise ValueError(f'node {n} needs an odometry edge (i, {n})')
            edge = check_edge(odometry, n + 1, n)
            start = self.pose(edge.i) @ edge.measurement
            self._scales.append(float(sim3.scale_of(start if not self._fixed_scale()
                                                    else pose)))
            graph.add(self._maker.factor(edge))
            values.insert(n, self._maker.value(start))
            self._edges.append(edge)
        self._isam.update(graph, values)
        # Only the new node's estimate: an odometry edge to a new node tells the others
        # nothing, so theirs stand (the whole estimate is O(N): docs/loop_closure.md, costs).
        self._estimate.insert(n, self._isam.calculateEstimatePose3(n) if self._fixed_scale()
                              else self._isam.calculateEstimateSimilarity3(n))
        return n

    def add_loop(self, edge: PoseGraphEdge) -> LoopOutcome:
        """Add a loop edge, update, and take it out again when its residual stays large.

        Raises:
            ValueError: a bad edge (nodes not in the graph, not a 'loop').
        """
        edge = check_edge(edge, self.num_nodes, self.num_nodes)
        if edge.kind != 'loop':
            raise ValueError(f"add_loop takes kind 'loop', got {edge.kind!r}")
        graph = self._g.NonlinearFactorGraph()
        graph.add(self._maker.factor(edge))
        result = self._isam.update(graph, self._g.Values())
        index = list(result.getNewFactorsIndices())[0]
        try:
            self._settle()
            residual = self._maker.residual(self._estimate, edge)
        except RuntimeError as exc:  # GTSAM: an indeterminate system under this loop
            logger.warning('loop %d -> %d makes the graph unsolvable (%s): rejected', edge.i,
                           edge.j, str(exc).strip().splitlines()[0])
            residual = float('inf')
        if residual <= self._max_residual:
            self._num_loops += 1
            self._edges.append(edge)
            return LoopOutcome(True, residual)
        self._isam.update(self._g.NonlinearFactorGraph(), self._g.Values(), [index])
        self._settle()
        return LoopOutcome(False, residual)

    def pose(self, n: int) -> np.ndarray:
        """Node ``n``'s current [4, 4] Sim(3) estimate."""
        if not 0 <= n < self.num_nodes:
            raise ValueError(f'node {n} not in the graph ({self.num_nodes} nodes)')
        return self._maker.pose(self._estimate, n)

    def poses(self) -> np.ndarray:
        """Every node's estimate, float64 [N, 4, 4]."""
        return np.stack([self._maker.pose(self._estimate, n) for n in range(self.num_nodes)]) \
            if self.num_nodes else np.zeros((0, 4, 4))

    def covariance(self, n: int) -> np.ndarray:
        """Node ``n``'s marginal covariance [7, 7] (translation, rotation, log-scale)."""
        if not 0 <= n < self.num_nodes:
            raise ValueError(f'node {n} not in the graph ({self.num_nodes} nodes)')
        return self._maker.covariance(self._isam.marginalCovariance(n))

    def edges(self) -> list[PoseGraphEdge]:
        """Every edge in the graph: odometry edges and the loops kept, in the order added."""
        return list(self._edges)

    def seed(self, poses: np.ndarray, edges: list[PoseGraphEdge], *,
             fixed: range | tuple[int, ...] = (0,)) -> None:
        """Fill an empty graph with a saved one in one update (a loaded map).

        The nodes start at ``poses``; ``fixed`` nodes are held there by a tight prior (all of
        them: a map to localize in, which never moves), the first one is the gauge.

        Args:
            poses: float64 [N, 4, 4] Sim(3) estimates of nodes 0..N-1.
            edges: the saved edges (odometry plain, loops robust, none rejected again).
            fixed: nodes held in place (at least node 0).

        Raises:
            ValueError: a graph that is not empty, bad poses or edges, no fixed node 0, or a
                node that no prior and no edge holds.
        """
        if self.num_nodes:
            raise ValueError(f'seed needs an empty graph ({self.num_nodes} nodes)')
        poses = sim3.check_poses(poses, 'poses')
        checked = [check_edge(e, len(poses), m) for m, e in enumerate(edges)]
        held = set(fixed) | {e.i for e in checked} | {e.j for e in checked}
        if len(poses) and (0 not in set(fixed) or len(held) < len(poses)):
            raise ValueError('seed: node 0 must be fixed and every node held by an edge')
        graph, values = self._g.NonlinearFactorGraph(), self._g.Values()
        self._scales.extend(float(s) for s in sim3.scale_of(poses))
        for n, pose in enumerate(poses):
            values.insert(n, self._maker.value(pose))
        for n in fixed:
            graph.add(self._maker.prior(n, poses[n]))
        for edge in checked:
            graph.add(self._maker.factor(edge))
        self._isam.update(graph, values)
        self._edges.extend(checked)
        self._num_loops += sum(e.kind == 'loop' for e in checked)
        self._settle()

    def _fixed_scale(self) -> bool:
        return self._maker.dim == 6

    def _settle(self) -> None:
        for _ in range(LOOP_UPDATES):
            self._isam.update()
        self._estimate = self._isam.calculateEstimate()
