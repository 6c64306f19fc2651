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
"""Loop closure through the real node (rclpy graph, CPU, an oracle network and verifier).

The oracle network (test/engine/oracle_model.py) answers with a drifting trajectory (scale and
heading drift) of a route driven twice; it also gives each keyframe a place descriptor that
encodes where it is (test/engine/loop/loop_scenes.py ``Places``). The verifier compares the
two keyframes' views of their places' landmarks from the ground truth. Checked: the map-frame
trajectory (``~/map_path``) is within 30 % of the odometry's error, ``~/odometry`` is exactly
the drifting odometry, ``map -> odom`` moves only by the corrections; two identical rooms with
different furniture never close a loop; a blocked or failing verification delays and loses no
frame.

Run: ``pytest test/ros/test_loop_node.py`` (needs gtsam; 20-40 s on 2 busy cores; ``rostest``).
"""

import itertools
from pathlib import Path
import sys
import threading

from geometry_msgs.msg import PoseWithCovarianceStamped
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.ros.publishers.loop_outputs import LOOP_KEYS
from lingbot_map_ros.ros.publishers.odom_frames import OdomFrames
from nav_msgs.msg import Odometry, Path as PathMsg
from node_harness import (Graph, image_msg, stamp_ns, TINY_CPU,  # noqa: F401
                          wait_for, wait_status)
import numpy as np
import pytest
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from visualization_msgs.msg import MarkerArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import ate, LandmarkVerifier, Places, route  # noqa: E402,I100,I202
from oracle_model import frame_image  # noqa: E402,I100,I202
from place_oracle import drifting, PlaceOracle  # noqa: E402,I100,I202

pytest.importorskip('gtsam')
pytestmark = pytest.mark.rostest

LAP = 30
NUM = 2 * LAP
_TIMEOUT_S = 120.0
_ns = itertools.count()
LOOP = {'loop.enable': True, 'loop.exclude_recent': 10, 'loop.min_score': 0.9,
        'loop.image_store_mb': 0.0}


class Recorder:
    """The probe's subscriptions to the map outputs (all kept, thread-safe)."""

    def __init__(self, probe) -> None:
        """Subscribe to ~/odometry, ~/map_pose, ~/map_path and ~/loop_closures."""
        self.lock = threading.Lock()
        self.got = {'odometry': [], 'map_pose': [], 'map_path': [], 'loop_closures': []}
        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        for msg_type, topic, qos in ((Odometry, 'odometry', reliable),
                                     (PoseWithCovarianceStamped, 'map_pose', reliable),
                                     (PathMsg, 'map_path', latched),
                                     (MarkerArray, 'loop_closures', latched)):
            probe.create_subscription(msg_type, f'lingbot_map/{topic}',
                                      self._store(topic), qos)

    def _store(self, topic):
        def record(msg):
            with self.lock:
                self.got[topic].append(msg)
        return record

    def count(self, topic: str) -> int:
        """Return how many messages ``topic`` has delivered."""
        with self.lock:
            return len(self.got[topic])

    def last(self, topic: str):
        """Return the latest message of ``topic``."""
        with self.lock:
            return self.got[topic][-1]


def _matrix(pose) -> np.ndarray:
    from lingbot_map_ros.engine.image import geometry
    out = np.eye(4)
    q = pose.orientation
    out[:3, :3] = np.asarray(geometry.quaternion_to_rotation(np.array([q.x, q.y, q.z, q.w])))
    out[:3, 3] = [pose.position.x, pose.position.y, pose.position.z]
    return out


@pytest.fixture(scope='module')
def graph():
    g = Graph()
    yield g
    g.close()


def start(graph, places: Places, odometry: np.ndarray, truth: np.ndarray, **overrides):
    """Start a loop-closing node on the place oracle; return (node, probe, recorder, verifier)."""
    values = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
              'input.qos.depth': 200, 'input.queue_size': 200, **LOOP, **overrides}
    node, probe = graph.start_node(f'/loop{next(_ns)}', values)
    session = node.core.pipeline.session.session
    oracle = PlaceOracle(odometry, session.config, places)
    session.replace_stream(oracle)
    loop_output = node.core.pipeline.loop_output
    verifier = LandmarkVerifier(lambda k: truth[k], places,
                                units=lambda: oracle.sessions[0][0])
    loop_output.feed.use_verifier(verifier)
    recorder = Recorder(probe)
    map_pubs = [p for p in node.publishers if p.topic_name.endswith(('/map_pose', '/map_path'))]
    assert len(map_pubs) == 2, [p.topic_name for p in node.publishers]
    wait_for(lambda: all(p.get_subscription_count() > 0 for p in map_pubs), _TIMEOUT_S,
             'map subscribers')
    return node, probe, recorder, verifier, oracle


def feed_route(probe, num: int, node=None, rec=None) -> list[int]:
    """Publish frames 0..num-1 (their colour encodes the index); return their stamps.

    With ``node`` and ``rec``, each frame waits until the last one was published and the loop
    closer is idle: the closer keeps up, so every candidate is verified whatever the machine's
    load (the test of a closer that falls behind is the blocked verifier's).
    """
    stamps = [2_000_000_000 + k * 100_000_000 for k in range(num)]
    for k, stamp in enumerate(stamps):
        if node is not None and k >= TINY_CPU['cache.scale_frames']:  # then one out per frame
            wait_for(lambda: settled(node, k), _TIMEOUT_S, f'keyframe {k - 1} closed')
        probe.image_pub.publish(image_msg(frame_image(k, (48, 64)), stamp))
    return stamps


def settled(node, num: int) -> bool:
    """Return True once the closer holds ``num`` keyframes and nothing is pending.

    The loop output feeds a keyframe after ``~/odometry`` carried it: a test that saw the
    odometry still waits here for the closer.
    """
    closer = node.core.pipeline.loop_output.feed.closer
    return closer is not None and closer.stats()['keyframes'] >= num and closer.wait_idle(0.0)


def expected_odometry(oracle, odometry: np.ndarray) -> np.ndarray:
    """``~/odometry`` as the node publishes it without loop closure: base in odom."""
    scale, rot, trans = oracle.sessions[0]
    frames = OdomFrames([0.0] * 6 + [1.0])
    out = []
    for pose in odometry:
        c2w = np.eye(4)
        c2w[:3, :3] = rot @ pose[:3, :3]
        c2w[:3, 3] = scale * rot @ pose[:3, 3] + trans
        out.append(frames.base_in_odom(c2w))
    return np.stack(out)


def test_loops_correct_the_map_and_leave_odometry_alone(graph):
    truth = route(LAP, lap_offset=0.1)
    odometry = drifting(truth)
    places = Places(truth, LAP)
    node, probe, rec, verifier, oracle = start(graph, places, odometry, truth)
    feed_route(probe, NUM, node, rec)
    wait_for(lambda: rec.count('odometry') >= NUM, _TIMEOUT_S, f'{NUM} odometry messages')
    wait_for(lambda: settled(node, NUM), _TIMEOUT_S, 'every keyframe closed')
    closer = node.core.pipeline.loop_output.feed.closer
    stats = closer.stats()
    frames = node.core.pipeline.outputs.frames
    final = frames.odom_from_world() @ closer.corrected_poses()[-1]  # camera centre in map

    def published_final() -> bool:  # the timer republishes after the last change
        if not (rec.count('map_path') and rec.count('loop_closures')):
            return False
        path, markers = rec.last('map_path').poses, rec.last('loop_closures').markers
        if len(path) != NUM or len(markers[0].points) != 2 * stats['accepted']:
            return False
        last = path[-1].pose.position  # base and camera share their centre (no offset)
        return np.allclose([last.x, last.y, last.z], final[:3, 3], atol=1e-6)
    wait_for(published_final, _TIMEOUT_S, 'the final map path and markers')
    assert stats['keyframes'] == NUM and stats['accepted'] >= 5, stats
    assert stats['rejected_graph'] == 0 and stats['verification_errors'] == 0

    # ~/odometry: exactly the drifting odometry, every frame, in order.
    with rec.lock:
        odom_msgs = list(rec.got['odometry'])
        map_poses = list(rec.got['map_pose'])
    assert len(odom_msgs) == NUM
    odom = np.stack([_matrix(m.pose.pose) for m in odom_msgs])
    np.testing.assert_allclose(odom, expected_odometry(oracle, odometry), atol=1e-6)

    # The corrected keyframe path in map is much closer to the truth than the odometry
    # (compared as camera poses: the truth is the camera's).
    mount = OdomFrames([0.0] * 6 + [1.0]).mount
    path = np.stack([_matrix(p.pose) for p in rec.last('map_path').poses])
    before, after = ate(odom @ mount, truth), ate(path @ mount, truth)
    assert after <= 0.3 * before, (before, after)

    # base_link in map (~/map_pose) moves with the odometry (times the map's scale) plus at
    # most the largest correction: map -> odom steps only when a loop corrects the graph.
    by_stamp = {stamp_ns(m): _matrix(m.pose.pose) for m in odom_msgs}
    map_steps, odom_steps, corrections = [], [], []
    previous = None
    for msg in map_poses:
        base_map, base_odom = _matrix(msg.pose.pose), by_stamp[stamp_ns(msg)]
        map_from_odom = base_map @ sim3.inverse(base_odom)
        if previous is not None:
            map_steps.append(np.linalg.norm(base_map[:3, 3] - previous[0][:3, 3]))
            odom_steps.append(np.linalg.norm(base_odom[:3, 3] - previous[1][:3, 3]))
            corrections.append(np.abs(map_from_odom - previous[2]).max())
        previous = (base_map, base_odom, map_from_odom)
    scale = sim3.scale_of(closer.corrected_poses()).max()
    # 1.25: the frame may run a keyframe or two ahead of the corrected one (lever arm).
    bound = scale * np.array(odom_steps) + 1.25 * stats['max_correction_m'] + 1e-6
    assert stats['max_correction_m'] > 0
    assert (np.array(map_steps) <= bound).all(), (max(map_steps), stats['max_correction_m'])
    # map -> odom holds still before the first loop closure.
    first_loop = min(e.query for e in closer.loop_edges() if e.accepted)
    assert max(corrections[:first_loop - 1]) < 1e-9
    assert max(corrections) > 1e-3
    # Covariances from the marginals: positive on the diagonal, symmetric.
    cov = np.array(map_poses[-1].pose.covariance).reshape(6, 6)
    assert (np.diag(cov) > 0).all()
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)

    # Markers: the accepted loops as green line pairs between keyframes in map.
    markers = rec.last('loop_closures').markers
    assert len(markers[0].points) == 2 * stats['accepted']
    level, message, values = wait_status(
        probe, node, 'loop', lambda lv, m, v: v.get('accepted') == str(stats['accepted']),
        'loop status')
    assert tuple(values) == LOOP_KEYS and values['state'] == 'running'
    assert values['map_frame'] == 'map'


def test_aliased_rooms_never_close_a_false_loop(graph):
    truth = route(LAP, lap_offset=0.1)
    odometry = drifting(truth)
    # Places 20..29 look exactly like 0..9 (same descriptors), with other furniture.
    places = Places(truth, LAP, twins={20 + p: p for p in range(10)})
    node, probe, rec, verifier, _ = start(graph, places, odometry, truth)
    feed_route(probe, NUM, node, rec)
    wait_for(lambda: rec.count('odometry') >= NUM, _TIMEOUT_S, f'{NUM} odometry messages')
    wait_for(lambda: settled(node, NUM), _TIMEOUT_S, 'every keyframe closed')
    closer = node.core.pipeline.loop_output.feed.closer
    edges = closer.loop_edges()
    aliased = [e for e in edges if places.place(e.query) != places.place(e.candidate)]
    assert aliased, 'no twin was ever verified: the test would prove nothing'
    assert not any(e.accepted for e in aliased)
    assert closer.stats()['rejected_verification'] >= len(aliased)


@pytest.mark.parametrize('failure', ['blocked', 'raising'])
def test_slow_or_failing_verification_delays_and_loses_no_frame(graph, failure):
    truth = route(LAP, lap_offset=0.1)
    odometry = drifting(truth)
    places = Places(truth, LAP)
    node, probe, rec, verifier, _ = start(graph, places, odometry, truth)
    if failure == 'blocked':
        verifier.gate = threading.Event()
    else:
        verifier.fail = True
    try:
        stamps = feed_route(probe, NUM)
        # Every frame is published while the verification is stuck (or failing).
        wait_for(lambda: rec.count('odometry') >= NUM, _TIMEOUT_S, f'{NUM} odometry messages')
        with rec.lock:
            assert [stamp_ns(m) for m in rec.got['odometry']] == stamps
        closer = node.core.pipeline.loop_output.feed.closer
        if failure == 'blocked':
            # The worker is stuck in the verification; keyframes queue behind it (one worker
            # for retrieval, verification and graph) and go into the graph once it returns.
            wait_for(lambda: verifier.calls, _TIMEOUT_S, 'a verification started')
            assert closer.stats()['keyframes'] < NUM or verifier.calls[0][0] == NUM - 1
    finally:
        if verifier.gate is not None:
            verifier.gate.set()
    wait_for(lambda: settled(node, NUM), _TIMEOUT_S, 'every keyframe closed')
    stats = closer.stats()
    assert stats['keyframes'] == NUM
    assert verifier.max_concurrent == 1
    if failure == 'raising':
        assert stats['verification_errors'] == len(verifier.calls) > 0
        wait_status(probe, node, 'loop', lambda lv, m, v: lv == b'\x01', 'loop WARN')
    else:
        assert stats['replaced'] > 0  # newer candidates waited in the slot of one


def test_without_place_descriptors_loop_closure_is_unavailable_and_frames_flow(graph):
    truth = route(LAP, lap_offset=0.1)
    odometry = drifting(truth)
    places = Places(truth, LAP)
    node, probe, rec, _, _ = start(graph, places, odometry, truth)
    node.core.pipeline.session.session.place_descriptors = False  # predictions without
    feed_route(probe, 20)
    wait_for(lambda: rec.count('odometry') >= 20, _TIMEOUT_S, '20 odometry messages')
    level, message, values = wait_status(
        probe, node, 'loop', lambda lv, m, v: v.get('state') == 'unavailable', 'unavailable')
    assert level == b'\x01' and 'place descriptor' in values['reason']
    assert tuple(values) == LOOP_KEYS and values['accepted'] == 'n/a'
    # No graph: the covariance is unknown (large), never all zero.
    cov = np.array(rec.last('map_pose').pose.covariance).reshape(6, 6)
    np.testing.assert_allclose(np.diag(cov), 9999.0)
    # map -> odom stays the identity: base_link in map is base_link in odom.
    wait_for(lambda: rec.count('map_pose') >= 20, _TIMEOUT_S, '20 map poses')
    with rec.lock:
        pairs = list(zip(rec.got['map_pose'], rec.got['odometry']))
    for in_map, in_odom in pairs:
        np.testing.assert_allclose(_matrix(in_map.pose.pose), _matrix(in_odom.pose.pose),
                                   atol=1e-9)
