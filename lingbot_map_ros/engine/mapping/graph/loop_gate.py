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
"""Whether a verified loop edge may enter the pose graph: judged against the graph, not alone.

A loop that a place recogniser and a verifier accepted can still be wrong (a look-alike room).
Its own residual after an optimisation says little: a graph bends to fit one loop. So before
the loop goes in, :class:`LoopGate` predicts its measurement from the graph as it stands (the
odometry and every loop already accepted) and asks whether the difference is explained by the
uncertainty of both, a chi-square test with the edge's real information:

    e  = Log(Z^-1 inv(T_i) T_j)                 (the factor's error at the current estimate)
    P  = J Sigma_ij J^T,  J = [-Ad(inv(inv(T_i) T_j)), I]
    S  = k^2 (1 + rho^2 n) P + Omega^-1,  k = drift_factor, rho = systematic_drift
    d2 = e^T S^-1 e  <=  chi2(dim, probability)

``Sigma_ij`` is the joint marginal of both nodes (iSAM2's Bayes tree), so a loop with no
support is judged against the drift the odometry accumulated between its ends (a wrong loop
over a short stretch is far outside it, a true loop after a long drifting route inside), and
a loop after others is judged against what they made certain (pairwise consistency with every
accepted loop at once, through the graph).

Real drift is partly systematic (a monocular scale drift, a heading bias: the same sign step
after step). The graph's ``P`` is a random walk: its variance grows like the number of steps
``n`` between the nodes, a bias's like ``n^2``. So ``P`` is widened by ``1 + rho^2 n``, where
``n`` is the number of odometry steps ``P`` holds (its rotation variance over one step's:
after loops it is the few steps to the nearest corrected node, not the whole lap), and
``rho`` is the bias's standard deviation in step sigmas. A true loop after thousands of
drifting keyframes then passes, a wrong loop over a stretch where the drift is small still
fails.

Scale: with metric scale known (``scale_fixed``) the loop's own scale must agree with its nodes'
scales within ``max_scale_ratio``. Without it, scale is judged by consistency: the log-scale is
one row of the test, and also tested alone (its error within ``scale_sigmas`` standard
deviations of ``S``'s scale row), so a loop 2x off in scale over a stretch where the scale
drifted little fails even when the other rows fit. A loop that passes must still fit after
the update (the graphs' ``max_residual``).

Both solvers use it: the live graph (``incremental_graph.py``) for each loop as it comes, the
batch (``pose_graph.py``) for each loop in edge order against the graph of the edges before it,
so both accept and reject the same loops.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
import math
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.graph.factors import FactorMaker
import numpy as np
from scipy.stats import chi2

CHI2_PROBABILITY = 0.9999
"""Share of true loops (with the stated uncertainties) the test accepts: an odometry's drift
is partly systematic (a monocular scale drift), so the bound is generous; a wrong loop of a
metre or more over a short stretch is still tens of standard deviations off."""
MAX_SCALE_RATIO = 1.25
"""With metric scale known: a loop whose scale differs from its nodes' by more is rejected."""
MAX_SCALE_DRIFT = math.inf
"""Without metric scale: an optional hard bound on a loop's scale off the graph's prediction
(a factor; none by default: over a long monocular run the scale drifts by any factor, and the
scale is judged by consistency, :data:`SCALE_SIGMAS`)."""
SCALE_SIGMAS = 3.0
"""Without metric scale: a loop whose log-scale is off the prediction by more than this many
standard deviations of the test's scale row is rejected (consistency of the scale alone)."""
DRIFT_FACTOR = 3.0
"""The prediction's standard deviations are taken this many times the graph's: the odometry's
stated per-step sigmas are estimates, the model's real errors are larger and correlated."""
SYSTEMATIC_DRIFT = 0.1
"""``rho``: the systematic part of the drift, a bias per step in step standard deviations (with
:data:`DRIFT_FACTOR`, 0.3 sigma a step: a monocular odometry's steady ~0.6 % scale drift a
keyframe against a 1 % scale sigma is inside 2 of them); 0 is a pure random walk."""


@dataclass(frozen=True)
class GateVerdict:
    """What the gate says about one loop edge."""

    accepted: bool
    """The loop may go into the graph."""
    reason: str
    """'ok', 'scale' (the scale disagrees), 'inconsistent' (chi-square test failed) or
    'unsolvable' (no joint marginal: the live graph's, see ``PoseGraph.judge``)."""
    distance: float
    """Squared Mahalanobis distance of the loop from the graph's prediction (nan: not tested)."""
    bound: float
    """The chi-square bound it was held to."""


class LoopGate:
    """Chi-square test of a loop against the graph's prediction (see the module docstring)."""

    def __init__(self, probability: float = CHI2_PROBABILITY,
                 max_scale_ratio: float = MAX_SCALE_RATIO,
                 drift_factor: float = DRIFT_FACTOR,
                 max_scale_drift: float = MAX_SCALE_DRIFT,
                 systematic_drift: float = SYSTEMATIC_DRIFT,
                 scale_sigmas: float = SCALE_SIGMAS) -> None:
        """Keep the test's probability (0 < p < 1), the scale bounds (> 1), the drift model.

        Raises:
            ValueError: a probability outside (0, 1), a scale ratio not above 1 (``inf`` is no
                bound), a drift factor below 1, a negative systematic drift, a scale test of
                no more than 0 sigmas.
        """
        if not 0.0 < probability < 1.0:
            raise ValueError(f'probability={probability} must be in (0, 1)')
        for name, value in (('max_scale_ratio', max_scale_ratio),
                            ('max_scale_drift', max_scale_drift)):
            if not (value > 1.0 and (math.isfinite(value) or name == 'max_scale_drift')):
                raise ValueError(f'{name}={value} must be a number > 1')
        self.max_scale_drift = float(max_scale_drift)
        if not (math.isfinite(drift_factor) and drift_factor >= 1.0):
            raise ValueError(f'drift_factor={drift_factor} must be a finite number >= 1')
        self.drift_factor = float(drift_factor)
        if not (math.isfinite(systematic_drift) and systematic_drift >= 0.0):
            raise ValueError(f'systematic_drift={systematic_drift} must be a finite number >= 0')
        self.systematic_drift = float(systematic_drift)
        if not (math.isfinite(scale_sigmas) and scale_sigmas > 0.0):
            raise ValueError(f'scale_sigmas={scale_sigmas} must be a finite number > 0')
        self.scale_sigmas = float(scale_sigmas)
        self.probability = float(probability)
        self.max_scale_ratio = float(max_scale_ratio)

    def bound(self, dim: int) -> float:
        """Return the chi-square bound of a ``dim``-dimensional error."""
        return float(chi2.ppf(self.probability, dim))

    def judge(self, maker: FactorMaker, values: Any, joint: np.ndarray, edge: Any,
              scales: tuple[float, float] | None = None,
              step_variance: float | None = None) -> GateVerdict:
        """Judge ``edge`` against the estimate ``values`` and the nodes' joint covariance.

        Args:
            maker: the graph's factor maker (node type, information in GTSAM's order).
            values: the current estimate (GTSAM Values holding both nodes).
            joint: [2 d, 2 d] joint marginal covariance of (edge.i, edge.j), GTSAM's order.
            edge: the loop edge (checked).
            scales: (s_i, s_j), the nodes' fixed scales; required with ``scale_fixed``.
            step_variance: one odometry step's rotation variance (mean over the axes and the
                steps so far): the unit that counts the steps the prediction holds. None: no
                systematic part (a pure random walk).

        Returns:
            The verdict.
        """
        bound = self.bound(maker.dim)
        if maker.dim == 6:
            if scales is None:
                raise ValueError("judge: a scale-fixed graph needs the nodes' scales")
            ratio = float(sim3.scale_of(edge.measurement)) * scales[0] / scales[1]
            if abs(math.log(ratio)) > math.log(self.max_scale_ratio):
                return GateVerdict(False, 'scale', float('nan'), bound)
        err, adjoint, info = maker.error(values, edge)
        d = maker.dim
        if d == 7 and abs(err[6]) > math.log(self.max_scale_drift):
            return GateVerdict(False, 'scale', float('nan'), bound)
        jacobian = np.hstack([-adjoint, np.eye(d)])
        joint = np.asarray(joint, dtype=np.float64)
        predicted = jacobian @ joint @ jacobian.T
        widen = self.drift_factor ** 2 * (1.0 + self.systematic_drift ** 2 * self.steps(
            predicted, step_variance))
        innovation = predicted * widen + np.linalg.inv(info)
        innovation = 0.5 * (innovation + innovation.T)
        if d == 7 and innovation[6, 6] > 0 and \
                abs(err[6]) > self.scale_sigmas * math.sqrt(innovation[6, 6]):
            return GateVerdict(False, 'scale', float(err[6] ** 2 / innovation[6, 6]), bound)
        try:
            distance = float(err @ np.linalg.solve(innovation, err))
        except np.linalg.LinAlgError:
            return GateVerdict(False, 'inconsistent', float('inf'), bound)
        if not math.isfinite(distance) or distance > bound:
            return GateVerdict(False, 'inconsistent', distance, bound)
        return GateVerdict(True, 'ok', distance, bound)

    @staticmethod
    def steps(predicted: np.ndarray, step_variance: float | None) -> float:
        """Return how many odometry steps of drift ``predicted`` holds (0 without a unit).

        Its rotation variance (GTSAM's first three rows) over one step's.
        """
        if step_variance is None or not (math.isfinite(step_variance) and step_variance > 0):
            return 0.0
        return max(float(np.trace(predicted[:3, :3])) / (3.0 * step_variance), 0.0)


class StepVariances:
    """The gate's step unit by node: the mean rotation variance of the odometry edges so far.

    ``unit(node)`` is the mean over the edges whose newer node is at most ``node``: what the
    live graph holds when a loop whose newer node is ``node`` arrives, so the batch's unit for
    that loop is the same.
    """

    def __init__(self) -> None:
        """Start with no edge."""
        self._nodes: list[int] = []
        self._sums: list[float] = []

    def add(self, maker: FactorMaker, edge: Any) -> None:
        """Count an odometry edge (in any order; in node order it is O(1))."""
        node, variance = max(edge.i, edge.j), step_rotation_variance(maker, edge)
        if self._nodes and node < self._nodes[-1]:
            pairs = sorted(zip(self._nodes, np.diff([0.0] + self._sums)))
            pairs.insert(bisect.bisect_right([n for n, _ in pairs], node), (node, variance))
            self._nodes = [n for n, _ in pairs]
            self._sums = [float(v) for v in np.cumsum([v for _, v in pairs])]
            return
        self._nodes.append(node)
        self._sums.append((self._sums[-1] if self._sums else 0.0) + variance)

    def unit(self, node: int) -> float | None:
        """Return the mean over the edges up to ``node`` (None: no such edge)."""
        count = bisect.bisect_right(self._nodes, node)
        return self._sums[count - 1] / count if count else None


def step_rotation_variance(maker: FactorMaker, edge: Any) -> float:
    """Return an odometry edge's rotation variance, the mean over its three axes."""
    _, info = maker.measured(edge)
    return float(np.trace(np.linalg.inv(info)[:3, :3])) / 3.0


def joint_covariance(isam: Any, i: int, j: int) -> np.ndarray:
    """Return the [2 d, 2 d] joint marginal covariance of nodes ``i`` and ``j`` from iSAM2."""
    joint = isam.jointMarginalCovariance([i, j])
    top = np.hstack([joint.at(i, i), joint.at(i, j)])
    bottom = np.hstack([joint.at(j, i), joint.at(j, j)])
    return np.vstack([top, bottom])
