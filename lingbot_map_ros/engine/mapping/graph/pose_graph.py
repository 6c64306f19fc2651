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

:class:`PoseGraph` holds what
:func:`~lingbot_map_ros.engine.mapping.graph.batch_solve.optimize_pose_graph` takes as a whole:
keyframe nodes, odometry edges, robust loop edges. A keyframe costs one iSAM2 update. A loop is
first judged by the gate (``loop_gate.py``: a chi-square test of the loop against the graph's
prediction and the joint uncertainty of its two nodes, so against the odometry's drift and every
loop already accepted); a loop that passes costs a few updates (iSAM2 takes one Gauss-Newton step
per update, a loop that moves the trajectory far needs several: :data:`LOOP_UPDATES`), and one
whose whitened residual stays above ``max_residual`` after them is taken out again. Node 0 is the
gauge (a tight prior, the scale included).

Never a dead graph: every update is atomic. Nothing (node count, edges, stored factors) changes
before iSAM2 took the update; when it raises, the graph is rebuilt from the factors it keeps
(:meth:`PoseGraph.stats`: ``recoveries``), with a weak prior on every node when the plain
rebuild fails too, and the node or loop is added to the rebuilt graph. Factorisation is QR and
edge informations are conditioned (``factors.py``), so a 10,000-keyframe corridor without a
loop does not need a recovery at all.

Not thread-safe: one thread (the loop closer's worker) owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.imu.imu_factors import rotation_factor
from lingbot_map_ros.engine.mapping.graph.batch_solve import (check_connected, check_edge,
                                                              isam_over, levenberg_marquardt,
                                                              PoseGraphEdge, RELINEARIZE_THRESHOLD,
                                                              SETTLE_UPDATES)
from lingbot_map_ros.engine.mapping.graph.factors import (FACTORIZATION, FactorMaker, Robust,
                                                          WEAK_SIGMA)
from lingbot_map_ros.engine.mapping.graph.loop_gate import (GateVerdict, joint_covariance,
                                                            LoopGate, StepVariances)
from lingbot_map_ros.engine.mapping.graph.loop_rejudge import MAX_CHALLENGERS, MIN_SUPPORT, rejudge
from lingbot_map_ros.engine.optional_dependencies import require_gtsam
import numpy as np

logger = logging.getLogger(__name__)

LOOP_UPDATES = 2
"""Fewest iSAM2 updates after a loop is added (and after one is removed); more while an
update still relinearises variables (moved more than ``RELINEARIZE_THRESHOLD``)."""
MAX_LOOP_UPDATES = SETTLE_UPDATES
"""Most iSAM2 updates after a loop: iSAM2 takes one Gauss-Newton step per update, and a loop
after a long drifting route (the scale off by a factor of several) needs many."""


@dataclass(frozen=True)
class LoopOutcome:
    """What happened to one loop edge."""

    accepted: bool
    """The edge stays in the graph."""
    residual: float
    """Its whitened RMS residual after the updates (before removal when rejected after them;
    at the current estimate when the gate refused it)."""
    reason: str = 'ok'
    """'ok', or why it was rejected: 'inconsistent' or 'scale' (the gate), 'residual' (too
    large after the updates), 'unsolvable' (the graph could not take it)."""
    distance: float = float('nan')
    """The gate's squared Mahalanobis distance (nan when not tested)."""
    removed: tuple[PoseGraphEdge, ...] = ()
    """Loops accepted earlier that this one's arrival took out again (re-judged: the later
    loops disagree with them, ``loop_rejudge.py``)."""
    adopted: tuple[PoseGraphEdge, ...] = ()
    """Loops refused earlier that went in with the re-judging (this one is not among them: it
    is ``accepted``)."""


class PoseGraph:
    """Keyframe pose graph on iSAM2 (see the module docstring)."""

    def __init__(self, *, scale_fixed: bool = False, robust: Robust = 'huber',
                 max_residual: float = 3.0, gate: LoopGate | None = None,
                 factorization: str = FACTORIZATION) -> None:
        """Start an empty graph.

        Args:
            scale_fixed: Pose3 nodes that keep their scale (metric scale locked).
            robust: kernel of the loop edges.
            max_residual: whitened RMS residual above which a loop is rejected (> 0).
            gate: the loop gate (a default :class:`LoopGate` when None).
            factorization: iSAM2's, 'QR' or 'CHOLESKY' (a recovery always rebuilds with QR).

        Raises:
            ImportError: gtsam is not installed.
            ValueError: a bad ``robust``, ``max_residual`` or ``factorization``.
        """
        if not max_residual > 0:
            raise ValueError(f'max_residual={max_residual} must be > 0')
        if factorization not in ('QR', 'CHOLESKY'):
            raise ValueError(f"factorization={factorization!r} must be 'QR' or 'CHOLESKY'")
        self._g = require_gtsam()
        self._scales: list[float] = []
        self._maker = FactorMaker(self._g, scale_fixed, robust, self._scales)
        self._max_residual = float(max_residual)
        self._gate = gate if gate is not None else LoopGate()
        self._isam = self._new_isam(factorization)
        self._estimate: Any = self._g.Values()
        self._factors: Any = self._g.NonlinearFactorGraph()
        """Every factor in the graph (priors, odometry, kept loops): what a rebuild starts from."""
        self._num_loops = 0
        self._counts = {'recoveries': 0, 'rejected_gate': 0, 'rejected_residual': 0,
                        'rejected_unsolvable': 0, 'loops_removed': 0, 'loops_adopted': 0,
                        'imu_factors': 0}
        self._edges: list[PoseGraphEdge] = []
        """Every edge in the graph (odometry and kept loops), for :meth:`edges`."""
        self._steps = StepVariances()
        """The odometry edges' rotation variances (the gate's step unit)."""
        self._loops: list[tuple[PoseGraphEdge, int]] = []
        """The loops added here and kept, each with its factor's position in ``_factors``."""
        self._challengers: list[PoseGraphEdge] = []
        """The newest loops the gate refused as inconsistent (``loop_rejudge.py``)."""
        self._factorization = factorization

    @property
    def num_nodes(self) -> int:
        """Return the number of keyframe nodes."""
        return len(self._scales)

    @property
    def num_loops(self) -> int:
        """Return the number of loop edges in the graph (accepted ones)."""
        return self._num_loops

    def stats(self) -> dict[str, int]:
        """Return the graph's counters: nodes, loops, recoveries, rejected loops by cause.

        ``loops_removed``: accepted loops taken out again by re-judging; ``loops_adopted``:
        refused loops it put in (each also counted once in ``rejected_gate``);
        ``imu_factors``: gyroscope rotation factors in the graph (:meth:`add_node`).
        """
        return {'nodes': self.num_nodes, 'loops': self._num_loops, **self._counts}

    def add_node(self, pose: np.ndarray, odometry: PoseGraphEdge | None = None,
                 rotation: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """Add the next keyframe.

        The first node is held at ``pose`` (the gauge). Every later one needs its odometry
        edge from an earlier node; it starts at that node's estimate times the measurement,
        so a new keyframe follows the corrected trajectory. With ``rotation`` (the IMU's), a
        rotation factor between the odometry edge's two nodes goes in with it
        (``engine/imu/imu_factors.py``: the gyroscope's relative rotation, translation and
        scale loose); it is kept among the factors, so a rebuild and a re-judging keep it.
        Atomic: the graph is unchanged when this raises.

        Args:
            pose: float64 [4, 4] Sim(3) odometry pose (its scale is the node's scale).
            odometry: edge ``i -> num_nodes`` of kind 'odometry' (None only for node 0).
            rotation: ``(R [3, 3], cov [3, 3])``, the camera's rotation from node ``i`` to this
                one and its covariance (rad^2), or None.

        Returns:
            The node's index.

        Raises:
            ValueError: a bad pose or edge, or a missing odometry edge.
            RuntimeError: GTSAM refused the node even after a rebuild (the graph unchanged).
        """
        pose = sim3.check_poses(np.asarray(pose)[None], 'pose')[0]
        n = self.num_nodes
        edge = None
        if n == 0:
            if odometry is not None:
                raise ValueError('the first node takes no odometry edge')
            scale, factor, value = float(sim3.scale_of(pose)), self._maker.prior(0, pose), \
                self._maker.value(pose)
        else:
            if odometry is None or odometry.kind != 'odometry' or odometry.j != n:
                raise ValueError(f'node {n} needs an odometry edge (i, {n})')
            edge = check_edge(odometry, n + 1, n)
            start = self.pose(edge.i) @ edge.measurement
            scale = float(sim3.scale_of(pose if self._fixed_scale() else start))
            factor, value = self._maker.factor(edge), self._maker.value(start)
        imu = None
        if rotation is not None:
            if edge is None:
                raise ValueError('the first node takes no rotation factor')
            imu = rotation_factor(self._g, edge.i, n, rotation[0], rotation[1],
                                  'pose3' if self._fixed_scale() else 'sim3')
        graph, values = self._g.NonlinearFactorGraph(), self._g.Values()
        graph.add(factor)
        if imu is not None:
            graph.add(imu)
        values.insert(n, value)
        self._update(graph, values, f'node {n}')
        self._scales.append(scale)
        self._factors.add(factor)
        if imu is not None:
            self._factors.add(imu)
            self._counts['imu_factors'] += 1
        if edge is not None:
            self._edges.append(edge)
            self._count_step(edge)
        # Only the new node's estimate: an odometry edge to a new node tells the others
        # nothing, so theirs stand (the whole estimate is O(N): docs/loop_closure.md, costs).
        estimate = self._isam.calculateEstimatePose3(n) if self._fixed_scale() \
            else self._isam.calculateEstimateSimilarity3(n)
        if self._estimate.exists(n):  # a recovery read the whole estimate already
            self._estimate.update(n, estimate)
        else:
            self._estimate.insert(n, estimate)
        return n

    def add_loop(self, edge: PoseGraphEdge) -> LoopOutcome:
        """Judge a loop edge with the gate; add a passing one, update, keep it when it fits.

        Raises:
            ValueError: a bad edge (nodes not in the graph, not a 'loop').
        """
        edge = check_edge(edge, self.num_nodes, self.num_nodes)
        if edge.kind != 'loop':
            raise ValueError(f"add_loop takes kind 'loop', got {edge.kind!r}")
        verdict = self.judge(edge)
        if not verdict.accepted:
            logger.info('loop %d -> %d rejected by the gate (%s, d2 %.3g > %.3g)', edge.i,
                        edge.j, verdict.reason, verdict.distance, verdict.bound)
            residual = self._maker.residual(self._estimate, edge)
            if verdict.reason == 'inconsistent' or (verdict.reason == 'scale'
                                                    and not self._fixed_scale()):
                outcome = self._rejudge(edge, verdict)
                if outcome is not None:
                    return outcome
            self._counts['rejected_gate'] += 1
            return LoopOutcome(False, residual, verdict.reason, verdict.distance)
        factor = self._maker.factor(edge)
        graph = self._g.NonlinearFactorGraph()
        graph.add(factor)
        try:
            result = self._isam.update(graph, self._g.Values())
            index = list(result.getNewFactorsIndices())[0]
            self._settle(edge)
            residual = self._maker.residual(self._estimate, edge)
        except RuntimeError as exc:  # GTSAM: an indeterminate system under this loop
            logger.warning('loop %d -> %d makes the graph unsolvable (%s): rejected, graph '
                           'rebuilt without it', edge.i, edge.j, _first_line(exc))
            try:
                self._recover(self._g.NonlinearFactorGraph(), self._g.Values())
            except RuntimeError as again:  # iSAM2 holds the kept factors again (_rebuild)
                logger.error('pose graph: rebuild after loop %d -> %d failed (%s)', edge.i,
                             edge.j, _first_line(again))
            self._counts['rejected_unsolvable'] += 1
            return LoopOutcome(False, float('inf'), 'unsolvable', verdict.distance)
        if residual <= self._max_residual:
            self._num_loops += 1
            self._edges.append(edge)
            self._loops.append((edge, self._factors.size()))
            self._factors.add(factor)
            return LoopOutcome(True, residual, 'ok', verdict.distance)
        try:
            self._isam.update(self._g.NonlinearFactorGraph(), self._g.Values(), [index])
            self._settle()
        except RuntimeError as exc:  # the kept factors do not hold the loop: rebuild on them
            logger.warning('taking loop %d -> %d out failed (%s): graph rebuilt without it',
                           edge.i, edge.j, _first_line(exc))
            self._recover(self._g.NonlinearFactorGraph(), self._g.Values())
        outcome = self._rejudge(edge, GateVerdict(False, 'residual', verdict.distance,
                                                  verdict.bound))
        if outcome is not None:
            return outcome
        self._counts['rejected_residual'] += 1
        return LoopOutcome(False, residual, 'residual', verdict.distance)

    def judge(self, edge: PoseGraphEdge) -> GateVerdict:
        """Return the gate's verdict on a loop (the graph's estimate unchanged).

        Raises:
            ValueError: a bad edge.
        """
        edge = check_edge(edge, self.num_nodes, self.num_nodes)
        try:
            try:
                joint = joint_covariance(self._isam, edge.i, edge.j)
            except RuntimeError as exc:
                logger.warning('joint marginal of %d, %d failed (%s): graph rebuilt', edge.i,
                               edge.j, _first_line(exc))
                self._recover(self._g.NonlinearFactorGraph(), self._g.Values())
                joint = joint_covariance(self._isam, edge.i, edge.j)
        except RuntimeError as exc:
            logger.error('no joint marginal of %d, %d even after a rebuild (%s): the loop is '
                         'refused', edge.i, edge.j, _first_line(exc))
            return GateVerdict(False, 'unsolvable', float('nan'), float('nan'))
        scales = (self._scales[edge.i], self._scales[edge.j])
        return self._gate.judge(self._maker, self._estimate, joint, edge, scales,
                                self._steps.unit(max(edge.i, edge.j)))

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
                node that no fixed node reaches through the edges (a disconnected graph).
        """
        if self.num_nodes:
            raise ValueError(f'seed needs an empty graph ({self.num_nodes} nodes)')
        poses = sim3.check_poses(poses, 'poses')
        checked = [check_edge(e, len(poses), m) for m, e in enumerate(edges)]
        if len(poses) and 0 not in set(fixed):
            raise ValueError('seed: node 0 must be fixed')
        check_connected(len(poses), checked, fixed)
        graph, values = self._g.NonlinearFactorGraph(), self._g.Values()
        for n, pose in enumerate(poses):
            values.insert(n, self._maker.value(pose))
        for n in fixed:
            graph.add(self._maker.prior(n, poses[n]))
        scales = [float(s) for s in sim3.scale_of(poses)]
        self._scales.extend(scales)  # the factors of a scale-fixed graph read them
        try:
            for edge in checked:
                graph.add(self._maker.factor(edge))
            self._update(graph, values, 'the seed')
        except Exception:
            del self._scales[:]
            raise
        self._factors.push_back(graph)
        self._edges.extend(checked)
        for edge in checked:
            if edge.kind != 'loop':
                self._count_step(edge)
        self._num_loops += sum(e.kind == 'loop' for e in checked)
        self._settle()

    def _count_step(self, edge: PoseGraphEdge) -> None:
        self._steps.add(self._maker, edge)

    def _rejudge(self, edge: PoseGraphEdge, verdict: GateVerdict) -> LoopOutcome | None:
        """Let the refused ``edge`` and the earlier challengers re-judge the accepted loops.

        A challenger is a loop refused as inconsistent by the gate (its scale included, without
        metric scale) or for its residual.

        Returns:
            ``edge``'s outcome when accepted loops were replaced, None when nothing changed.
        """
        self._challengers = (self._challengers + [edge])[-MAX_CHALLENGERS:]
        if not self._loops or len(self._challengers) < MIN_SUPPORT:
            return None  # nothing to re-judge, or too few to outvote any loop
        loop_at = {position: k for k, (_, position) in enumerate(self._loops)}
        base = self._g.NonlinearFactorGraph()
        for position in range(self._factors.size()):
            if position not in loop_at:
                base.add(self._factors.at(position))
        try:
            decision = rejudge(
                self._g, self._maker, self._gate, base, self._estimate,
                [e for e, _ in self._loops], self._challengers, self._scales, self._steps.unit,
                lambda g, v: levenberg_marquardt(self._g, g, v),
                lambda g, v: isam_over(self._g, g, v))
        except RuntimeError as exc:  # a solve failed: the accepted loops stay
            logger.warning('re-judging the loops failed (%s): they stay', _first_line(exc))
            return None
        if decision is None:
            return None
        out = {self._loops[k][1] for k in decision.removed}
        into = [self._challengers[k] for k in decision.adopted]
        factors, loops = self._g.NonlinearFactorGraph(), []
        for position in range(self._factors.size()):
            if position in out:
                continue
            if position in loop_at:
                loops.append((self._loops[loop_at[position]][0], factors.size()))
            factors.add(self._factors.at(position))
        for loop in into:
            loops.append((loop, factors.size()))
            factors.add(self._maker.factor(loop))
        isam = self._new_isam(self._factorization)
        try:
            isam.update(factors, decision.values)
        except RuntimeError as exc:
            logger.warning('re-judging: the graph with the adopted loops failed (%s): the '
                           'accepted loops stay', _first_line(exc))
            return None
        removed = tuple(self._loops[k][0] for k in decision.removed)
        logger.warning('re-judging: %d accepted loop(s) removed, %d refused one(s) adopted: '
                       'the later loops disagree with them', len(removed), len(into))
        self._isam, self._factors, self._loops = isam, factors, loops
        self._edges = [e for e in self._edges if not any(e is r for r in removed)] + into
        self._num_loops += len(into) - len(removed)
        self._challengers = [c for c in self._challengers if not any(c is a for a in into)]
        self._counts['loops_removed'] += len(removed)
        self._counts['loops_adopted'] += len(into) - any(a is edge for a in into)
        self._settle(into[-1])
        adopted = tuple(a for a in into if a is not edge)
        if any(a is edge for a in into):
            return LoopOutcome(True, self._maker.residual(self._estimate, edge), 'ok',
                               verdict.distance, removed, adopted)
        self._counts['rejected_gate' if verdict.reason != 'residual' else 'rejected_residual'] \
            += 1
        return LoopOutcome(False, self._maker.residual(self._estimate, edge), verdict.reason,
                           verdict.distance, removed, adopted)

    def _fixed_scale(self) -> bool:
        return self._maker.dim == 6

    def _settle(self, edge: PoseGraphEdge | None = None) -> None:
        """Update iSAM2 until it relinearises no variable (at most ``MAX_LOOP_UPDATES``).

        Without ``edge`` (a removal, a seed): :data:`LOOP_UPDATES` updates.
        """
        for count in range(1, MAX_LOOP_UPDATES + 1):
            relinearized = self._isam.update().getVariablesRelinearized()
            if count >= LOOP_UPDATES and (edge is None or relinearized == 0):
                break
        self._estimate = self._isam.calculateEstimate()

    def _new_isam(self, factorization: str) -> Any:
        params = self._g.ISAM2Params()
        params.setRelinearizeThreshold(RELINEARIZE_THRESHOLD)
        params.relinearizeSkip = 1
        params.setFactorization(factorization)
        return self._g.ISAM2(params)

    def _update(self, graph: Any, values: Any, what: str) -> None:
        """Give iSAM2 new factors and values; recover (rebuild) when it raises."""
        try:
            self._isam.update(graph, values)
            return
        except RuntimeError as exc:
            logger.warning('pose graph: iSAM2 refused %s (%s); rebuilding the graph', what,
                           _first_line(exc))
        self._recover(graph, values)

    def _recover(self, graph: Any, values: Any) -> None:
        """Rebuild over the kept factors plus ``graph``: plain first, then with weak priors."""
        try:
            self._rebuild(graph, values, weak=False)
        except RuntimeError as exc:
            logger.warning('pose graph: the rebuild failed too (%s); rebuilding with a weak '
                           'prior on every node', _first_line(exc))
            self._rebuild(graph, values, weak=True)

    def _rebuild(self, graph: Any, values: Any, *, weak: bool) -> None:
        """Replace iSAM2 by a fresh one over the kept factors plus ``graph`` (QR).

        With ``weak`` every node (the new ones included) also gets a weak prior at its current
        value, kept among the factors from then on. Counted in ``recoveries``.

        Raises:
            RuntimeError: GTSAM refused the rebuilt system (iSAM2 then holds the kept factors
                only, the graph is as before the call).
        """
        self._counts['recoveries'] += 1
        isam = self._new_isam('QR')
        full = self._g.NonlinearFactorGraph()
        full.push_back(self._factors)
        full.push_back(graph)
        initial = self._g.Values(self._estimate)
        initial.insert(values)
        weak_priors = self._g.NonlinearFactorGraph()
        if weak:
            for key in initial.keys():
                weak_priors.add(self._weak_prior(initial, int(key)))
            full.push_back(weak_priors)
        try:
            isam.update(full, initial)
        except RuntimeError:
            self._isam = self._new_isam('QR')
            if self._factors.size():
                self._isam.update(self._factors, self._g.Values(self._estimate))
            raise
        self._isam = isam
        self._factors.push_back(weak_priors)
        self._estimate = isam.calculateEstimate()

    def _weak_prior(self, values: Any, n: int) -> Any:
        if self._fixed_scale():
            value = values.atPose3(n)
            return self._g.PriorFactorPose3(n, value, self._g.noiseModel.Isotropic.Sigma(
                6, WEAK_SIGMA))
        value = values.atSimilarity3(n)
        return self._g.PriorFactorSimilarity3(n, value, self._g.noiseModel.Isotropic.Sigma(
            7, WEAK_SIGMA))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
