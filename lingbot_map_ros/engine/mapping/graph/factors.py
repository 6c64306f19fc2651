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
"""GTSAM factors and values of a pose graph, shared by the batch and the incremental solver.

Sim(3) nodes are ``Similarity3``; with ``scale_fixed`` they are ``Pose3`` and every node keeps the
scale it was added with (a measurement's translation is brought to world units, times ``s_i``,
and its log-scale row dropped). Edges' informations are reordered to GTSAM's tangent order.

Conditioning (why a long loop-free route once made iSAM2 raise "Indeterminate linear system"):
an edge's information has its eigenvalues held between ``1 / MAX_SIGMA**2`` and
``1 / MIN_SIGMA**2`` (a still camera's zero step is not an infinitely certain edge, a loose one
not a null one), and both solvers factorise with QR (:data:`FACTORIZATION`), not Cholesky: a
chain's information is ill-conditioned in the lever-arm directions (a rotation at node 0 moves
node 10,000 by metres) and Cholesky squares that condition number past double precision.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from lingbot_map_ros.engine import sim3
import numpy as np

Robust = Literal['huber', 'cauchy', 'none']
ROBUST_K = 1.345
"""Kernel width in whitened units (Huber's 95 % efficiency constant; Cauchy uses it too)."""
FIXED_SIGMA = 1e-6
"""Standard deviation of the prior that holds a fixed node (relative units)."""
WEAK_SIGMA = 1e3
"""Standard deviation of the weak prior a recovery puts on nodes (whitened units: it makes the
system determinate without moving a node that any edge holds)."""
MIN_SIGMA = 1e-4
"""Smallest standard deviation an edge's information may claim (its largest eigenvalue)."""
MAX_SIGMA = 1e3
"""Largest standard deviation an edge's information may claim (its smallest eigenvalue)."""
FACTORIZATION = 'QR'
"""iSAM2's factorisation (QR keeps long chains solvable where Cholesky fails)."""


def condition_information(info: np.ndarray) -> np.ndarray:
    """Return ``info`` with its eigenvalues held in ``[1 / MAX_SIGMA**2, 1 / MIN_SIGMA**2]``."""
    values, vectors = np.linalg.eigh(0.5 * (info + info.T))
    if values.min() >= MAX_SIGMA ** -2 and values.max() <= MIN_SIGMA ** -2:
        return info
    values = np.clip(values, MAX_SIGMA ** -2, MIN_SIGMA ** -2)
    return (vectors * values) @ vectors.T


class FactorMaker:
    """Builds GTSAM values and factors for nodes whose scales are known when they are added."""

    def __init__(self, gtsam: Any, scale_fixed: bool, robust: Robust,
                 scales: Sequence[float]) -> None:
        """Keep the module, the node type, the loops' kernel and the nodes' scales (a view)."""
        if robust not in ('huber', 'cauchy', 'none'):
            raise ValueError(f"robust={robust!r} must be 'huber', 'cauchy' or 'none'")
        self._g = gtsam
        self._scale_fixed = scale_fixed
        self._robust = robust
        self._scales = scales

    @property
    def dim(self) -> int:
        """Tangent dimension of a node (6 with the scale fixed, else 7)."""
        return 6 if self._scale_fixed else 7

    def value(self, pose: np.ndarray) -> Any:
        """Return a node's GTSAM value for a [4, 4] Sim(3) pose."""
        if self._scale_fixed:
            return sim3.to_pose3(self._g, pose)
        return sim3.to_similarity3(self._g, pose)

    def pose(self, values: Any, n: int) -> np.ndarray:
        """Node ``n``'s [4, 4] Sim(3) pose in ``values``."""
        if self._scale_fixed:
            return sim3.from_pose3(values.atPose3(n), float(self._scales[n]))
        return sim3.from_similarity3(values.atSimilarity3(n))

    def prior(self, n: int, pose: np.ndarray, sigma: float = FIXED_SIGMA) -> Any:
        """Return the prior that holds a node (tight by default: a fixed node)."""
        noise = self._g.noiseModel.Isotropic.Sigma(self.dim, sigma)
        factor = self._g.PriorFactorPose3 if self._scale_fixed else \
            self._g.PriorFactorSimilarity3
        return factor(n, self.value(pose), noise)

    def factor(self, edge: Any) -> Any:
        """Return the between factor of an edge (robust when it is a loop)."""
        g = self._g
        measured, info = self.measured(edge)
        noise = g.noiseModel.Gaussian.Information(info)
        if edge.kind == 'loop' and self._robust != 'none':
            kernel = (g.noiseModel.mEstimator.Huber.Create(ROBUST_K) if self._robust == 'huber'
                      else g.noiseModel.mEstimator.Cauchy.Create(ROBUST_K))
            noise = g.noiseModel.Robust.Create(kernel, noise)
        between = g.BetweenFactorPose3 if self._scale_fixed else g.BetweenFactorSimilarity3
        return between(edge.i, edge.j, measured, noise)

    def measured(self, edge: Any) -> tuple[Any, np.ndarray]:
        """Return the edge's measurement and information in GTSAM's form and tangent order."""
        info = condition_information(edge.information)[np.ix_(sim3.TO_GTSAM, sim3.TO_GTSAM)]
        if not self._scale_fixed:
            return sim3.to_similarity3(self._g, edge.measurement), info
        s_i = float(self._scales[edge.i])
        world = sim3.make(sim3.rotation_of(edge.measurement), s_i * edge.measurement[:3, 3])
        # Translation in world units: its standard deviation grows by s_i.
        unscale = np.diag([1.0, 1.0, 1.0, 1.0 / s_i, 1.0 / s_i, 1.0 / s_i])
        return sim3.to_pose3(self._g, world), unscale @ info[:6, :6] @ unscale

    def residual(self, values: Any, edge: Any) -> float:
        """Whitened RMS residual of an edge without its kernel: sqrt(e^T Omega e / dim)."""
        err, _, info = self.error(values, edge)
        return float(np.sqrt(max(err @ info @ err, 0.0) / len(err)))

    def error(self, values: Any, edge: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return an edge's error, the adjoint of its prediction's inverse, its information.

        The error is ``Log(Z^-1 inv(T_i) T_j)`` in GTSAM's tangent order; the adjoint
        ``Ad(inv(inv(T_i) T_j))`` carries a perturbation of node ``i`` into the error's tangent
        (``e ~ e0 + d_j - Ad d_i``, the gate's covariance of the prediction).
        """
        measured, info = self.measured(edge)
        if self._scale_fixed:
            a, b = values.atPose3(edge.i), values.atPose3(edge.j)
            predicted = a.between(b)
            err = self._g.Pose3.Logmap(measured.between(predicted))
        else:
            a, b = values.atSimilarity3(edge.i), values.atSimilarity3(edge.j)
            predicted = a.inverse().compose(b)
            err = self._g.Similarity3.Logmap(measured.inverse().compose(predicted))
        adjoint = np.asarray(predicted.inverse().AdjointMap(), dtype=np.float64)
        return np.asarray(err, dtype=np.float64), adjoint, info

    def covariance(self, cov: Any) -> np.ndarray:
        """Turn a GTSAM marginal into [7, 7] in our order (log-scale zero with the scale fixed)."""
        cov = np.asarray(cov, dtype=np.float64)
        if self._scale_fixed:
            full = np.zeros((7, 7))
            full[:6, :6] = cov
            cov = full
        return cov[np.ix_(sim3.TO_GTSAM, sim3.TO_GTSAM)]
