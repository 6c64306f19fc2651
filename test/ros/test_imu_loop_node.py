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
"""The gyroscope in the node's pose graph and on ``~/odometry`` (real rclpy, CPU, oracle).

The oracle network answers with the synthetic route's truth; the route's 200 Hz IMU is published
beside the images (``test_imu_node.py``'s harness); loop closure runs with place descriptors that
never match (the graph only grows). With the IMU: every keyframe after the first gets its
rotation factor (the ``loop`` status' ``imu_factors``), ``~/odometry`` carries a finite,
symmetric covariance that grows frame to frame from the anchor, and ``~/map_pose``'s marginal
is tighter in rotation than the same node's without the IMU. Without it: ``~/odometry``'s
covariance is the unknown one, as before, and the status' IMU keys read ``n/a``.

Run: ``pytest test/ros/test_imu_loop_node.py`` (needs gtsam; about a minute; ``rostest``).
"""

from pathlib import Path
import sys
import threading

from geometry_msgs.msg import PoseWithCovarianceStamped
from lingbot_map_ros.engine.imu.odometry_covariance import FLOOR_VARIANCE
from lingbot_map_ros.ros.publishers.loop_outputs import LOOP_KEYS
from lingbot_map_ros.ros.publishers.outputs import UNKNOWN_VARIANCE
from node_harness import no_callback_errors, wait_for, wait_status  # noqa: F401
import numpy as np
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from test_imu_node import feed, imu_publisher, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import RefuseAll  # noqa: E402,I100,I202

pytest.importorskip('gtsam')
pytestmark = pytest.mark.rostest

_TIMEOUT_S = 120.0
NUM = 80
LOOP = {'loop.enable': True, 'loop.exclude_recent': 1000, 'loop.min_score': 0.99,
        'loop.image_store_mb': 0.0}


def _run(graph, imu_topic: str):
    """Run NUM frames with loop closure on; return odometry, map poses and the loop status."""
    node, probe, _, imu = start(graph, imu_topic, **LOOP)
    feed_ = node.core.pipeline.loop_output.feed
    feed_.use_verifier(RefuseAll())
    rng = np.random.default_rng(5)
    feed_.descriptor_of = lambda pred: rng.normal(size=32).astype(np.float32)
    map_poses = []
    lock = threading.Lock()

    def keep(msg):
        with lock:
            map_poses.append(msg)
    reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    probe.create_subscription(PoseWithCovarianceStamped, 'lingbot_map/map_pose', keep, reliable)
    pub_map = next(p for p in node.publishers if p.topic_name.endswith('/map_pose'))
    wait_for(lambda: pub_map.get_subscription_count() > 0, _TIMEOUT_S, 'map_pose subscriber')
    pub = imu_publisher(probe, node) if imu_topic else None
    feed(node, probe, imu, NUM, pub)
    wait_for(lambda: probe.count(probe.odometry) >= NUM and len(map_poses) >= NUM, _TIMEOUT_S,
             'odometry and map poses')
    closer = node.core.pipeline.loop_output.feed.closer
    assert closer.wait_idle(_TIMEOUT_S)
    keyframes = closer.stats()['keyframes']
    _, _, values = wait_status(probe, node, 'loop',
                               lambda lvl, m, v: v.get('keyframes') == str(keyframes),
                               'the loop status', _TIMEOUT_S)
    with lock, probe.lock:
        out = list(probe.odometry), list(map_poses), values
    graph.remove(node)
    return out


def _matrix(covariance) -> np.ndarray:
    return np.asarray(covariance, dtype=np.float64).reshape(6, 6)


@pytest.fixture(scope='module')
def runs(graph):
    """Return the runs with the IMU and without it."""
    return {'imu': _run(graph, 'imu'), 'none': _run(graph, '')}


def test_imu_factors_are_counted_and_the_odometry_covariance_grows(runs):
    odometry, _, values = runs['imu']
    assert list(values) == list(LOOP_KEYS)
    keyframes = int(values['keyframes'])
    assert keyframes >= 10
    # Every keyframe after the first gets a factor once the alignment has estimated the
    # gyroscope's bias; the ones before it are skipped (no_bias), never fused with the bias in.
    factors, skipped = int(values['imu_factors']), int(values['imu_skipped'])
    assert factors + skipped == keyframes - 1
    assert skipped > 0 and factors >= keyframes // 2
    covs = [_matrix(o.pose.covariance) for o in odometry]
    np.testing.assert_allclose(np.diag(covs[0]), [FLOOR_VARIANCE] * 6)  # the anchor
    for cov in covs:
        assert np.isfinite(cov).all()
        np.testing.assert_allclose(cov, cov.T, atol=1e-15)
        assert np.linalg.eigvalsh(cov).min() > 0.0
        assert np.diag(cov).max() < 1.0  # nothing like the unknown covariance
    position = [np.trace(c[:3, :3]) for c in covs]
    rotation = [np.trace(c[3:, 3:]) for c in covs]
    assert all(b > a for a, b in zip(position[1:], position[2:]))
    assert all(b > a for a, b in zip(rotation[1:], rotation[2:]))
    # The twist's covariance stays unknown (nothing estimates it).
    assert _matrix(odometry[-1].twist.covariance)[0, 0] == pytest.approx(UNKNOWN_VARIANCE)


def test_without_the_imu_the_odometry_covariance_is_unknown_and_map_pose_is_looser(runs):
    odometry, map_poses, values = runs['none']
    for o in odometry:
        assert list(o.pose.covariance[::7]) == [UNKNOWN_VARIANCE] * 6
        assert sum(o.pose.covariance) == pytest.approx(6 * UNKNOWN_VARIANCE)
    assert values['imu_factors'] == 'n/a' and values['imu_skipped'] == 'n/a'
    # ~/map_pose: the graph's marginal at the latest keyframe, tighter in rotation with the
    # gyroscope's factors than with the odometry alone (which grows over every keyframe; with
    # the IMU it grows only until the factors start).
    fused = _matrix(runs['imu'][1][-1].pose.covariance)
    plain = _matrix(map_poses[-1].pose.covariance)
    print(f'map_pose rotation variance: {np.trace(plain[3:, 3:]):.3g} rad^2 without the IMU, '
          f'{np.trace(fused[3:, 3:]):.3g} with it')
    assert np.trace(fused[3:, 3:]) < 0.7 * np.trace(plain[3:, 3:])
