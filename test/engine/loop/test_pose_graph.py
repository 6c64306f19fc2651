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
"""optimize_pose_graph: drift corrected by loops, a wrong loop rejected, scale kept when fixed.

Run: ``pytest test/engine/loop/test_pose_graph.py`` (CPU, needs gtsam; a few seconds).
"""

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.loop import optimize_pose_graph, PoseGraphEdge
from loop_scenes import drifting_route, loop_edge, position_error, rotation
import numpy as np
import pytest

pytest.importorskip('gtsam')

LAP = 40


def _right_loops(truth: np.ndarray) -> list[PoseGraphEdge]:
    """Return loops where the second lap sees the first lap's places again (every fourth)."""
    return [loop_edge(truth, k, k + LAP) for k in range(0, LAP, 4)]


def test_loops_correct_drift_with_scale_drift() -> None:
    truth, odometry, edges = drifting_route(LAP)
    before = position_error(odometry, truth)
    result = optimize_pose_graph(odometry, edges + _right_loops(truth))
    after = position_error(result.poses, truth)
    assert before > 0.3  # the scale drift really moved the second lap
    assert after <= 0.3 * before, (before, after)
    assert result.rejected == ()
    np.testing.assert_allclose(result.poses[0], odometry[0], atol=1e-12)
    assert result.covariances.shape == (2 * LAP, 7, 7)
    # Marginals: the fixed node is certain, far nodes are not; every one symmetric PSD.
    variances = np.diagonal(result.covariances, axis1=1, axis2=2)
    assert variances[0].max() < 1e-9
    assert variances[LAP // 2, :3].min() > variances[1, :3].max()
    for cov in result.covariances:
        np.testing.assert_allclose(cov, cov.T, atol=1e-9)
        assert np.linalg.eigvalsh(cov).min() > -1e-9


def test_wrong_loop_rejected_and_result_equals_graph_without_it() -> None:
    truth, odometry, edges = drifting_route(LAP)
    right = _right_loops(truth)
    # A place that looks the same but is the opposite side of the circle: 1.5 units and
    # 90 degrees off the truth.
    wrong_error = sim3.make(rotation([0, 1, 0], np.pi / 2), [1.5, 0.0, 0.0])
    wrong = loop_edge(truth, 10, LAP + 30, error=wrong_error)
    all_edges = edges + right[:5] + [wrong] + right[5:]
    result = optimize_pose_graph(odometry, all_edges)
    assert result.rejected == (len(edges) + 5,)
    clean = optimize_pose_graph(odometry, edges + right)
    np.testing.assert_allclose(result.poses, clean.poses, atol=1e-9)
    np.testing.assert_allclose(result.covariances, clean.covariances, atol=1e-9)
    assert position_error(result.poses, truth) <= 0.3 * position_error(odometry, truth)


def test_scale_fixed_keeps_every_scale() -> None:
    truth, odometry, edges = drifting_route(LAP, seed=3)
    scales = sim3.scale_of(odometry)
    assert np.ptp(scales) > 0.1  # the odometry's scales really differ
    result = optimize_pose_graph(odometry, edges + _right_loops(truth), scale_fixed=True)
    np.testing.assert_allclose(sim3.scale_of(result.poses), scales, rtol=1e-9)
    free = optimize_pose_graph(odometry, edges + _right_loops(truth))
    assert np.abs(sim3.scale_of(free.poses) - scales).max() > 0.05
    np.testing.assert_allclose(result.covariances[:, 6, :], 0.0)


def test_scale_fixed_corrects_metric_drift() -> None:
    # Metric odometry (scale 1 everywhere), drifting in rotation and translation only.
    truth, _, _ = drifting_route(LAP)
    rng = np.random.default_rng(5)
    odometry, edges = [truth[0]], []
    info = np.diag([1 / 0.02 ** 2] * 3 + [1 / 0.01 ** 2] * 3 + [1e6])
    for n in range(1, len(truth)):
        rel = sim3.inverse(truth[n - 1]) @ truth[n]
        d = rng.normal(size=6) * 0.01 + 0.004
        measured = rel @ sim3.make(rotation(d[3:], float(np.linalg.norm(d[3:]))), d[:3])
        odometry.append(odometry[-1] @ measured)
        edges.append(PoseGraphEdge(n - 1, n, measured, info, 'odometry'))
    odometry = np.stack(odometry)
    result = optimize_pose_graph(odometry, edges + _right_loops(truth), scale_fixed=True)
    assert position_error(result.poses, truth) <= 0.3 * position_error(odometry, truth)


def test_fixed_nodes_do_not_move() -> None:
    truth, odometry, edges = drifting_route(LAP)
    result = optimize_pose_graph(odometry, edges + _right_loops(truth), fixed=(0, 5),
                                 covariances=False)
    assert result.covariances is None
    np.testing.assert_allclose(result.poses[[0, 5]], odometry[[0, 5]], atol=1e-12)
    moved = optimize_pose_graph(odometry, edges + _right_loops(truth), covariances=False)
    assert np.abs(moved.poses[5] - odometry[5]).max() > 1e-4  # node 5 moves when free


def test_bad_input_is_refused() -> None:
    truth, odometry, edges = drifting_route(5, laps=1)
    with pytest.raises(ValueError, match='fixed'):
        optimize_pose_graph(odometry, edges, fixed=())
    with pytest.raises(ValueError, match='nodes'):
        optimize_pose_graph(odometry, edges + [PoseGraphEdge(0, 9, np.eye(4), np.eye(7), 'loop')])
    bad = PoseGraphEdge(0, 1, edges[0].measurement, -np.eye(7), 'loop')
    with pytest.raises(ValueError, match='positive definite'):
        optimize_pose_graph(odometry, edges + [bad])
    with pytest.raises(ValueError, match='kind'):
        optimize_pose_graph(odometry, [PoseGraphEdge(0, 1, edges[0].measurement,
                                                     np.eye(7), 'gps')])
    sheared = odometry.copy()
    sheared[1, 0, 1] += 0.5
    with pytest.raises(ValueError, match='s \\* R'):
        optimize_pose_graph(sheared, edges)
