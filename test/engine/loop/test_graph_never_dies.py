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
"""The pose graph survives long loop-free routes, failed updates and bad graphs (#45 item 2).

Before: with the default sigmas iSAM2 raised "Indeterminate linear system" after ~1,080
keyframes of a straight route, the failed ``add_node`` left the node count raised and every
later keyframe raised ``KeyError``; a batch solve of a 2,000-keyframe chain raised too; a
disconnected graph raised GTSAM's ``IndexError`` for its marginals.

Run: ``pytest test/engine/loop/test_graph_never_dies.py`` (CPU, needs gtsam; the two
10,000-keyframe routes are marked slow, about 15 s each on 2 cores).
"""

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.loop import optimize_pose_graph, PoseGraphEdge
from lingbot_map_ros.engine.mapping.graph.pose_graph import PoseGraph
from lingbot_map_ros.loop_config import LoopConfig
from lingbot_map_ros.tools.bench_graph import odometry_edge
from loop_scenes import rotation
import numpy as np
import pytest

pytest.importorskip('gtsam')

CONFIG = LoopConfig()
STEP = 0.1
"""Distance between two keyframes (units)."""
LOOP_INFO = np.diag(1.0 / np.square([0.01] * 3 + [0.002] * 3 + [0.002]))


def corridor(num: int) -> np.ndarray:
    """Return a corridor walked to its end and back: ``num`` keyframes, the last at the start."""
    half = num // 2
    out = []
    for n in range(num):
        x = STEP * (n if n < half else 2 * half - n - 1)
        heading = 0.0 if n < half else np.pi
        out.append(sim3.make(rotation([0, 0, 1], heading), [x, 0.0, 0.0]))
    return np.stack(out)


def circle(num: int, lap: int = 200) -> np.ndarray:
    """Return laps of a circle, ``lap`` keyframes each (a warehouse loop with no loop closure)."""
    angles = 2 * np.pi * np.arange(num) / lap
    radius = lap * STEP / (2 * np.pi)
    return np.stack([sim3.make(rotation([0, 0, 1], a),
                               [radius * np.cos(a), radius * np.sin(a), 0.0]) for a in angles])


def drift(truth: np.ndarray, seed: int = 0, noise: float = 0.5) -> np.ndarray:
    """Return the truth as an odometry sees it whose steps have ``noise`` times the sigmas."""
    rng = np.random.default_rng(seed)
    out = [truth[0]]
    for n in range(1, len(truth)):
        step = sim3.inverse(truth[n - 1]) @ truth[n]
        d = rng.normal(size=7) * noise * np.array(
            [CONFIG.odometry_translation_sigma * STEP] * 3
            + [CONFIG.odometry_rotation_sigma] * 3 + [CONFIG.odometry_scale_sigma])
        error = sim3.make(rotation(d[3:6], float(np.linalg.norm(d[3:6]))), d[:3],
                          float(np.exp(d[6])))
        out.append(out[-1] @ step @ error)
    return np.stack(out)


def feed(graph: PoseGraph, odometry: np.ndarray) -> None:
    """Add every keyframe with the loop closer's odometry information rule."""
    for n in range(len(odometry)):
        graph.add_node(odometry[n], odometry_edge(odometry, n, CONFIG) if n else None)


def true_loop(truth: np.ndarray, i: int, j: int) -> PoseGraphEdge:
    """Return a loop edge measuring the true relative pose."""
    return PoseGraphEdge(i, j, sim3.inverse(truth[i]) @ truth[j], LOOP_INFO, 'loop')


@pytest.mark.slow
@pytest.mark.parametrize('shape', ['corridor', 'circle'])
def test_ten_thousand_keyframes_without_a_loop_then_a_loop(shape):
    num = 10_000
    truth = corridor(num) if shape == 'corridor' else circle(num)
    odometry = drift(truth)
    graph = PoseGraph(max_residual=CONFIG.max_residual)
    feed(graph, odometry)
    assert graph.num_nodes == num
    assert graph.stats()['recoveries'] == 0  # well conditioned: nothing to recover from
    cov = graph.covariance(num - 1)
    assert np.isfinite(cov).all() and np.linalg.eigvalsh(cov).min() > 0
    # The odometry's drift is real: the last keyframe is far from where it truly is.
    before = np.linalg.norm(graph.pose(num - 1)[:3, 3] - truth[-1][:3, 3])
    assert before > 1.0
    outcome = graph.add_loop(true_loop(truth, 0, num - 1))
    assert outcome.accepted, outcome
    after = np.linalg.norm(graph.pose(num - 1)[:3, 3] - truth[-1][:3, 3])
    assert after < 0.1 * before, (before, after)
    assert graph.num_loops == 1 and len(graph.edges()) == num


def test_cholesky_failure_is_recovered_and_the_graph_stays_whole():
    # The old setup (Cholesky) fails on a straight route after ~1,080 keyframes; the graph
    # rebuilds itself (QR), counts it and every keyframe gets in.
    truth = np.stack([sim3.make(np.eye(3), [STEP * n, 0.0, 0.0]) for n in range(1300)])
    graph = PoseGraph(factorization='CHOLESKY')
    feed(graph, truth)
    assert graph.num_nodes == 1300
    assert graph.stats()['recoveries'] >= 1
    reference = PoseGraph()
    feed(reference, truth)
    assert reference.stats()['recoveries'] == 0
    np.testing.assert_allclose(graph.poses()[:, :3, 3], reference.poses()[:, :3, 3], atol=1e-6)
    # Still alive: a next keyframe and a loop go in.
    more = np.concatenate([truth, [sim3.make(np.eye(3), [STEP * 1300, 0.0, 0.0])]])
    graph.add_node(more[-1], odometry_edge(more, 1300, CONFIG))
    assert graph.num_nodes == 1301
    assert graph.add_loop(true_loop(more, 1250, 1300)).accepted


def test_a_refused_node_leaves_the_graph_unchanged():
    truth = corridor(10)
    graph = PoseGraph()
    feed(graph, truth)
    before = graph.poses()
    bad = PoseGraphEdge(3, 10, np.eye(4), np.eye(7), 'loop')  # not an odometry edge
    with pytest.raises(ValueError, match='odometry edge'):
        graph.add_node(truth[0], bad)
    assert graph.num_nodes == 10 and len(graph.edges()) == 9
    np.testing.assert_allclose(graph.poses(), before)
    graph.add_node(truth[0], PoseGraphEdge(9, 10, sim3.inverse(truth[9]) @ truth[0],
                                           np.eye(7) * 1e4, 'odometry'))
    assert graph.num_nodes == 11


def test_batch_solve_of_a_long_chain_does_not_raise():
    num = 2500
    truth = circle(num)
    odometry = drift(truth, seed=2)
    edges = [odometry_edge(odometry, n, CONFIG) for n in range(1, num)]
    edges.append(true_loop(truth, 0, num - 1))
    result = optimize_pose_graph(odometry, edges, covariances=True)
    assert result.rejected == ()
    end = np.linalg.norm(result.poses[-1][:3, 3] - truth[-1][:3, 3])
    assert end < 0.1 * np.linalg.norm(odometry[-1][:3, 3] - truth[-1][:3, 3])
    assert np.isfinite(result.covariances).all()


def test_a_still_camera_is_no_infinitely_certain_edge():
    # A zero step with a huge stated information (sigma 1e-9) is conditioned, not trusted.
    truth = np.stack([sim3.make(np.eye(3), [0.0, 0.0, 0.0])] * 50)
    graph = PoseGraph()
    graph.add_node(truth[0])
    for n in range(1, 50):
        graph.add_node(truth[n], PoseGraphEdge(n - 1, n, np.eye(4), np.eye(7) * 1e18,
                                               'odometry'))
    assert graph.num_nodes == 50 and graph.stats()['recoveries'] == 0
    assert np.isfinite(graph.covariance(49)).all()


def test_a_disconnected_graph_is_refused_clearly():
    truth = corridor(6)
    edges = [PoseGraphEdge(n - 1, n, sim3.inverse(truth[n - 1]) @ truth[n], np.eye(7) * 1e4,
                           'odometry') for n in (1, 2, 4, 5)]  # 3..5 hang free
    with pytest.raises(ValueError, match='disconnected.*first 3'):
        optimize_pose_graph(truth, edges, covariances=True)
    graph = PoseGraph()
    with pytest.raises(ValueError, match='disconnected'):
        graph.seed(truth, edges, fixed=(0,))
    assert graph.num_nodes == 0
    # Held by a fixed node of its own, the second part is fine.
    result = optimize_pose_graph(truth, edges, fixed=(0, 3), covariances=True)
    np.testing.assert_allclose(result.poses, truth, atol=1e-6)
