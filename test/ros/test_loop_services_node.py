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
"""Every map service through success -> refusal -> success on the real node (rclpy, CPU).

A refused call after a successful one used to log at ERROR from the line that had logged at
INFO; rclpy then raised ``Logger severity cannot be changed between calls.`` out of the
callback and the node died. Each sequence here is one of the everyday ways in: a save before
the first keyframe then a valid save; ``~/reset`` then ``~/save_map`` from another client; a
refused load then a valid one; ``~/localize_in_map`` without a map, with a map, with a hint that
is not finite. The harness fails a test whose callbacks raised into the executor
(``no_callback_errors``), and every answer is checked for its reason.

Run: ``pytest test/ros/test_loop_services_node.py`` (needs gtsam; ``rostest``).
"""

import itertools
import math
from pathlib import Path
import sys
import threading

from lingbot_map_ros.ros.publishers.callback_guard import guard_service, guard_timer, MAX_ECHO
from nav_msgs.srv import SetMap
from node_harness import (Graph, image_msg, no_callback_errors,  # noqa: F401
                          wait_for, wait_status)
import pytest
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile
from rosgraph_msgs.msg import Clock
from std_msgs.msg import String
from std_srvs.srv import Trigger
from test_loop_node import drifting, feed_route, settled, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import Places, route  # noqa: E402,I100,I202
from oracle_model import frame_image  # noqa: E402,I100,I202

pytest.importorskip('gtsam')
pytestmark = pytest.mark.rostest

LAP = 30
FRAMES = 8
_TIMEOUT_S = 120.0
_ns = itertools.count()


@pytest.fixture(scope='module')
def graph():
    g = Graph()
    yield g
    g.close()


def _call(probe, name: str, request=None, srv=Trigger, client=None):
    client = client or probe.create_client(srv, f'lingbot_map/{name}')
    return probe.call(client, request or srv.Request(), _TIMEOUT_S)


def _publish(probe, frames) -> None:
    for k in frames:
        probe.image_pub.publish(image_msg(frame_image(k, (48, 64)),
                                          2_000_000_000 + k * 100_000_000))


def _mapping_node(graph, tmp_path):
    truth = route(LAP, lap_offset=0.1)
    node, probe, rec, _, _ = start(graph, Places(truth, LAP), drifting(truth), truth,
                                   **{'map.save_path': str(tmp_path / 'map')})
    return node, probe, rec


def test_save_map_refused_then_saved_then_refused_after_reset_then_saved(graph,
                                                                         tmp_path) -> None:
    node, probe, rec = _mapping_node(graph, tmp_path)
    first = _call(probe, 'save_map')  # before the first keyframe
    assert not first.success and 'no keyframes yet' in first.message, first.message
    feed_route(probe, FRAMES)
    wait_for(lambda: rec.count('odometry') >= FRAMES, _TIMEOUT_S, f'{FRAMES} frames')
    wait_for(lambda: settled(node, 1), _TIMEOUT_S, 'a keyframe in the closer')
    saved = _call(probe, 'save_map')
    assert saved.success and saved.message.startswith(str(tmp_path / 'map')), saved.message
    # ~/reset, then ~/save_map from another client: refused (the run is forgotten).
    assert _call(probe, 'reset').success
    other = probe.create_client(Trigger, 'lingbot_map/save_map')
    after_reset = _call(probe, 'save_map', client=other)
    assert not after_reset.success and 'no keyframes yet' in after_reset.message, \
        after_reset.message
    # The node lives on: new frames, a new keyframe, a valid save.
    _publish(probe, range(FRAMES, 2 * FRAMES))
    wait_for(lambda: rec.count('odometry') >= 2 * FRAMES, _TIMEOUT_S, 'frames after the reset')
    wait_for(lambda: settled(node, 1), _TIMEOUT_S, 'a keyframe after the reset')
    again = _call(probe, 'save_map', client=other)
    assert again.success, again.message
    graph.remove(probe)
    graph.remove(node)


def test_load_and_localize_refused_then_accepted(graph, tmp_path) -> None:
    node, probe, rec = _mapping_node(graph, tmp_path)
    feed_route(probe, FRAMES)
    wait_for(lambda: rec.count('odometry') >= FRAMES, _TIMEOUT_S, f'{FRAMES} frames')
    wait_for(lambda: settled(node, 1), _TIMEOUT_S, 'a keyframe in the closer')
    assert _call(probe, 'save_map').success
    valid = str(tmp_path / 'map')

    # ~/localize_in_map before any map: refused, the reason in the loop status.
    assert not _call(probe, 'localize_in_map', srv=SetMap).success
    _, _, values = wait_status(probe, node, 'loop',
                               lambda lv, m, v: 'no map loaded' in v.get('map_error', ''),
                               'the localize refusal in the status')

    # ~/load_map: a valid map, a refused one, the valid one again.
    assert probe.set_params(map__load_path=valid)[0].successful
    loaded = _call(probe, 'load_map')
    assert loaded.success and loaded.message.startswith(f'loaded {valid}'), loaded.message
    assert probe.set_params(map__load_path=str(tmp_path / 'nowhere'))[0].successful
    refused = _call(probe, 'load_map')
    assert not refused.success and 'refused' in refused.message, refused.message
    assert probe.set_params(map__load_path=valid)[0].successful
    again = _call(probe, 'load_map')
    assert again.success, again.message

    # ~/localize_in_map: a hint, a hint that is not finite (refused), no hint.
    request = SetMap.Request()
    request.initial_pose.header.frame_id = 'map'
    assert _call(probe, 'localize_in_map', request, SetMap).success
    request.initial_pose.pose.pose.position.x = math.inf
    assert not _call(probe, 'localize_in_map', request, SetMap).success
    wait_status(probe, node, 'loop', lambda lv, m, v: 'not finite' in v.get('map_error', ''),
                'the hint refusal in the status')
    assert _call(probe, 'localize_in_map', SetMap.Request(), SetMap).success
    wait_status(probe, node, 'loop', lambda lv, m, v: v.get('map_error') == '',
                'the refusal cleared by an accepted request')
    graph.remove(probe)
    graph.remove(node)


def test_guard_answers_and_logs_what_a_callback_raises(graph) -> None:
    node = graph.add(Node(f'guard_{next(_ns)}', context=graph.context))  # for its logger

    def broken(request, response):
        raise RuntimeError('x' * (10 * MAX_ECHO))
    answer = guard_service(node.get_logger(), '~/save_map', broken)(Trigger.Request(),
                                                                    Trigger.Response())
    assert answer.success is False
    assert answer.message.startswith('~/save_map failed: RuntimeError: xxx')
    assert len(answer.message) < 2 * MAX_ECHO  # bounded, however long the error
    refused = guard_service(node.get_logger(), '~/localize_in_map', broken)(
        SetMap.Request(), SetMap.Response())
    assert refused.success is False  # SetMap answers no message: only success
    ticks = []

    def failing_tick():
        ticks.append(1)
        raise ValueError('boom')
    tick = guard_timer(node.get_logger(), 'map path', failing_tick)
    tick()
    tick()
    assert ticks == [1, 1]  # raised twice, both times logged, never out of the timer
    graph.remove(node)


def test_map_path_follows_the_graph_after_sim_clock_stops(graph, tmp_path) -> None:
    """``~/map_path`` runs on steady time: a replay whose /clock stopped still gets it."""
    truth = route(LAP, lap_offset=0.1)
    node, probe, rec, _, _ = start(graph, Places(truth, LAP), drifting(truth), truth,
                                   use_sim_time=True)
    clock = probe.create_publisher(Clock, '/clock',
                                   QoSProfile(depth=1,
                                              durability=DurabilityPolicy.TRANSIENT_LOCAL))
    stopped = Clock()
    stopped.clock.sec = 2  # one tick, then /clock stops for good
    clock.publish(stopped)
    wait_for(lambda: node.get_clock().now().nanoseconds == 2_000_000_000, _TIMEOUT_S,
             'the sim clock at 2 s')
    feed_route(probe, FRAMES)
    wait_for(lambda: rec.count('odometry') >= FRAMES, _TIMEOUT_S, f'{FRAMES} frames')
    closer = node.core.pipeline.loop_output.feed.closer

    def path_complete() -> bool:  # a keyframe is fed after its odometry: read it each time
        keyframes = closer.stats()['keyframes']
        return (keyframes >= 2 and closer.wait_idle(0.0) and rec.count('map_path') > 0 and
                len(rec.last('map_path').poses) == keyframes)
    wait_for(path_complete, _TIMEOUT_S, '~/map_path with every keyframe while /clock stands still')
    assert node.get_clock().now().nanoseconds == 2_000_000_000  # the clock never moved
    graph.remove(probe)
    graph.remove(node)


def test_a_long_save_holds_no_executor_thread_and_reports_progress(graph, tmp_path) -> None:
    truth = route(LAP, lap_offset=0.1)
    node, probe, rec, verifier, _ = start(graph, Places(truth, LAP), drifting(truth), truth,
                                          **{'map.save_path': str(tmp_path / 'map')})
    jobs: list[str] = []
    probe.create_subscription(String, 'lingbot_map/map_job', lambda m: jobs.append(m.data),
                              QoSProfile(depth=10,
                                         durability=DurabilityPolicy.TRANSIENT_LOCAL))
    verifier.gate = threading.Event()
    try:
        feed_route(probe, 2 * LAP)
        wait_for(lambda: verifier.calls, _TIMEOUT_S, 'a verification (held by the gate)')
        # The save waits for the closer's worker, which waits on the gate.
        client = probe.create_client(Trigger, 'lingbot_map/save_map')
        wait_for(lambda: client.wait_for_service(timeout_sec=0.1), _TIMEOUT_S, 'save_map')
        pending = client.call_async(Trigger.Request())
        wait_for(lambda: '~/save_map: running' in jobs, _TIMEOUT_S, 'the job running')
        # Meanwhile the map services' group and the executor answer other calls.
        refused = _call(probe, 'localize_in_map', srv=SetMap)
        assert refused.success is False and not pending.done()
        # A reset closes the run's graph: the waiting save is answered with the reason.
        assert _call(probe, 'reset').success is True
        wait_for(pending.done, _TIMEOUT_S, 'the save answer')
        answer = pending.result()
        assert not answer.success and 'closed before the snapshot' in answer.message
    finally:
        verifier.gate.set()
    wait_for(lambda: jobs and jobs[-1] != '~/save_map: running', _TIMEOUT_S, 'the job end')
    assert jobs[-1] == f'~/save_map: refused: {answer.message}', jobs
    graph.remove(probe)
    graph.remove(node)
