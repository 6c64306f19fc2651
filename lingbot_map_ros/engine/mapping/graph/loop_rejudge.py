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
"""Re-judging accepted loops when later ones disagree: a wrong first loop is not kept forever.

The gate (``loop_gate.py``) judges a loop against the graph as it stands, accepted loops
included. A wrong loop accepted first (nothing yet to tell it from a drift) bends the graph,
and every true loop after it is then refused as inconsistent. So the graphs keep the loops the
gate refused as inconsistent (in scale too, without metric scale) or that did not fit after
the update (the last :data:`MAX_CHALLENGERS`, the challengers) and, when one more is refused,
ask whether the challengers make a larger consistent set than the accepted loops they
contradict (pairwise consistency as in PCM, judged through the graph):

1. the challengers are judged by the gate one by one, in their order, against the graph of the
   odometry (priors and non-loop edges) and the challengers that passed before them;
2. each accepted loop is judged by the gate against that graph: those it refuses conflict;
3. the challengers are judged again, one by one, against the odometry, the accepted loops
   that do not conflict and the challengers that passed before them (wrong loops far apart
   look consistent over the odometry alone, not with the true loops that stay);
4. when at least :data:`MIN_SUPPORT` challengers passed and they are more than
   :data:`MAJORITY` times as many as the conflicting loops, the conflicting loops are removed
   and the challengers that passed are added.

:func:`rejudge` does steps 1-4 (a batch solve and a marginal per challenger: a rare event, it
runs only when a loop is refused while others are accepted). The live graph
(``incremental_graph.py``) and the batch (``pose_graph.py``) both call it with the same loops,
so they keep and remove the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from lingbot_map_ros.engine.mapping.graph.factors import FactorMaker
from lingbot_map_ros.engine.mapping.graph.loop_gate import joint_covariance, LoopGate

MAX_CHALLENGERS = 8
"""Refused loops that are kept to challenge the accepted ones (the newest)."""
MIN_SUPPORT = 3
"""Fewest mutually consistent challengers that may replace accepted loops."""
MAJORITY = 2
"""Challengers replace accepted loops only when they are more than this many times as many: an
accepted loop was consistent with the graph when it came, and the gate is loose over a few
keyframes, so a run of consistent look-alikes (six lying neighbours) that contradicts only the
few accepted loops next to it must not win."""


@dataclass(frozen=True)
class Rejudgement:
    """What re-judging decided: accepted loops to remove, challengers to add."""

    removed: tuple[int, ...]
    """Positions in ``accepted`` of the loops to take out."""
    adopted: tuple[int, ...]
    """Positions in ``challengers`` of the loops to put in."""
    values: Any
    """GTSAM Values solved over the odometry and the adopted challengers (a warm start)."""


def rejudge(gtsam: Any, maker: FactorMaker, gate: LoopGate, base: Any, values: Any,
            accepted: Sequence[Any], challengers: Sequence[Any],
            scales: Sequence[float], step_variance: Callable[[int], float | None],
            solve: Callable[[Any, Any], Any], isam_of: Callable[[Any, Any], Any]
            ) -> Rejudgement | None:
    """Decide whether ``challengers`` replace some of the ``accepted`` loops (module docstring).

    Args:
        gtsam: the module.
        maker: the graph's factor maker.
        gate: the graph's gate.
        base: GTSAM graph of the priors and the non-loop edges (not changed).
        values: the current estimate (the start of the solves).
        accepted: the loop edges in the graph.
        challengers: loop edges the gate refused, oldest first.
        scales: every node's scale (the gate's, with ``scale_fixed``).
        step_variance: ``newest node -> the gate's step unit`` (as when the loop came).
        solve: ``(graph, values) -> values``, the graph's own nonlinear solve.
        isam_of: ``(graph, values) -> iSAM2``, for the joint marginals.

    Returns:
        The decision, or None when the accepted loops stay.
    """
    if len(challengers) < MIN_SUPPORT or not accepted:
        return None
    adopted, graph, trial = _consistent(gtsam, maker, gate, base, values, challengers, scales,
                                        step_variance, solve, isam_of)
    if len(adopted) < MIN_SUPPORT:
        return None
    isam = isam_of(graph, trial)
    removed = tuple(k for k, edge in enumerate(accepted)
                    if not _passes(maker, gate, graph, trial, edge, scales, step_variance,
                                   lambda _g, _v: isam))
    if not removed or len(adopted) <= MAJORITY * len(removed):
        return None
    # The challengers must also agree with the accepted loops that stay (wrong loops far
    # apart look consistent with each other over the odometry alone, not with those).
    staying = gtsam.NonlinearFactorGraph()
    staying.push_back(base)
    for k, edge in enumerate(accepted):
        if k not in removed:
            staying.add(maker.factor(edge))
    adopted, _, trial = _consistent(gtsam, maker, gate, staying, trial, challengers, scales,
                                    step_variance, solve, isam_of)
    if len(adopted) < MIN_SUPPORT or len(adopted) <= MAJORITY * len(removed):
        return None
    return Rejudgement(removed, tuple(adopted), trial)


def _consistent(gtsam: Any, maker: FactorMaker, gate: LoopGate, base: Any, values: Any,
                challengers: Sequence[Any], scales: Sequence[float],
                step_variance: Callable[[int], float | None],
                solve: Callable[[Any, Any], Any], isam_of: Callable[[Any, Any], Any]
                ) -> tuple[list[int], Any, Any]:
    """Judge the challengers one by one on ``base`` plus those that passed before them.

    Returns:
        The positions of those that passed, the graph with them, its solution.
    """
    graph = gtsam.NonlinearFactorGraph()
    graph.push_back(base)
    trial = solve(graph, values)
    adopted = []
    for k, edge in enumerate(challengers):
        if not _passes(maker, gate, graph, trial, edge, scales, step_variance, isam_of):
            continue
        graph.add(maker.factor(edge))
        trial = solve(graph, trial)
        adopted.append(k)
    return adopted, graph, trial


def _passes(maker: FactorMaker, gate: LoopGate, graph: Any, values: Any, edge: Any,
            scales: Sequence[float], step_variance: Callable[[int], float | None],
            isam_of: Callable[[Any, Any], Any]) -> bool:
    try:
        joint = joint_covariance(isam_of(graph, values), edge.i, edge.j)
    except RuntimeError:  # no marginal: not a consistent loop
        return False
    return gate.judge(maker, values, joint, edge, (scales[edge.i], scales[edge.j]),
                      step_variance(max(edge.i, edge.j))).accepted
